// AgentClient without an agent: what Connect refuses, and that a call to an
// address nobody serves comes back UNAVAILABLE naming the agent. Calls
// against a running agent are the service tests'.
#include "worker_agent/agent_client.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(AgentClientTest, EmptyAddressIsRefused) {
  absl::StatusOr<std::unique_ptr<AgentClient>> c = AgentClient::Connect({});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "address: empty; expected HOST:PORT");
}

TEST(AgentClientTest, TlsFilesComeInPairs) {
  AgentClientConfig config;
  config.address = "127.0.0.1:1";
  config.tls.cert_file = "/c.pem";
  absl::StatusOr<std::unique_ptr<AgentClient>> c = AgentClient::Connect(config);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("tls_cert_file, tls_key_file"));
  config.tls.key_file = "/c.key";
  c = AgentClient::Connect(config);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("tls_ca_file: required"));
  config.tls.ca_file = "/absent-ca.pem";
  c = AgentClient::Connect(config);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(), "tls_ca_file: cannot read \"/absent-ca.pem\"");
}

TEST(AgentClientTest, UnreachableAgentIsUnavailableNamingIt) {
  // Port 1 on loopback: nothing listens there (and nothing may bind it
  // without privileges), so the connection is refused at once.
  AgentClientConfig config;
  config.address = "127.0.0.1:1";
  config.call_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<AgentClient>> c = AgentClient::Connect(config);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<NodeStatus> s = (*c)->Status();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.status().message()),
              StartsWith("agent 127.0.0.1:1: "));
  EXPECT_EQ((*c)->Commit(1).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace arachne::agent
