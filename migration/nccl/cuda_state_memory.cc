#include "migration/nccl/cuda_state_memory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "migration/core/checksum.h"
#include "migration/nccl/nccl_checks.h"

namespace arachne::migration {
namespace {

class CudaStateMemory : public StateMemory {
 public:
  CudaStateMemory(int device, size_t chunk) : device_(device), chunk_(chunk) {}
  ~CudaStateMemory() override {
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ARACHNE_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&pinned_, chunk_, 0));
    return absl::OkStatus();
  }

  MemoryKind kind() const override { return MemoryKind::kDevice; }

  absl::Status Copy(void* to, const void* from, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        to, from, bytes, cudaMemcpyDeviceToDevice, stream_));
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  // A verified copy back: the segment comes to pinned host memory chunk by
  // chunk (the chunk a multiple of ChecksumStream::kBlockBytes) and is
  // hashed there, so the device value equals the host's.
  absl::StatusOr<uint64_t> Checksum(const void* data, size_t bytes) override {
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ChecksumStream sum(bytes);
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t at = 0; at < bytes; at += chunk_) {
      const size_t n = std::min(chunk_, bytes - at);
      ARACHNE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          pinned_, p + at, n, cudaMemcpyDeviceToHost, stream_));
      ARACHNE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      sum.Update(pinned_, n);
    }
    return sum.Finish();
  }

  absl::Status ToHost(void* host, const void* from, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ARACHNE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, from, bytes, cudaMemcpyDeviceToHost, stream_));
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::Status FromHost(void* to, const void* host, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ARACHNE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(to, host, bytes, cudaMemcpyHostToDevice, stream_));
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(size_t bytes) override {
    ARACHNE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    if (const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
        e != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "GPU ", device_, ": cannot allocate ", bytes,
          " bytes of staging: ", cudaGetErrorString(e)));
    }
    const int device = device_;
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p),
                                    [device](uint8_t* q) {
                                      cudaSetDevice(device);
                                      cudaFree(q);
                                    });
  }

 private:
  int device_;
  size_t chunk_;
  cudaStream_t stream_ = nullptr;
  uint8_t* pinned_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateMemory>> MakeCudaStateMemory(
    int device, size_t checksum_chunk_bytes) {
  constexpr size_t kMin = size_t{64} << 10, kMax = size_t{1} << 30;
  if (checksum_chunk_bytes < kMin || checksum_chunk_bytes > kMax ||
      checksum_chunk_bytes % ChecksumStream::kBlockBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checksum_chunk_bytes ", checksum_chunk_bytes,
        ": must be a multiple of ", ChecksumStream::kBlockBytes, " in [",
        kMin, ", ", kMax, "]"));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device, ": this machine has ", count, " CUDA devices"));
  }
  auto memory = std::make_unique<CudaStateMemory>(device, checksum_chunk_bytes);
  if (absl::Status s = memory->Init(); !s.ok()) return s;
  return memory;
}

}  // namespace arachne::migration
