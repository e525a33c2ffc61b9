// Settings files of Arachne's binaries (arachne-planner's ServerConfig,
// arachne-agent's AgentConfig): YAML or JSON read into a config message
// through the protobuf JSON mapping (message_json.h), so unknown fields,
// wrong types and out-of-range integers are errors naming the field and the
// value. Semantic checks stay with each binary's config code.
#ifndef ARACHNE_PLANNER_SERVICE_IO_CONFIG_FILE_H_
#define ARACHNE_PLANNER_SERVICE_IO_CONFIG_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace arachne {

// Parses `text` read from `source` into `config` (cleared first). A text
// with nothing but comments (every setting commented out, as an example
// may be) means all defaults, not an error. Errors as ParseMessageText.
absl::Status ParseConfigText(absl::string_view text, absl::string_view source,
                             google::protobuf::Message* config);

// ParseConfigText of the file at `path` (named by its path in errors);
// NotFound "config: cannot read \"<path>\"" when it cannot be read,
// InvalidArgument "config: <path>: file is larger than the limit ..." when
// it holds more than kMaxInputBytes (json_yaml.h).
absl::Status LoadConfigFile(const std::string& path,
                            google::protobuf::Message* config);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_CONFIG_FILE_H_
