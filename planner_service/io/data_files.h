// Access to the shipped data files under profiles/ (GPU catalog, model
// catalog, calibration, profile files). By default they are read from the
// copy compiled into the binary; a profiles directory given by the user
// (--profiles-dir) takes precedence file by file.
#ifndef ARACHNE_PLANNER_SERVICE_IO_DATA_FILES_H_
#define ARACHNE_PLANNER_SERVICE_IO_DATA_FILES_H_

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace arachne {

// Reads a whole file; NotFound / PermissionDenied naming the path, and
// InvalidArgument "<path>: file is larger than the limit of ..." beyond
// kMaxInputBytes (json_yaml.h), found after reading no more than that (so
// /dev/zero is an error, not an endless read).
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Reads `relative_path` (e.g. "gpus.yaml") from `profiles_dir` when it is
// non-empty and holds the file, else from the embedded copy; NotFound when
// neither has it.
absl::StatusOr<std::string> ReadDataFile(absl::string_view relative_path,
                                         const std::string& profiles_dir = "");

// Relative paths of the data files under `prefix` (e.g. "measured/"), from
// `profiles_dir` when given and present, else from the embedded copy; sorted.
std::vector<std::string> ListDataFiles(absl::string_view prefix,
                                       const std::string& profiles_dir = "");

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_DATA_FILES_H_
