// Human-readable rendering of a priced plan.
#ifndef ARACHNE_PLANNER_SERVICE_CLI_PLAN_TABLE_H_
#define ARACHNE_PLANNER_SERVICE_CLI_PLAN_TABLE_H_

#include <string>

#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// Header (model, cluster, prediction, breakdown) and one table per template:
// stage, GPU type, TP, layers, memory per GPU, expert tiling, nodes.
std::string RenderPlanTable(const Plan& plan, const Prediction& prediction,
                            const CostModel& cost_model);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CLI_PLAN_TABLE_H_
