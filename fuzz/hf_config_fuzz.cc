// Hugging Face config.json import (model_io.h) as the planning service
// meets it: the text of a request's model.hf_config_json, resolved by
// ResolveModelRef (planner_handler_impl.h), and the same text through the
// file reader (ParseJsonOrYaml + ModelFromHfConfig), as `arachne plan
// --model config.json` reads it.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_checks.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/model_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text = arachne::fuzz::AsText(data, size);
  arachne::ModelRef ref;
  ref.name = "fuzz";
  ref.hf_config_json = std::string(text);
  static const std::vector<arachne::ModelSpec>* const catalog =
      new std::vector<arachne::ModelSpec>(*arachne::LoadModelCatalog());
  if (!ref.hf_config_json.empty()) {
    absl::StatusOr<arachne::ModelSpec> m =
        arachne::ResolveModelRef(ref, *catalog);
    arachne::fuzz::CheckInputError(m.status(), "ResolveModelRef");
  }
  absl::StatusOr<nlohmann::json> tree =
      arachne::ParseJsonOrYaml(text, "config.json");
  arachne::fuzz::CheckInputError(tree.status(), "ParseJsonOrYaml");
  if (tree.ok()) {
    absl::StatusOr<arachne::ModelSpec> m =
        arachne::ModelFromHfConfig(*tree, "fuzz");
    arachne::fuzz::CheckInputError(m.status(), "ModelFromHfConfig");
  }
  return 0;
}
