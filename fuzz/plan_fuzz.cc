// Plan files (plan_io.h), read against a fixed two-node cluster: any bytes
// are a precise error or a plan.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_checks.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/plan_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const arachne::GpuCatalog* const catalog =
      new arachne::GpuCatalog(*arachne::LoadGpuCatalog());
  // The nodes the seed plans name (examples/small-8.yaml).
  static const arachne::Cluster* const cluster = new arachne::Cluster(
      *arachne::ParseCluster("nodes:\n"
                             "  - {name: a100-0, gpu: A100-40GB, gpus: 4}\n"
                             "  - {name: a6000-0, gpu: A6000, gpus: 4}\n",
                             "small-8.yaml", *catalog));
  absl::StatusOr<nlohmann::json> tree =
      arachne::ParseJsonOrYaml(arachne::fuzz::AsText(data, size), "plan.json");
  arachne::fuzz::CheckInputError(tree.status(), "ParseJsonOrYaml");
  if (!tree.ok()) return 0;
  absl::StatusOr<arachne::Plan> plan =
      arachne::PlanFromJson(*tree, *cluster, *catalog, "plan.json");
  arachne::fuzz::CheckInputError(plan.status(), "PlanFromJson");
  return 0;
}
