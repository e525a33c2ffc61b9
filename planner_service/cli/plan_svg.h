// An SVG picture of a plan's structure: one band per template, one row per
// replica (the first few), one box per stage whose width is its share of
// the layers and whose colour is its GPU type.
#ifndef ARACHNE_PLANNER_SERVICE_CLI_PLAN_SVG_H_
#define ARACHNE_PLANNER_SERVICE_CLI_PLAN_SVG_H_

#include <string>

#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

std::string RenderPlanSvg(const Plan& plan, const Prediction& prediction,
                          const CostModel& cost_model);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CLI_PLAN_SVG_H_
