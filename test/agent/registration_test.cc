// ControllerRegistration (worker_agent/registration.h) against an
// in-process arachne.v1.Controller service on 127.0.0.1 that records the
// calls and answers as told: registration, heartbeats every lease/3,
// re-registration after NOT_FOUND, retries while the controller is down,
// the end of the loop for a released node.
#include "worker_agent/registration.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "arachne/v1/controller.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace arachne::agent {
namespace {

using ::testing::HasSubstr;

class RecordingController final : public v1::Controller::Service {
 public:
  grpc::Status Register(grpc::ServerContext* context,
                        const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    absl::MutexLock lock(&mu_);
    registers_.push_back(*request);
    tokens_.push_back(Token(*context));
    response->set_lease_s(lease_s_);
    response->set_generation(3);
    response->set_controller_id("c0ffee");
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* r,
                         v1::HeartbeatResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    if (heartbeat_code_ != grpc::StatusCode::OK) {
      const grpc::StatusCode code = heartbeat_code_;
      heartbeat_code_ = grpc::StatusCode::OK;  // once
      return grpc::Status(code, "told so");
    }
    if (released_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "released");
    }
    EXPECT_EQ(r->node(), "n0");
    heartbeat_incarnations_.insert(r->incarnation());
    response->set_lease_s(lease_s_);
    return grpc::Status::OK;
  }

  std::set<std::string> heartbeat_incarnations() {
    absl::MutexLock lock(&mu_);
    return heartbeat_incarnations_;
  }
  int registers() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(registers_.size());
  }
  int heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  v1::RegisterRequest first_register() {
    absl::MutexLock lock(&mu_);
    return registers_.at(0);
  }
  std::string first_token() {
    absl::MutexLock lock(&mu_);
    return tokens_.at(0);
  }
  void FailNextHeartbeat(grpc::StatusCode code) {
    absl::MutexLock lock(&mu_);
    heartbeat_code_ = code;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  static std::string Token(const grpc::ServerContext& c) {
    auto it = c.client_metadata().find("authorization");
    return it == c.client_metadata().end()
               ? ""
               : std::string(it->second.data(), it->second.size());
  }
  absl::Mutex mu_;
  std::vector<v1::RegisterRequest> registers_;
  std::set<std::string> heartbeat_incarnations_;
  std::vector<std::string> tokens_;
  int heartbeats_ = 0;
  double lease_s_ = 0.6;
  grpc::StatusCode heartbeat_code_ = grpc::StatusCode::OK;
  bool released_ = false;
};

struct Server {
  explicit Server(RecordingController* service, int port = 0) {
    grpc::ServerBuilder b;
    b.AddListeningPort(absl::StrCat("127.0.0.1:", port),
                       grpc::InsecureServerCredentials(), &this->port);
    b.RegisterService(service);
    server = b.BuildAndStart();
  }
  ~Server() { server->Shutdown(); }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

RegistrationConfig Config(int port) {
  RegistrationConfig c;
  c.controller = absl::StrCat("127.0.0.1:", port);
  c.node = "n0";
  c.gpu_type = "A6000";
  c.gpus = 2;
  c.memory_gib = 48;
  c.address = "127.0.0.1:7070";
  c.initial_backoff = absl::Milliseconds(20);
  c.max_backoff = absl::Milliseconds(200);
  // No call here waits on a stalled controller: a generous deadline, so a
  // loaded machine (CI runs -j) cannot turn a slow answer into a failure
  // the tests would count (NotFoundRegistersAgain counts exactly one).
  c.call_timeout = absl::Seconds(60);
  return c;
}

// Waits until `pred` holds (at most 10 s).
template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

TEST(Registration, RegistersThenHeartbeatsEveryThirdOfTheLease) {
  RecordingController controller;
  Server server(&controller);
  RegistrationConfig config = Config(server.port);
  config.token = "tok";
  absl::Mutex bound_mu;
  std::string bound;
  config.on_registered = [&](const std::string& id) {
    absl::MutexLock lock(&bound_mu);
    bound = id;
  };
  auto r = ControllerRegistration::Start(config);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(Eventually([&] { return controller.registers() == 1; }));
  // The agent binds to the controller that answered.
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&bound_mu);
    return bound == "c0ffee";
  }));
  const v1::RegisterRequest reg = controller.first_register();
  EXPECT_EQ(reg.node(), "n0");
  EXPECT_EQ(reg.gpu_type(), "A6000");
  EXPECT_EQ(reg.gpus(), 2);
  EXPECT_DOUBLE_EQ(reg.memory_gib(), 48);
  EXPECT_EQ(reg.address(), "127.0.0.1:7070");
  // A random incarnation, 128 bits in hex, the same in every heartbeat.
  EXPECT_THAT(reg.incarnation(), ::testing::MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(controller.first_token(), "Bearer tok");
  // Lease 0.6 s: a heartbeat every 0.2 s, so ~5 in a second (scheduling
  // noise allowed for), and no second Register.
  const int before = controller.heartbeats();
  absl::SleepFor(absl::Seconds(1));
  const int beats = controller.heartbeats() - before;
  EXPECT_GE(beats, 3);
  EXPECT_LE(beats, 6);
  EXPECT_EQ(controller.registers(), 1);
  const RegistrationState st = (*r)->state();
  EXPECT_TRUE(st.registered);
  EXPECT_DOUBLE_EQ(st.lease_s, 0.6);
  EXPECT_EQ(st.generation, 3);
  EXPECT_EQ(st.controller_id, "c0ffee");
  EXPECT_EQ(st.incarnation, reg.incarnation());
  EXPECT_EQ(controller.heartbeat_incarnations(),
            std::set<std::string>{reg.incarnation()});
}

// Each start of the loop (each agent process) is a new incarnation; one
// given in the settings is used as it is, and a malformed one is refused.
TEST(Registration, EachStartIsANewIncarnation) {
  RecordingController controller;
  Server server(&controller);
  auto first = ControllerRegistration::Start(Config(server.port));
  auto second = ControllerRegistration::Start(Config(server.port));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE((*first)->state().incarnation, (*second)->state().incarnation);
  RegistrationConfig c = Config(server.port);
  c.incarnation = "agent-7_b";
  auto given = ControllerRegistration::Start(c);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ((*given)->state().incarnation, "agent-7_b");
  c.incarnation = "a b";
  EXPECT_EQ(ControllerRegistration::Start(c).status().message(),
            "incarnation: must be 1 to 64 bytes of ASCII letters, digits, '-' "
            "and '_', got \"a b\" (byte 0x20 at offset 1)");
}

TEST(Registration, NotFoundRegistersAgain) {
  RecordingController controller;
  Server server(&controller);
  auto r = ControllerRegistration::Start(Config(server.port));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(Eventually([&] { return controller.registers() == 1; }));
  controller.FailNextHeartbeat(grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Eventually([&] { return controller.registers() == 2; }));
  EXPECT_EQ((*r)->state().failures, 1);
}

TEST(Registration, AnUnreachableControllerIsRetriedUntilItComes) {
  RecordingController controller;
  int port;
  {
    Server probe(&controller);
    port = probe.port;
  }  // a port now unused
  auto r = ControllerRegistration::Start(Config(port));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(Eventually([&] { return (*r)->state().failures >= 3; }));
  EXPECT_FALSE((*r)->state().registered);
  EXPECT_THAT((*r)->state().last_error, HasSubstr("controller 127.0.0.1:"));
  Server server(&controller, port);
  ASSERT_TRUE(Eventually([&] { return controller.registers() == 1; }));
  ASSERT_TRUE(Eventually([&] { return controller.heartbeats() >= 1; }));
}

TEST(Registration, AReleasedNodeStopsHeartbeating) {
  RecordingController controller;
  Server server(&controller);
  auto r = ControllerRegistration::Start(Config(server.port));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(Eventually([&] { return controller.heartbeats() >= 1; }));
  controller.Release();
  ASSERT_TRUE(Eventually([&] { return !(*r)->state().registered; }));
  const int beats = controller.heartbeats();
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_EQ(controller.heartbeats(), beats);
  EXPECT_EQ(controller.registers(), 1);
}

TEST(Registration, BadConfigIsNamed) {
  RegistrationConfig c = Config(1);
  c.controller = "nope";
  EXPECT_EQ(ControllerRegistration::Start(c).status().message(),
            "controller: must be host:port, got \"nope\"");
  c = Config(1);
  c.gpus = 0;
  EXPECT_EQ(ControllerRegistration::Start(c).status().message(),
            "gpus: must be >= 1, got 0");
  c = Config(1);
  c.tls.ca_file = "/absent/ca.pem";
  EXPECT_EQ(ControllerRegistration::Start(c).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace arachne::agent
