// c10d's Gloo backend headers need it (Debian libtorch); Torch's own compile
// flags may define it already.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include "worker_agent/job_store.h"

#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"

namespace arachne::agent {

struct JobStoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

absl::StatusOr<std::unique_ptr<JobStoreServer>> JobStoreServer::Start(
    const std::string& host, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("store port: must be in [0, 65535], got ", port));
  }
  auto server = std::unique_ptr<JobStoreServer>(new JobStoreServer());
  server->impl_ = std::make_unique<Impl>();
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.multiTenant = true;
  opts.timeout = std::chrono::milliseconds(30000);
  try {
    server->impl_->store = c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot start the job store on ", host, ":", port, ": ", e.what()));
  }
  server->host_ = host;
  server->port_ = server->impl_->store->getPort();
  return server;
}

JobStoreServer::~JobStoreServer() = default;

std::string JobStoreServer::address() const {
  return absl::StrCat(host_, ":", port_);
}

absl::Status ParseStoreAddress(absl::string_view address,
                               absl::string_view field, std::string* host,
                               int* port) {
  const size_t colon = address.rfind(':');
  int p = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &p) || p <= 0 ||
      p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be host:port with a port in [1, 65535], got \"",
        address, "\""));
  }
  *host = std::string(address.substr(0, colon));
  *port = p;
  return absl::OkStatus();
}

std::string GenerationPrefix(int64_t generation) {
  return absl::StrCat("arachne/g", generation);
}

namespace {

// migration::RendezvousStore over a c10d store: Get waits for the key with the
// caller's timeout (c10d's wait), so a missing peer is DeadlineExceeded.
class C10dStoreAdapter : public migration::RendezvousStore {
 public:
  explicit C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store)
      : store_(std::move(store)) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    try {
      store_->set(std::string(key),
                  std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("job store: set '", key, "': ", e.what()));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override {
    try {
      store_->wait({std::string(key)},
                   std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
      std::vector<uint8_t> v = store_->get(std::string(key));
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      const std::string what = e.what();
      if (what.find("imeout") != std::string::npos) {
        return absl::DeadlineExceededError(absl::StrCat(
            "job store: key '", key, "' did not appear within ",
            absl::FormatDuration(timeout)));
      }
      return absl::UnavailableError(
          absl::StrCat("job store: get '", key, "': ", what));
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<migration::RendezvousStore>> ConnectJobStore(
    const std::string& address, const std::string& prefix,
    absl::Duration timeout) {
  std::string host;
  int port = 0;
  if (absl::Status s = ParseStoreAddress(address, "store_address", &host, &port);
      !s.ok()) {
    return s;
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(host, opts);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);
    return std::unique_ptr<migration::RendezvousStore>(
        new C10dStoreAdapter(std::move(prefixed)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the job store at ", address, ": ", e.what()));
  }
}

}  // namespace arachne::agent
