// Cluster spec files (cluster_io.h): any bytes are a precise error or a
// cluster, and a cluster written back (ClusterToJson) reads as the same.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_checks.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const arachne::GpuCatalog* const catalog =
      new arachne::GpuCatalog(*arachne::LoadGpuCatalog());
  absl::StatusOr<arachne::Cluster> cluster = arachne::ParseCluster(
      arachne::fuzz::AsText(data, size), "cluster.yaml", *catalog);
  arachne::fuzz::CheckInputError(cluster.status(), "ParseCluster");
  if (cluster.ok()) {
    const std::string again = arachne::ClusterToJson(*cluster, *catalog).dump();
    absl::StatusOr<arachne::Cluster> back =
        arachne::ParseCluster(again, "written.json", *catalog);
    arachne::fuzz::CheckOk(back.status(), "a written cluster reads back");
    if (back->num_nodes() != cluster->num_nodes() ||
        back->total_gpus() != cluster->total_gpus()) {
      arachne::fuzz::Fail("a written cluster reads back the same",
                          absl::InternalError(again.substr(0, 200)));
    }
  }
  return 0;
}
