// Benchmark scenario files (scenario_io.h): any bytes are a precise error
// or a scenario. A scenario names its model, which ResolveModel may look up
// as a file when it is not a catalog name: NotFound is then the answer.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_checks.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/scenario_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const arachne::GpuCatalog* const catalog =
      new arachne::GpuCatalog(*arachne::LoadGpuCatalog());
  absl::StatusOr<arachne::Scenario> scenario = arachne::ParseScenario(
      arachne::fuzz::AsText(data, size), "scenario.yaml", *catalog);
  arachne::fuzz::CheckInputError(scenario.status(), "ParseScenario",
                                 absl::StatusCode::kNotFound);
  return 0;
}
