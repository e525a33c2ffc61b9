#include "planner_service/io/data_files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {

// Defined in the generated embedded-profiles library.
std::string_view EmbeddedProfileFile(std::string_view path);
std::vector<std::string_view> EmbeddedProfileFileNames();

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("file not found: ", path));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  // Read at most one byte past the limit: a huge or endless file (a
  // device such as /dev/zero, a FIFO that never closes after sending
  // that much) is refused without holding more than the limit.
  std::string text;
  char chunk[1 << 16];
  while (in && static_cast<int64_t>(text.size()) <= kMaxInputBytes) {
    in.read(chunk, sizeof(chunk));
    text.append(chunk, static_cast<size_t>(in.gcount()));
  }
  if (static_cast<int64_t>(text.size()) > kMaxInputBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is larger than the limit of ",
                     kMaxInputBytes, " bytes (16 MiB)"));
  }
  if (in.bad()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  return text;
}

absl::StatusOr<std::string> ReadDataFile(absl::string_view relative_path,
                                         const std::string& profiles_dir) {
  if (!profiles_dir.empty()) {
    std::filesystem::path p =
        std::filesystem::path(profiles_dir) / std::string(relative_path);
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) return ReadFileToString(p.string());
  }
  std::string_view embedded = EmbeddedProfileFile(
      std::string_view(relative_path.data(), relative_path.size()));
  if (embedded.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "data file \"", relative_path, "\" is neither in the profiles directory",
        profiles_dir.empty() ? "" : absl::StrCat(" ", profiles_dir),
        " nor built in"));
  }
  return std::string(embedded);
}

std::vector<std::string> ListDataFiles(absl::string_view prefix,
                                       const std::string& profiles_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!profiles_dir.empty() && std::filesystem::is_directory(profiles_dir, ec)) {
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(profiles_dir, ec)) {
      if (!entry.is_regular_file()) continue;
      std::string rel =
          std::filesystem::relative(entry.path(), profiles_dir).string();
      if (absl::StartsWith(rel, prefix)) out.push_back(rel);
    }
  } else {
    for (std::string_view name : EmbeddedProfileFileNames()) {
      if (absl::StartsWith(absl::string_view(name.data(), name.size()), prefix))
        out.emplace_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace arachne
