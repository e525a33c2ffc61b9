// One CSV line split into fields (RFC 4180 quoting: "a,b" and "" escapes),
// each stripped of surrounding whitespace. Shared by the profile files and
// the calibration input.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_COST_CSV_H_
#define ARACHNE_PLANNER_SERVICE_CORE_COST_CSV_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace arachne {

std::vector<std::string> SplitCsvLine(absl::string_view line);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_COST_CSV_H_
