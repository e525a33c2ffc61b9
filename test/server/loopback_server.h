// A real planner service on 127.0.0.1:0 for integration tests: the handler
// implementation the binary serves and the gRPC server around it, started
// and shut down in one place.
#ifndef ARACHNE_TEST_SERVER_LOOPBACK_SERVER_H_
#define ARACHNE_TEST_SERVER_LOOPBACK_SERVER_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/server/planner_server.h"

namespace arachne::testing {

class LoopbackServer {
 public:
  // CHECK-fails when the service cannot start: a broken test setup.
  explicit LoopbackServer(PlannerServiceConfig service) {
    auto impl = PlannerHandlerImpl::Create({});
    CHECK(impl.ok()) << impl.status();
    handler_ = *std::move(impl);
    PlannerServerConfig config;
    config.listen = "127.0.0.1:0";
    config.service = std::move(service);
    auto server = PlannerServer::Start(handler_.get(), config);
    CHECK(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  ~LoopbackServer() { server_->Shutdown(absl::Seconds(1)); }

  PlannerHandlerImpl& handler() { return *handler_; }
  int port() const { return server_->port(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port()); }

 private:
  std::unique_ptr<PlannerHandlerImpl> handler_;
  std::unique_ptr<PlannerServer> server_;  // shut down before the handler
};

// A LoopbackServer shared by the tests of one suite and a channel to it:
// Start in SetUpTestSuite, Stop in TearDownTestSuite.
class SuiteServer {
 public:
  void Start(int workers, int max_in_flight) {
    PlannerServiceConfig service;
    service.workers = workers;
    service.max_in_flight = max_in_flight;
    server_ = std::make_unique<LoopbackServer>(std::move(service));
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
  }
  void Stop() {
    server_.reset();
    channel_.reset();
  }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  std::string address() const { return server_->address(); }

 private:
  std::unique_ptr<LoopbackServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_SERVER_LOOPBACK_SERVER_H_
