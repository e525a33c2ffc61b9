#include "migration/nccl/nccl_transport.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "migration/nccl/nccl_checks.h"

namespace arachne::migration {
namespace {

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

class NcclTransport : public Transport {
 public:
  NcclTransport(const TransportConfig& config, int device)
      : config_(config), device_(device) {}
  ~NcclTransport() override {
    if (comm_ != nullptr) {
      if (broken_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (staging_ != nullptr) cudaFree(staging_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Connect(RendezvousStore* store) {
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ARACHNE_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclUniqueId id;
    const std::string key = absl::StrCat(config_.store_prefix, "/nccl_id");
    if (config_.rank == 0) {
      ARACHNE_NCCL_RETURN_IF_ERROR(nullptr, ncclGetUniqueId(&id));
      if (absl::Status s = store->Set(
              key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
          !s.ok()) {
        return s;
      }
    } else {
      absl::StatusOr<std::string> v = store->Get(key, config_.connect_timeout);
      if (!v.ok()) return v.status();
      if (v->size() != sizeof(id)) {
        return absl::DataLossError(absl::StrCat(
            "nccl: unique id under '", key, "' has ", v->size(),
            " bytes, expected ", sizeof(id)));
      }
      std::memcpy(&id, v->data(), sizeof(id));
    }
    ARACHNE_NCCL_RETURN_IF_ERROR(
        comm_, ncclCommInitRank(&comm_, config_.world_size, id, config_.rank));
    return absl::OkStatus();
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return config_.rank; }
  int world_size() const override { return config_.world_size; }
  MemoryKind memory() const override { return config_.memory; }

  absl::Status RunRound(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs,
                        absl::Duration timeout) override {
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
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const bool host = config_.memory == MemoryKind::kHost;
    std::vector<const void*> send_ptrs;
    std::vector<void*> recv_ptrs;
    if (host) {
      size_t total = 0;
      for (const SendOp& op : sends) total += op.bytes;
      for (const RecvOp& op : recvs) total += op.bytes;
      if (total > staging_bytes_) {
        if (staging_ != nullptr) ARACHNE_CUDA_RETURN_IF_ERROR(cudaFree(staging_));
        staging_ = nullptr;
        ARACHNE_CUDA_RETURN_IF_ERROR(cudaMalloc(&staging_, total));
        staging_bytes_ = total;
      }
      char* p = static_cast<char*>(staging_);
      for (const SendOp& op : sends) {
        ARACHNE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
            p, op.data, op.bytes, cudaMemcpyHostToDevice, stream_));
        send_ptrs.push_back(p);
        p += op.bytes;
      }
      for (const RecvOp& op : recvs) {
        recv_ptrs.push_back(p);
        p += op.bytes;
      }
    } else {
      for (const SendOp& op : sends) send_ptrs.push_back(op.data);
      for (const RecvOp& op : recvs) recv_ptrs.push_back(op.data);
    }
    ARACHNE_NCCL_RETURN_IF_ERROR(comm_, ncclGroupStart());
    for (size_t i = 0; i < sends.size(); ++i) {
      ARACHNE_NCCL_RETURN_IF_ERROR(
          comm_, ncclSend(send_ptrs[i], sends[i].bytes, ncclUint8,
                          sends[i].peer, comm_, stream_));
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      ARACHNE_NCCL_RETURN_IF_ERROR(
          comm_, ncclRecv(recv_ptrs[i], recvs[i].bytes, ncclUint8,
                          recvs[i].peer, comm_, stream_));
    }
    ARACHNE_NCCL_RETURN_IF_ERROR(comm_, ncclGroupEnd());
    // Poll instead of synchronising, so a silent peer becomes a timeout and
    // the communicator can be aborted rather than hang.
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        broken_ = true;
        ARACHNE_CUDA_RETURN_IF_ERROR(q);
      }
      ncclResult_t async = ncclSuccess;
      ARACHNE_NCCL_RETURN_IF_ERROR(comm_, ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        broken_ = true;
        return internal::NcclStatus(async, comm_, "ncclCommGetAsyncError",
                                    __FILE__, __LINE__);
      }
      if (absl::Now() >= deadline) {
        broken_ = true;
        return absl::DeadlineExceededError(absl::StrCat(
            "nccl: round ", tag, " did not finish within ",
            absl::FormatDuration(timeout)));
      }
      absl::SleepFor(absl::Microseconds(50));
    }
    if (host) {
      for (size_t i = 0; i < recvs.size(); ++i) {
        ARACHNE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(recvs[i].data, recv_ptrs[i], recvs[i].bytes,
                            cudaMemcpyDeviceToHost, stream_));
      }
      ARACHNE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    return absl::OkStatus();
  }

 private:
  TransportConfig config_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  bool broken_ = false;  // abort, not destroy, a communicator that failed
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
