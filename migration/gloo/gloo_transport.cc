#include "migration/gloo/gloo_transport.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace arachne::migration {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo's rendezvous reads and writes through this; Gloo reports failure by
// exception, so errors of our store become gloo::IoException.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(migration::RendezvousStore* store, std::string prefix,
               absl::Duration timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->Set(Key(key), std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_->Get(Key(key), timeout_);
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& k : keys) get(k);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds&) override {
    wait(keys);
  }

 private:
  std::string Key(const std::string& key) const {
    return absl::StrCat(prefix_, "/gloo/", key);
  }
  migration::RendezvousStore* store_;
  std::string prefix_;
  absl::Duration timeout_;
};

absl::Status FromGloo(const std::exception& e, absl::string_view what) {
  const std::string m = e.what();
  if (absl::StrContains(m, "imed out") || absl::StrContains(m, "imeout")) {
    return absl::DeadlineExceededError(absl::StrCat("gloo: ", what, ": ", m));
  }
  return absl::UnavailableError(absl::StrCat("gloo: ", what, ": ", m));
}

class GlooTransport : public Transport {
 public:
  GlooTransport(std::shared_ptr<gloo::transport::Device> device,
                std::shared_ptr<gloo::rendezvous::Context> context)
      : device_(std::move(device)), context_(std::move(context)) {}

  std::string name() const override { return "gloo"; }
  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }
  MemoryKind memory() const override { return MemoryKind::kHost; }

  absl::Status RunRound(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs,
                        absl::Duration timeout) override {
    for (const SendOp& op : sends) {
      if (op.peer < 0 || op.peer >= world_size() || op.peer == rank()) {
        return absl::InvalidArgumentError(
            absl::StrCat("gloo: send to peer ", op.peer, " of ", world_size()));
      }
    }
    for (const RecvOp& op : recvs) {
      if (op.peer < 0 || op.peer >= world_size() || op.peer == rank()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gloo: receive from peer ", op.peer, " of ", world_size()));
      }
    }
    if (broken_) {
      return absl::FailedPreconditionError(
          "gloo: the transport failed in an earlier round");
    }
    // Slot: the round's tag, the direction (from the lower or the higher
    // rank of the pair) and the op's index among those to the same peer,
    // so every op meets exactly its counterpart.
    auto slot = [&](uint64_t from, uint64_t to, uint64_t index) {
      return (tag << 24) | (static_cast<uint64_t>(from < to) << 23) | index;
    };
    // Declared outside the try so that, on failure, the connections are
    // closed before the buffers go away: Gloo must not write into freed
    // memory after a timeout.
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> out, in;
    absl::Status status;
    try {
      std::vector<int> sent_to(world_size(), 0), got_from(world_size(), 0);
      for (const SendOp& op : sends) {
        out.push_back(context_->createUnboundBuffer(const_cast<void*>(op.data),
                                                    op.bytes));
        out.back()->send(op.peer, slot(rank(), op.peer, sent_to[op.peer]++), 0,
                         op.bytes);
      }
      for (const RecvOp& op : recvs) {
        in.push_back(context_->createUnboundBuffer(op.data, op.bytes));
        in.back()->recv(op.peer, slot(op.peer, rank(), got_from[op.peer]++), 0,
                        op.bytes);
      }
      const auto deadline = std::chrono::steady_clock::now() + ToChrono(timeout);
      for (auto& b : in) {
        if (status.ok() && !b->waitRecv(deadline)) {
          status = absl::DeadlineExceededError(
              absl::StrCat("gloo: receive of round ", tag, " timed out"));
        }
      }
      for (auto& b : out) {
        if (status.ok() && !b->waitSend(deadline)) {
          status = absl::DeadlineExceededError(
              absl::StrCat("gloo: send of round ", tag, " timed out"));
        }
      }
    } catch (const std::exception& e) {
      status = FromGloo(e, absl::StrCat("round ", tag));
    }
    if (!status.ok()) {
      broken_ = true;
      try {
        context_->closeConnections();
      } catch (const std::exception&) {
        // Already failing; the first error is the one to report.
      }
      return status;
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  bool broken_ = false;
};

class GlooTransportFactory : public TransportFactory {
 public:
  std::string name() const override { return "gloo"; }
  bool IsViable() const override { return true; }

  absl::StatusOr<std::unique_ptr<Transport>> Create(
      const TransportConfig& config, RendezvousStore* store) const override {
    if (config.world_size <= 0 || config.rank < 0 ||
        config.rank >= config.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gloo: rank ", config.rank, " of world size ", config.world_size));
    }
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = config.hostname;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(
          config.rank, config.world_size);
      context->setTimeout(ToChrono(config.connect_timeout));
      StoreAdapter adapter(store, config.store_prefix, config.connect_timeout);
      context->connectFullMesh(adapter, device);
      // Gloo's full mesh is complete on this rank before it is on all of
      // them; a rank that returned and exited at once would cut a peer's
      // connection while the peer still sets it up. Leave only when every
      // rank is connected.
      const std::string done =
          absl::StrCat(config.store_prefix, "/gloo_connected/");
      if (absl::Status s = store->Set(absl::StrCat(done, config.rank), "1");
          !s.ok()) {
        return s;
      }
      for (int r = 0; r < config.world_size; ++r) {
        if (absl::Status s =
                store->Get(absl::StrCat(done, r), config.connect_timeout)
                    .status();
            !s.ok()) {
          return s;
        }
      }
      return std::make_unique<GlooTransport>(std::move(device),
                                             std::move(context));
    } catch (const std::exception& e) {
      return FromGloo(e, absl::StrCat("connecting rank ", config.rank));
    }
  }
};

}  // namespace

std::unique_ptr<TransportFactory> MakeGlooTransportFactory() {
  return std::make_unique<GlooTransportFactory>();
}

}  // namespace arachne::migration
