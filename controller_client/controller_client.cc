#include "controller_client/controller_client.h"

#include <chrono>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "arachne/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "rpc/credentials.h"
#include "rpc/grpc_status.h"

namespace arachne {
namespace {

// HOST:PORT with a non-empty host ("[::1]" for IPv6) and a port in 1..65535.
absl::Status CheckAddress(const std::string& address) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address: must be HOST:PORT (e.g. 127.0.0.1:7100), got \"", address,
        "\"", why.empty() ? "" : absl::StrCat(" (", why, ")")));
  };
  const size_t colon = address.rfind(':');
  if (address.empty() || colon == std::string::npos) return bad("no port");
  if (colon == 0) return bad("no host");
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return bad("the port must be a number in 1..65535");
  }
  return absl::OkStatus();
}

class GrpcControllerClient final : public ControllerClient {
 public:
  GrpcControllerClient(ControllerClientConfig config,
                       std::shared_ptr<grpc::Channel> channel)
      : config_(std::move(config)),
        stub_(v1::Controller::NewStub(std::move(channel))) {}

  absl::StatusOr<v1::GetStatusResponse> GetStatus() override {
    grpc::ClientContext ctx;
    Prepare(&ctx, /*unary=*/true);
    v1::GetStatusResponse response;
    if (absl::Status s = FromGrpc(
            stub_->GetStatus(&ctx, v1::GetStatusRequest(), &response));
        !s.ok()) {
      return s;
    }
    return response;
  }

  absl::Status DrainNode(const std::string& node, double deadline_s) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, /*unary=*/true);
    v1::DrainNodeRequest request;
    request.set_node(node);
    request.set_deadline_s(deadline_s);
    v1::DrainNodeResponse response;
    return FromGrpc(stub_->DrainNode(&ctx, request, &response));
  }

  absl::Status RequestReplan(const std::string& reason) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, /*unary=*/true);
    v1::RequestReplanRequest request;
    request.set_reason(reason);
    v1::RequestReplanResponse response;
    return FromGrpc(stub_->RequestReplan(&ctx, request, &response));
  }

  absl::Status WatchEvents(
      int64_t after,
      const std::function<bool(const v1::Event&)>& on_event) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, /*unary=*/false);
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return absl::OkStatus();
      watching_ = &ctx;
    }
    v1::WatchEventsRequest request;
    request.set_after(after);
    std::unique_ptr<grpc::ClientReader<v1::Event>> reader =
        stub_->WatchEvents(&ctx, request);
    v1::Event event;
    bool stopped = false;
    while (reader->Read(&event)) {
      if (!on_event(event)) {
        stopped = true;
        ctx.TryCancel();
        break;
      }
    }
    const grpc::Status s = reader->Finish();
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      watching_ = nullptr;
      cancelled = cancelled_;
    }
    // Our own cancellation is how the caller stops watching, not an error.
    if (stopped || (cancelled && s.error_code() == grpc::CANCELLED)) {
      return absl::OkStatus();
    }
    return FromGrpc(s);
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (watching_ != nullptr) watching_->TryCancel();
  }

 private:
  void Prepare(grpc::ClientContext* ctx, bool unary) const {
    if (unary) {
      ctx->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(config_.timeout));
    }
    if (!config_.token.empty()) {
      ctx->AddMetadata("authorization", absl::StrCat("Bearer ", config_.token));
    }
  }
  absl::Status FromGrpc(const grpc::Status& s) const {
    return FromGrpcStatus(s, absl::StrCat("controller ", config_.address));
  }

  const ControllerClientConfig config_;
  const std::unique_ptr<v1::Controller::Stub> stub_;
  absl::Mutex mu_;
  grpc::ClientContext* watching_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ControllerClient>> MakeGrpcControllerClient(
    const ControllerClientConfig& config) {
  if (absl::Status s = CheckAddress(config.address); !s.ok()) return s;
  ControllerClientConfig resolved = config;
  if (!config.token_file.empty()) {
    if (!config.token.empty()) {
      return absl::InvalidArgumentError(
          "token, token_file: give one or neither, got both");
    }
    absl::StatusOr<std::string> token =
        ReadBearerTokenFile(config.token_file, "token_file");
    if (!token.ok()) return token.status();
    resolved.token = *token;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials({.ca_file = config.tls_ca_file,
                              .cert_file = config.tls_cert_file,
                              .key_file = config.tls_key_file});
  if (!credentials.ok()) return credentials.status();
  return std::make_unique<GrpcControllerClient>(
      std::move(resolved), grpc::CreateChannel(config.address, *credentials));
}

}  // namespace arachne
