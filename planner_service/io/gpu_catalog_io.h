// Loading the GPU catalog (profiles/gpus.yaml) into core's GpuCatalog.
#ifndef ARACHNE_PLANNER_SERVICE_IO_GPU_CATALOG_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_GPU_CATALOG_IO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/model/gpu_catalog.h"

namespace arachne {

// Parses a catalog file (YAML or JSON): `gpus: [{id, aliases?, product_name,
// peak_bf16_tflops, peak_fp32_tflops, memory_gib, hbm_gbps, intra_node_gbps,
// intra_node_link, default_gpus_per_node, usd_per_hour, source}]`. Every
// field but aliases is required and unknown fields are errors; messages name
// `source` and the field path, e.g. "gpus.yaml: gpus[3].memory_gib: must be a
// number > 0, got 0". Duplicate ids/aliases are rejected by
// GpuCatalog::Create (message prefixed with `source`).
absl::StatusOr<GpuCatalog> ParseGpuCatalog(absl::string_view text,
                                           absl::string_view source);

// Loads "gpus.yaml" from `profiles_dir` when given and present there, else the
// copy built into the binary (see data_files.h).
absl::StatusOr<GpuCatalog> LoadGpuCatalog(const std::string& profiles_dir = "");

// One catalog row in the file format above (for `arachne gpus --json` and
// round-trip tests).
nlohmann::json GpuTypeToJson(const GpuType& type);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_GPU_CATALOG_IO_H_
