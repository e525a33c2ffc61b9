// Helpers shared by the .cc files that define JobController
// (controller.cc, controller_rpcs.cc, controller_reconcile.cc,
// controller_agent_polling.cc, controller_measurements.cc): internal to
// them, not part of controller.h's API. A helper one file alone uses stays
// in that file's anonymous namespace.
#ifndef ARACHNE_CONTROLLER_CONTROLLER_INTERNAL_H_
#define ARACHNE_CONTROLLER_CONTROLLER_INTERNAL_H_

#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace arachne::controller {

inline double UnixSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

// The plan file's templates without the per-stage memory figures, which
// differ with the cluster they were priced on: what "the same plan" means.
inline nlohmann::json TemplatesOf(const nlohmann::json& plan) {
  nlohmann::json t = plan.value("templates", nlohmann::json::array());
  for (nlohmann::json& tmpl : t) {
    for (nlohmann::json& st : tmpl["stages"]) st.erase("memory_gib");
  }
  return t;
}

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_CONTROLLER_INTERNAL_H_
