// arachne-controller's job file (controller/controller_config.h): any bytes
// are a precise error or a job the controller can run: parsed as the
// arachne.v1.JobSpec message (YAML or JSON), then resolved against the
// catalogs (model, training, engine, planner, timeouts hierarchy, ...).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arachne/v1/controller.pb.h"
#include "controller/controller_config.h"
#include "fuzz/fuzz_checks.h"
#include "google/protobuf/stubs/logging.h"
#include "planner_service/io/config_file.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"

namespace {

const arachne::GpuCatalog& Catalog() {
  static const auto* const catalog =
      new arachne::GpuCatalog(*arachne::LoadGpuCatalog());
  return *catalog;
}

const std::vector<arachne::ModelSpec>& Models() {
  static const auto* const models =
      new std::vector<arachne::ModelSpec>(*arachne::LoadModelCatalog());
  return *models;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Protobuf logs every string field that is not UTF-8 before refusing it:
  // noise, and slower fuzzing.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(
        [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
    return true;
  }();
  (void)quiet;
  arachne::v1::JobSpec spec;
  absl::Status parsed = arachne::ParseConfigText(
      arachne::fuzz::AsText(data, size), "job.yaml", &spec);
  arachne::fuzz::CheckInputError(parsed, "ParseConfigText(JobSpec)");
  if (!parsed.ok()) return 0;
  arachne::fuzz::CheckInputError(
      arachne::controller::ResolveJob(spec, "job.yaml", Catalog(), Models())
          .status(),
      "ResolveJob");
  return 0;
}
