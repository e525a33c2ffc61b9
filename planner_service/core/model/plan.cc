#include "planner_service/core/model/plan.h"

#include <algorithm>

namespace arachne {

bool GroupsStayInNode(const Template& t, int s, int group) {
  const int tp = t.stages[s].tp;
  if (group <= tp) return tp % group == 0;
  const int total = tp * t.replicas;
  for (int begin = 0; begin < total; begin += group) {
    const int first_replica = begin / tp;
    const int last_replica = (std::min(total, begin + group) - 1) / tp;
    const int node = t.at(first_replica, s).node;
    for (int r = first_replica + 1; r <= last_replica; ++r) {
      if (t.at(r, s).node != node) return false;
    }
  }
  return true;
}

}  // namespace arachne
