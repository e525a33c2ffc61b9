// Times one layer of a model as one rank of a TP group runs it, with
// LibTorch (layer_timer.cc is the profiler's only translation unit that
// includes torch; this header is LibTorch-free so profile_measure.cc and its
// users compile quickly).
#ifndef ARACHNE_PLANNER_SERVICE_PROFILER_LAYER_TIMER_H_
#define ARACHNE_PLANNER_SERVICE_PROFILER_LAYER_TIMER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "planner_service/core/model/model.h"

namespace arachne {

enum class ProfileDevice { kCpu, kCuda };
enum class ProfileDtype { kBf16, kFp16, kFp32 };

struct LayerTimingRequest {
  ModelSpec model;
  LayerKind kind = LayerKind::kDense;
  int tp = 1;
  int mbs = 1;
  int seq = 2048;
  ProfileDevice device = ProfileDevice::kCpu;
  ProfileDtype dtype = ProfileDtype::kBf16;
  int warmup = 3;
  int iters = 10;
  uint64_t seed = 1;
};

struct LayerTiming {
  double fwd_ms = 0;  // median over iters
  double bwd_ms = 0;  // median over iters
  // Bytes kept for the backward, measured from the allocator: what it holds
  // after one forward beyond what it held before (parameters and gradients
  // already allocated by a first pass), less the layer's output (the next
  // layer's input, counted there), plus the layer's input where the backward
  // keeps it (dense, lm_head: the first norm saves it; allocated before the
  // forward, so not in the growth). CPU: a counting wrapper of LibTorch's
  // CPU allocator; CUDA: the caching allocator's allocated_bytes.
  int64_t activation_bytes = 0;
  // Elements of the parameters of the module built for this rank (norms
  // and row-parallel biases replicated, everything else sliced by tp).
  int64_t module_params = 0;
};

// Builds the rank's slice of `kind` (Megatron column/row-parallel shapes,
// sequence parallel), runs `warmup` forward+backward passes, then `iters`
// timed ones. Unimplemented for the MoE kinds and MLA attention;
// InvalidArgument when the shapes do not divide (the caller checks first);
// FailedPrecondition for --device cuda where LibTorch has no CUDA.
absl::StatusOr<LayerTiming> TimeLayer(const LayerTimingRequest& request);

// Compares the profiler's hand-written backwards (RMSNorm, rotary
// embedding, the sequence-parallel column linear) with autograd over the
// plain ops they replace, in fp64 on CPU; InternalError naming the one that
// differs. For tests.
absl::Status CheckHandWrittenBackwards();

// Whether LibTorch sees a CUDA device.
bool CudaAvailable();

// "LibTorch 1.13.0 (CPU only)" or "... (CUDA, N devices)", for the summary.
std::string TorchDescription();

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_PROFILER_LAYER_TIMER_H_
