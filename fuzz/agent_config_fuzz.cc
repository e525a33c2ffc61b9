// arachne-agent's config file (worker_agent/agent_config.h): any bytes are
// a precise error or an AgentConfig.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_checks.h"
#include "worker_agent/agent_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<arachne::v1::AgentConfig> config =
      arachne::agent::ParseAgentConfig(arachne::fuzz::AsText(data, size),
                                       "agent.yaml");
  arachne::fuzz::CheckInputError(config.status(), "ParseAgentConfig");
  return 0;
}
