// EngineConfig's check, apart from the LibTorch engine: the controller's
// job file reader (and its fuzz target) use it without linking LibTorch.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

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
  // The schedule and clipping: the same checks and words as arachne_torch's
  // (python/arachne_torch/job.py). Iteration counts as integers (a double
  // would print 1000000001 as 1e+09).
  auto bad_count = [](absl::string_view field, int v, absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.", field, ": must be ", want, ", got ", v));
  };
  const bool cosine = lr_schedule == "cosine";
  if (!cosine && lr_schedule != "constant") {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine.lr_schedule: must be \"constant\" or \"cosine\", got \"",
        lr_schedule.substr(0, 64), lr_schedule.size() > 64 ? "...\"" : "\""));
  }
  if (cosine) {
    if (decay_iterations <= warmup_iterations) {
      return bad_count("decay_iterations", decay_iterations,
                       absl::StrCat("> warmup_iterations (",
                                    warmup_iterations,
                                    ") with lr_schedule \"cosine\""));
    }
    if (decay_iterations > kMaxDecayIterations) {
      return bad_count("decay_iterations", decay_iterations,
                       absl::StrCat("<= ", kMaxDecayIterations));
    }
    if (!(min_learning_rate >= 0 && min_learning_rate <= learning_rate)) {
      return bad("min_learning_rate", min_learning_rate,
                 absl::StrCat("in [0, learning_rate (", learning_rate, ")]"));
    }
  } else {
    if (decay_iterations != 0) {
      return bad_count("decay_iterations", decay_iterations,
                       "0 (unset) unless lr_schedule is \"cosine\"");
    }
    if (min_learning_rate != 0) {
      return bad("min_learning_rate", min_learning_rate,
                 "0 (unset) unless lr_schedule is \"cosine\"");
    }
  }
  if (!(grad_clip_norm >= 0 && grad_clip_norm <= kMaxGradClipNorm)) {
    return bad("grad_clip_norm", grad_clip_norm,
               "0 (off) or a finite number in (0, 1000000]");
  }
  if (token_file.has_value()) {
    // The same checks and words as arachne_torch's (python/arachne_torch/
    // job.py), so either side refuses a bad file field the same way.
    const std::string& path = token_file->path;
    auto bad_path = [](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("engine.token_file.path: ", why));
    };
    if (path.empty()) return bad_path("required (an absolute path), got none");
    if (path.size() > kMaxTokenFilePath) {
      return bad_path(absl::StrCat("at most ", kMaxTokenFilePath,
                                   " bytes, got ", path.size(), " bytes (\"",
                                   path.substr(0, 64), "...\")"));
    }
    if (path.find('\0') != std::string::npos) {
      return bad_path("must not contain a NUL byte");
    }
    if (path[0] != '/') {
      return bad_path(absl::StrCat("must be an absolute path, got \"", path,
                                   "\""));
    }
    if (token_file->token_bytes != 2 && token_file->token_bytes != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "engine.token_file.token_bytes: must be 2 (uint16) or 4 (uint32), "
          "got ", token_file->token_bytes));
    }
  }
  return absl::OkStatus();
}

double EngineConfig::LearningRateAt(int64_t step) const {
  const double t = static_cast<double>(step);
  if (t < warmup_iterations || lr_schedule != "cosine") {
    return learning_rate * std::min(1.0, t / std::max(1, warmup_iterations));
  }
  if (t >= decay_iterations) return min_learning_rate;
  const double progress = (t - warmup_iterations) /
                          static_cast<double>(decay_iterations - warmup_iterations);
  return min_learning_rate + 0.5 * (learning_rate - min_learning_rate) *
                                 (1.0 + std::cos(std::numbers::pi * progress));
}

double EngineConfig::ClipScale(double norm) const {
  if (grad_clip_norm <= 0) return 1.0;
  return std::min(1.0, grad_clip_norm / (norm + 1e-6));
}

}  // namespace arachne::agent
