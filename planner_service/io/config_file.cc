#include "planner_service/io/config_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
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
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("config: cannot read \"", path, "\""));
  }
  return ParseConfigText(buffer.str(), path, config);
}

}  // namespace arachne
