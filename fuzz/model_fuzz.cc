// Model catalog files (model_io.h, `models: [...]`): any bytes are a precise
// error or models, and each model written back (ModelToJson) reads again.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_checks.h"
#include "planner_service/io/model_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::vector<arachne::ModelSpec>> models =
      arachne::ParseModelCatalog(arachne::fuzz::AsText(data, size),
                                 "models.yaml");
  arachne::fuzz::CheckInputError(models.status(), "ParseModelCatalog");
  if (!models.ok()) return 0;
  for (const arachne::ModelSpec& m : *models) {
    absl::StatusOr<arachne::ModelSpec> back =
        arachne::ModelFromJson(arachne::ModelToJson(m), "written", "model");
    arachne::fuzz::CheckOk(back.status(), "a written model reads back");
  }
  return 0;
}
