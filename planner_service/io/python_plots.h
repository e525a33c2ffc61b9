// Running the project's matplotlib scripts (bench/plot_*.py) from C++: the
// plots are optional, so callers turn a missing interpreter into a note.
#ifndef ARACHNE_PLANNER_SERVICE_IO_PYTHON_PLOTS_H_
#define ARACHNE_PLANNER_SERVICE_IO_PYTHON_PLOTS_H_

#include <string>

namespace arachne {

// The first of /usr/bin/python3 and python3 (on PATH) that imports
// matplotlib, or "" when neither does. The system interpreter comes first:
// Debian's python3-matplotlib is invisible to a private python3 (pyenv, a
// venv) that may come first on PATH.
std::string PythonWithMatplotlib();

// `s` as one single-quoted shell word.
std::string ShellQuote(const std::string& s);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_PYTHON_PLOTS_H_
