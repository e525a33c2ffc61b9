// Generated model shapes for training the model-conditioned policy (issue
// 17): decoder-only transformers, dense and mixture-of-experts, drawn around
// the catalog's range (0.5B to ~400B parameters) so that the policy sees
// shapes between and beyond the catalog's models, not only those.
// Deterministic for a seed; every shape passes ModelSpec::Validate and is
// planned on synthesized profiles (planning_context.h), like an imported
// config.json.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_MODEL_MODEL_GENERATOR_H_
#define ARACHNE_PLANNER_SERVICE_CORE_MODEL_MODEL_GENERATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner_service/core/model/model.h"

namespace arachne {

struct ModelGeneratorConfig {
  double moe_share = 0.35;  // share of MoE shapes
  int min_layers = 12;
  int max_layers = 96;
  int min_hidden = 1536;    // rounded to a multiple of 128 (head_dim)
  int max_hidden = 12288;
};

// `count` shapes named "<prefix><i>" (i from 0). InvalidArgument naming the
// field for count < 0 or a config outside its bounds (layers in [1, 1024],
// min <= max, hidden in [128, 65536], moe_share in [0, 1]).
absl::StatusOr<std::vector<ModelSpec>> GenerateModelShapes(
    const ModelGeneratorConfig& config, int count, uint64_t seed,
    const std::string& prefix = "generated-");

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_MODEL_MODEL_GENERATOR_H_
