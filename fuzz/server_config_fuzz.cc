// arachne-planner's config file (server_config.h, planner_service/io/
// config_file.h): any bytes are a precise error or a ServerConfig.
// ResolveServerConfig is left out: it reads the files the config names.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_checks.h"
#include "planner_service/server/server_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<arachne::v1::ServerConfig> config = arachne::ParseServerConfig(
      arachne::fuzz::AsText(data, size), "planner.yaml");
  arachne::fuzz::CheckInputError(config.status(), "ParseServerConfig");
  return 0;
}
