#include "planner_service/io/config_file.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/message_json.h"

namespace arachne {

absl::Status ParseConfigText(absl::string_view text, absl::string_view source,
                             google::protobuf::Message* config) {
  config->Clear();
  if (absl::StatusOr<nlohmann::json> tree = ParseJsonOrYaml(text, source);
      tree.ok() && tree->is_null()) {
    return absl::OkStatus();
  }
  return ParseMessageText(text, source, config);
}

absl::Status LoadConfigFile(const std::string& path,
                            google::protobuf::Message* config) {
  std::error_code ec;
  absl::StatusOr<std::string> text = std::filesystem::is_directory(path, ec)
                                         ? absl::NotFoundError("a directory")
                                         : ReadFileToString(path);
  if (!text.ok()) {
    // Too big is the file's fault, worded by the reader; any other failure
    // is "cannot read".
    if (text.status().code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: ", text.status().message()));
    }
    return absl::NotFoundError(
        absl::StrCat("config: cannot read \"", path, "\""));
  }
  return ParseConfigText(*text, path, config);
}

}  // namespace arachne
