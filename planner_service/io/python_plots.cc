#include "planner_service/io/python_plots.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace arachne {

std::string PythonWithMatplotlib() {
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    const std::string probe =
        absl::StrCat(candidate, " -c 'import matplotlib' >/dev/null 2>&1");
    if (std::system(probe.c_str()) == 0) return candidate;
  }
  return "";
}

std::string ShellQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

}  // namespace arachne
