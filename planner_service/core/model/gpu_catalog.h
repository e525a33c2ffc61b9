// GPU hardware catalog: the per-type facts the cost model needs (peak
// throughput, memory, bandwidths, node size, price). The data lives in
// profiles/gpus.yaml (each row names its source); this file only holds the
// in-memory form and name resolution.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_MODEL_GPU_CATALOG_H_
#define ARACHNE_PLANNER_SERVICE_CORE_MODEL_GPU_CATALOG_H_

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace arachne {

// One GPU type. Bandwidths are GB/s (1e9 bytes/s) per direction.
struct GpuType {
  std::string id;                    // canonical id, e.g. "A100-40GB"
  std::vector<std::string> aliases;  // matched case-insensitively
  std::string product_name;          // e.g. "NVIDIA A100-SXM4-40GB"
  double peak_bf16_tflops = 0;       // dense tensor-core bf16/fp16
  double peak_fp32_tflops = 0;       // plain FP32 (no TF32)
  double memory_gib = 0;             // device memory
  double hbm_gbps = 0;               // device memory bandwidth, GB/s
  double intra_node_gbps = 0;        // NVLink/PCIe per direction, GB/s
  std::string intra_node_link;       // "NVLink3", "PCIe4", ...
  int default_gpus_per_node = 8;
  double usd_per_hour = 0;           // on-demand price per GPU
  std::string source;                // where the figures come from
  // GPU generation ("ampere", "hopper", ...; GpuArchitectures()): some
  // kernels' speed depends on it beyond the peak figures (attention
  // "flash2" on Hopper, profile_synthesizer.cc).
  std::string architecture;
};

// The architecture names gpus.yaml accepts.
const std::vector<std::string>& GpuArchitectures();

// Immutable set of GPU types with case-insensitive lookup by id or alias.
class GpuCatalog {
 public:
  // Fails with InvalidArgument on a duplicate id/alias or a non-positive
  // figure (naming the type and field).
  static absl::StatusOr<GpuCatalog> Create(std::vector<GpuType> types);

  GpuCatalog() = default;

  // Index of the type named `name` (id or alias, any case), or NotFound
  // naming the value and listing the known ids.
  absl::StatusOr<int> IndexOf(absl::string_view name) const;
  const GpuType& type(int index) const { return types_[index]; }
  const std::vector<GpuType>& types() const { return types_; }
  int size() const { return static_cast<int>(types_.size()); }

 private:
  std::vector<GpuType> types_;
  absl::flat_hash_map<std::string, int> by_lower_name_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_MODEL_GPU_CATALOG_H_
