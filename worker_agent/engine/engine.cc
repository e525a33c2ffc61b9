// EngineConfig's check, apart from the LibTorch engine: the controller's
// job file reader (and its fuzz target) use it without linking LibTorch.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker_agent/engine/engine.h"

namespace arachne::agent {

absl::Status EngineConfig::Validate() const {
  auto bad = [](absl::string_view field, double v, absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.", field, ": must be ", want, ", got ", v));
  };
  if (!(learning_rate > 0) || !std::isfinite(learning_rate)) {
    return bad("learning_rate", learning_rate, "a finite number > 0");
  }
  if (warmup_iterations < 0) {
    return bad("warmup_iterations", warmup_iterations, ">= 0");
  }
  if (!(adam_beta1 >= 0 && adam_beta1 < 1)) {
    return bad("adam_beta1", adam_beta1, "in [0, 1)");
  }
  if (!(adam_beta2 >= 0 && adam_beta2 < 1)) {
    return bad("adam_beta2", adam_beta2, "in [0, 1)");
  }
  if (!(adam_eps > 0) || !std::isfinite(adam_eps)) {
    return bad("adam_eps", adam_eps, "a finite number > 0");
  }
  if (!(weight_decay >= 0) || !std::isfinite(weight_decay)) {
    return bad("weight_decay", weight_decay, "a finite number >= 0");
  }
  return absl::OkStatus();
}

}  // namespace arachne::agent
