#include "migration/nccl/nccl_transport.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "migration/nccl/deadline_poll.h"
#include "migration/nccl/nccl_checks.h"
#include "migration/nccl/staged_round.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the NCCL transport needs NCCL >= 2.14 (ncclCommInitRankConfig, non-blocking communicators, ncclCommFinalize)"
#endif

namespace arachne::migration {
namespace {

// How long an aborted round waits for its stream to drain, and how long a
// healthy communicator's finalize may take, before giving up (bounded, so
// neither can hang).
constexpr absl::Duration kAbortDrain = absl::Seconds(10);
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);
constexpr absl::Duration kRoundPoll = absl::Microseconds(50);
constexpr absl::Duration kSetupPoll = absl::Milliseconds(1);
// At most this many peers are named in an error message.
constexpr int kMaxNamed = 4;

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// What rank 0 publishes besides the unique id, so that every rank cuts
// staged rounds alike (staged_round.h) or refuses to join.
std::string Settings(const TransportConfig& c) {
  if (c.memory == MemoryKind::kDevice) return "memory=device";
  return absl::StrCat("staging=", c.staging_bytes, ";memory=host");
}

// "to 1: 4096 bytes; from 3: 10 bytes; ... (2 more)".
class Describer {
 public:
  void Add(const char* dir, int peer, size_t bytes) {
    if (named_ < kMaxNamed) {
      absl::StrAppend(&text_, named_ == 0 ? "" : "; ", dir, " ", peer, ": ",
                      bytes, " bytes");
      ++named_;
    } else {
      ++more_;
    }
  }
  std::string Done() const {
    if (named_ == 0) return "no bytes";
    return more_ == 0 ? text_ : absl::StrCat(text_, "; ... (", more_, " more)");
  }

 private:
  std::string text_;
  int named_ = 0;
  int more_ = 0;
};

std::string Describe(const nccl::SubRound& sr) {
  Describer d;
  for (const nccl::StagedTransfer& t : sr.sends) d.Add("to", t.peer, t.bytes);
  for (const nccl::StagedTransfer& t : sr.recvs) d.Add("from", t.peer, t.bytes);
  return d.Done();
}

std::string Describe(absl::Span<const SendOp> sends,
                     absl::Span<const RecvOp> recvs) {
  Describer d;
  for (const SendOp& op : sends) {
    if (op.bytes > 0) d.Add("to", op.peer, op.bytes);
  }
  for (const RecvOp& op : recvs) {
    if (op.bytes > 0) d.Add("from", op.peer, op.bytes);
  }
  return d.Done();
}

// Done once the communicator is no longer ncclInProgress; its async error
// otherwise.
absl::StatusOr<bool> CommReady(ncclComm_t comm) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
  if (r != ncclSuccess) {
    return internal::NcclStatus(r, comm, "ncclCommGetAsyncError", __FILE__,
                                __LINE__);
  }
  if (async == ncclInProgress) return false;
  if (async != ncclSuccess) {
    return internal::NcclStatus(async, comm,
                                "the communicator (ncclCommGetAsyncError)",
                                __FILE__, __LINE__);
  }
  return true;
}

class NcclTransport : public Transport {
 public:
  NcclTransport(const TransportConfig& config, int device)
      : config_(config), device_(device) {}

  ~NcclTransport() override {
    if (device_ >= 0) (void)cudaSetDevice(device_);
    if (comm_ != nullptr) {
      // Healthy: flush and destroy. A finalize that fails or does not finish
      // in time is aborted instead (PollUntilDone aborts).
      const ncclResult_t r = ncclCommFinalize(comm_);
      absl::Status s;
      if (r == ncclSuccess || r == ncclInProgress) {
        s = nccl::PollUntilDone(
            {.what = absl::StrCat("nccl: finalize of rank ", config_.rank,
                                  " of world size ", config_.world_size),
             .deadline = clock_.Now() + kFinalizeTimeout,
             .budget = kFinalizeTimeout,
             .interval = kSetupPoll},
            [&] { return CommReady(comm_); }, [&] { return AbortComm(); },
            clock_);
      } else {
        s = internal::NcclStatus(r, comm_, "ncclCommFinalize", __FILE__,
                                 __LINE__);
        (void)AbortComm();
      }
      if (!s.ok()) LOG(WARNING) << s;
      if (comm_ != nullptr) ncclCommDestroy(comm_);
      comm_ = nullptr;
    }
    if (host_staging_ != nullptr) cudaFreeHost(host_staging_);
    if (device_staging_ != nullptr) cudaFree(device_staging_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Everything under one deadline: connect_timeout from now.
  absl::Status Connect(RendezvousStore* store) {
    const absl::Time deadline = clock_.Now() + config_.connect_timeout;
    const std::string who = absl::StrCat(
        "rank ", config_.rank, " of world size ", config_.world_size,
        " (store prefix '", config_.store_prefix, "')");
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ARACHNE_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (config_.memory == MemoryKind::kHost) {
      ARACHNE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(
          &host_staging_, config_.staging_bytes, cudaHostAllocDefault));
      ARACHNE_CUDA_RETURN_IF_ERROR(
          cudaMalloc(&device_staging_, config_.staging_bytes));
    }

    ncclUniqueId id;
    const std::string key = absl::StrCat(config_.store_prefix, "/nccl_id");
    const std::string mine = Settings(config_);
    if (config_.rank == 0) {
      ARACHNE_NCCL_RETURN_IF_ERROR(nullptr, ncclGetUniqueId(&id));
      if (absl::Status s = store->Set(
              key, absl::StrCat(absl::string_view(
                                    reinterpret_cast<const char*>(&id),
                                    sizeof(id)),
                                mine));
          !s.ok()) {
        return s;
      }
    } else {
      absl::StatusOr<std::string> v =
          store->Get(key, std::max(deadline - clock_.Now(), absl::ZeroDuration()));
      if (!v.ok()) return v.status();
      if (v->size() < sizeof(id)) {
        return absl::DataLossError(absl::StrCat(
            "nccl: unique id under '", key, "' has ", v->size(),
            " bytes, expected at least ", sizeof(id)));
      }
      std::memcpy(&id, v->data(), sizeof(id));
      const std::string theirs = v->substr(sizeof(id));
      if (theirs != mine) {
        return absl::FailedPreconditionError(absl::StrCat(
            "nccl: ", who, " has settings '", mine, "' but rank 0 has '",
            theirs, "'; TransportConfig::staging_bytes and memory must be "
            "the same on every rank"));
      }
    }

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(
        &comm_, config_.world_size, id, config_.rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
      absl::Status s = internal::NcclStatus(r, comm_, "ncclCommInitRankConfig",
                                            __FILE__, __LINE__);
      const absl::Status a = AbortComm();
      return absl::Status(
          s.code(),
          absl::StrCat("nccl: communicator init of ", who, ": ", s.message(),
                       a.ok() ? "" : absl::StrCat("; abort failed: ",
                                                  a.message())));
    }
    return nccl::PollUntilDone(
        {.what = absl::StrCat("nccl: communicator init of ", who),
         .deadline = deadline,
         .budget = config_.connect_timeout,
         .interval = kSetupPoll},
        [&] { return CommReady(comm_); }, [&] { return AbortComm(); }, clock_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return config_.rank; }
  int world_size() const override { return config_.world_size; }
  MemoryKind memory() const override { return config_.memory; }

  absl::Status RunRound(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs,
                        absl::Duration timeout) override {
    if (!first_error_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "nccl: round ", tag, " refused: the communicator was aborted after "
          "an earlier error: ", first_error_.ToString()));
    }
    // Refused before anything is posted; the transport stays usable.
    for (const SendOp& op : sends) {
      if (op.peer < 0 || op.peer >= world_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("nccl: send to peer ", op.peer, " of ", world_size()));
      }
    }
    for (const RecvOp& op : recvs) {
      if (op.peer < 0 || op.peer >= world_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "nccl: receive from peer ", op.peer, " of ", world_size()));
      }
    }
    const absl::Time deadline = clock_.Now() + timeout;
    absl::Status s = config_.memory == MemoryKind::kHost
                         ? RunHostRound(sends, recvs, deadline, timeout)
                         : RunDeviceRound(sends, recvs, deadline, timeout);
    if (s.ok()) return s;
    // Whatever failed (a CUDA call, an NCCL call, the peer, the deadline),
    // no kernel may outlive this call: abort now unless the poll already
    // did.
    const absl::Status a = AbortComm();
    s = absl::Status(
        s.code(),
        absl::StrCat("nccl: round ", tag, ": ", s.message(),
                     a.ok() ? "" : absl::StrCat("; abort failed: ",
                                                a.message())));
    first_error_ = s;
    return s;
  }

 private:
  // Aborts the communicator (once; later calls do nothing) and waits,
  // bounded, until no kernel is left on the stream.
  absl::Status AbortComm() {
    if (comm_ == nullptr) return absl::OkStatus();
    ncclComm_t comm = comm_;
    comm_ = nullptr;
    absl::Status s;
    if (const ncclResult_t r = ncclCommAbort(comm); r != ncclSuccess) {
      s = internal::NcclStatus(r, nullptr, "ncclCommAbort", __FILE__, __LINE__);
    }
    if (stream_ == nullptr) return s;
    const absl::Time end = clock_.Now() + kAbortDrain;
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        // A failed stream runs nothing more.
        s.Update(internal::CudaStatus(q, "cudaStreamQuery(stream_) after abort",
                                      __FILE__, __LINE__));
        break;
      }
      if (clock_.Now() >= end) {
        s.Update(absl::InternalError(absl::StrCat(
            "the stream was still busy ", absl::FormatDuration(kAbortDrain),
            " after ncclCommAbort")));
        break;
      }
      clock_.Sleep(kRoundPoll);
    }
    return s;
  }

  // Done when the stream is idle and the communicator reports no error.
  absl::StatusOr<bool> StreamDone() {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q != cudaSuccess && q != cudaErrorNotReady) {
      return internal::CudaStatus(q, "cudaStreamQuery(stream_)", __FILE__,
                                  __LINE__);
    }
    // Checked also once the stream is idle: a kernel that a peer's failure
    // stopped early leaves an idle stream and an async error.
    absl::StatusOr<bool> comm = CommReady(comm_);
    if (!comm.ok()) return comm.status();
    return q == cudaSuccess && *comm;
  }

  absl::Status Wait(const std::string& what, absl::Time deadline,
                    absl::Duration budget,
                    absl::FunctionRef<absl::StatusOr<bool>()> poll) {
    return nccl::PollUntilDone(
        {.what = what, .deadline = deadline, .budget = budget,
         .interval = kRoundPoll},
        poll, [&] { return AbortComm(); }, clock_);
  }

  // One NCCL group: the ops `post` issues, then (non-blocking) the wait
  // until ncclGroupEnd has enqueued them.
  absl::Status RunGroup(const std::string& what, absl::Time deadline,
                        absl::Duration budget,
                        absl::FunctionRef<absl::Status()> post) {
    ARACHNE_NCCL_RETURN_IF_ERROR(comm_, ncclGroupStart());
    const absl::Status posted = post();
    // Always closed, so no group is left open on this thread.
    const ncclResult_t end = ncclGroupEnd();
    if (!posted.ok()) return posted;
    if (end != ncclSuccess && end != ncclInProgress) {
      return internal::NcclStatus(end, comm_, "ncclGroupEnd()", __FILE__,
                                  __LINE__);
    }
    return Wait(absl::StrCat(what, " (enqueueing the group)"), deadline,
                budget, [&] { return CommReady(comm_); });
  }

  absl::Status RunDeviceRound(absl::Span<const SendOp> sends,
                              absl::Span<const RecvOp> recvs,
                              absl::Time deadline, absl::Duration timeout) {
    const bool any =
        std::any_of(sends.begin(), sends.end(),
                    [](const SendOp& op) { return op.bytes > 0; }) ||
        std::any_of(recvs.begin(), recvs.end(),
                    [](const RecvOp& op) { return op.bytes > 0; });
    if (!any) return absl::OkStatus();
    const std::string what = absl::StrCat("one group (", Describe(sends, recvs), ")");
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (absl::Status s = RunGroup(what, deadline, timeout, [&]() -> absl::Status {
          for (const SendOp& op : sends) {
            if (op.bytes == 0) continue;
            ARACHNE_NCCL_RETURN_IF_ERROR(
                comm_, ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_,
                                stream_));
          }
          for (const RecvOp& op : recvs) {
            if (op.bytes == 0) continue;
            ARACHNE_NCCL_RETURN_IF_ERROR(
                comm_, ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_,
                                stream_));
          }
          return absl::OkStatus();
        });
        !s.ok()) {
      return s;
    }
    return Wait(what, deadline, timeout, [&] { return StreamDone(); });
  }

  absl::Status RunHostRound(absl::Span<const SendOp> sends,
                            absl::Span<const RecvOp> recvs,
                            absl::Time deadline, absl::Duration timeout) {
    std::vector<nccl::StagedOp> out, in;
    out.reserve(sends.size());
    in.reserve(recvs.size());
    for (const SendOp& op : sends) out.push_back({op.peer, op.bytes});
    for (const RecvOp& op : recvs) in.push_back({op.peer, op.bytes});
    absl::StatusOr<nccl::StagedRoundPlan> plan = nccl::PlanStagedRound(
        out, in, config_.world_size, config_.staging_bytes);
    if (!plan.ok()) return plan.status();
    if (plan->sub_rounds.empty()) return absl::OkStatus();
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    char* host = static_cast<char*>(host_staging_);
    char* dev = static_cast<char*>(device_staging_);
    const size_t n = plan->sub_rounds.size();
    for (size_t k = 0; k < n; ++k) {
      const nccl::SubRound& sr = plan->sub_rounds[k];
      const std::string what =
          absl::StrCat("sub-round ", k + 1, " of ", n, " (", Describe(sr), ")");
      for (const nccl::StagedTransfer& t : sr.sends) {
        for (const nccl::StagedPiece& p : t.pieces) {
          std::memcpy(host + p.staging_offset,
                      static_cast<const char*>(sends[p.op].data) + p.op_offset,
                      p.bytes);
        }
      }
      if (sr.send_region > 0) {
        ARACHNE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
            dev, host, sr.send_region, cudaMemcpyHostToDevice, stream_));
      }
      if (absl::Status s = RunGroup(what, deadline, timeout, [&]() -> absl::Status {
            for (const nccl::StagedTransfer& t : sr.sends) {
              ARACHNE_NCCL_RETURN_IF_ERROR(
                  comm_, ncclSend(dev + t.staging_offset, t.bytes, ncclUint8,
                                  t.peer, comm_, stream_));
            }
            for (const nccl::StagedTransfer& t : sr.recvs) {
              ARACHNE_NCCL_RETURN_IF_ERROR(
                  comm_, ncclRecv(dev + t.staging_offset, t.bytes, ncclUint8,
                                  t.peer, comm_, stream_));
            }
            return absl::OkStatus();
          });
          !s.ok()) {
        return s;
      }
      if (sr.staging_used > sr.send_region) {
        ARACHNE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
            host + sr.send_region, dev + sr.send_region,
            sr.staging_used - sr.send_region, cudaMemcpyDeviceToHost,
            stream_));
      }
      if (absl::Status s =
              Wait(what, deadline, timeout, [&] { return StreamDone(); });
          !s.ok()) {
        return s;
      }
      // Only now, with the sub-round complete, do the caller's buffers see
      // the bytes.
      for (const nccl::StagedTransfer& t : sr.recvs) {
        for (const nccl::StagedPiece& p : t.pieces) {
          std::memcpy(static_cast<char*>(recvs[p.op].data) + p.op_offset,
                      host + p.staging_offset, p.bytes);
        }
      }
    }
    return absl::OkStatus();
  }

  TransportConfig config_;
  int device_;
  nccl::RealPollClock clock_;
  ncclComm_t comm_ = nullptr;  // null once aborted
  cudaStream_t stream_ = nullptr;
  void* host_staging_ = nullptr;    // pinned, staging_bytes (kHost)
  void* device_staging_ = nullptr;  // staging_bytes (kHost)
  // The error that aborted the communicator; every later round is refused.
  absl::Status first_error_;
};

class NcclTransportFactory : public TransportFactory {
 public:
  std::string name() const override { return "nccl"; }
  bool IsViable() const override { return DeviceCount() > 0; }
  int MaxLocalRanks() const override { return DeviceCount(); }

  absl::StatusOr<std::unique_ptr<Transport>> Create(
      const TransportConfig& config, RendezvousStore* store) const override {
    if (config.world_size <= 0 || config.rank < 0 ||
        config.rank >= config.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nccl: rank ", config.rank, " of world size ", config.world_size));
    }
    if (config.memory == MemoryKind::kHost) {
      if (absl::Status s =
              nccl::ValidateStagingBytes(config.staging_bytes, config.world_size);
          !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("nccl: TransportConfig::", s.message()));
      }
    }
    const int count = DeviceCount();
    if (count == 0) return absl::FailedPreconditionError("nccl: no GPU");
    const int device = config.device >= 0 ? config.device : config.rank % count;
    if (device >= count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nccl: device ", device, " but only ", count, " GPUs"));
    }
    auto t = std::make_unique<NcclTransport>(config, device);
    if (absl::Status s = t->Connect(store); !s.ok()) return s;
    return t;
  }
};

}  // namespace

std::unique_ptr<TransportFactory> MakeNcclTransportFactory() {
  return std::make_unique<NcclTransportFactory>();
}

}  // namespace arachne::migration
