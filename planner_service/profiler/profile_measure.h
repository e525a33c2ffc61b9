// `arachne profile measure` (the arachne-profile binary, which `arachne
// profile measure ARGS` execs): times one transformer layer, the embedding
// and the LM head of a model on this machine's device for the TP slices and
// micro-batch sizes the planner uses, and writes `measured` profile entries
// in the format LoadProfileFiles reads (profile_io.h). docs/profiler.md.
#ifndef ARACHNE_PLANNER_SERVICE_PROFILER_PROFILE_MEASURE_H_
#define ARACHNE_PLANNER_SERVICE_PROFILER_PROFILE_MEASURE_H_

#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/cost/profile_store.h"

namespace arachne {

struct ProfileMeasureOptions {
  std::string model;  // catalog id or config.json (ResolveModel)
  // Catalog id the entries are recorded under. Empty: on CUDA, the device's
  // name (nvidia-smi) mapped to the catalog; required on CPU.
  std::string gpu;
  // Empty: the defaults below, skipping those the model's shapes do not
  // divide (given explicitly, such a value is an error).
  std::vector<int> tp;
  std::vector<int> mbs;
  int seq = 2048;
  std::vector<std::string> layers;  // empty: dense, embedding, lm_head
  std::string device;               // cpu | cuda; empty: cuda when present
  std::string dtype;                // bf16 | fp16 | fp32; empty: bf16 on
                                    // CUDA, fp32 on CPU
  int warmup = 3;
  int iters = 10;
  std::string out;           // the CSV written
  std::string profiles_dir;  // catalogs and calibration ("": built-in)
};

inline constexpr int kDefaultMeasureTps[] = {1, 2, 4, 8};
inline constexpr int kDefaultMeasureMbs[] = {1, 2, 4};

void AddProfileMeasureFlags(CLI::App* app, ProfileMeasureOptions* options);

// Measures every (layer, tp, micro-batch) and writes the CSV; prints the
// summary (with measured / synthesized ratios) to `out`. Returns the exit
// code (0, 2 for bad input, 1 otherwise), the error on `err`.
int RunProfileMeasure(const ProfileMeasureOptions& options, std::ostream& out,
                      std::ostream& err);

// The catalog id of a device named `device_name` (nvidia-smi's, e.g.
// "NVIDIA H100 80GB HBM3"): an id or alias, a product_name, either without
// the "NVIDIA " prefix, else the longest run of its words that joined by
// '-' is an id or alias ("H100-80GB"), all case-insensitive; NotFound
// asking for --gpu otherwise.
absl::StatusOr<std::string> CatalogIdForDevice(const GpuCatalog& catalog,
                                               const std::string& device_name);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_PROFILER_PROFILE_MEASURE_H_
