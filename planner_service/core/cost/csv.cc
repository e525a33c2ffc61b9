#include "planner_service/core/cost/csv.h"

#include "absl/strings/ascii.h"

namespace arachne {

std::vector<std::string> SplitCsvLine(absl::string_view line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur.push_back('"');
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur.push_back(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back(absl::StripAsciiWhitespace(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.emplace_back(absl::StripAsciiWhitespace(cur));
  return out;
}

}  // namespace arachne
