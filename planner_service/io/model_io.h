// Model catalog (profiles/models.yaml), model entries as JSON, and import of
// Hugging Face config.json files into core's ModelSpec.
#ifndef ARACHNE_PLANNER_SERVICE_IO_MODEL_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_MODEL_IO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "arachne/v1/planner.pb.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/model/model.h"

namespace arachne {

// Largest value of any model dimension a reader accepts (layers, hidden,
// heads, ffn, vocab, expert counts and widths, MLA ranks): 16,777,216, some
// 60x the largest in use (vocab ~256k), and small enough that products of
// two dimensions cannot overflow the integers the cost model computes in.
inline constexpr int kMaxModelDimension = 1 << 24;

// Resolves a catalog entry message (arachne.v1.Model, the shape of a
// `models:` row, see docs/formats.md): defaults for zero / empty fields,
// range checks, then ModelSpec::Validate (whose message is prefixed with
// source and path). Errors are InvalidArgument "<source>: <path>.<field>:
// ...". The one reader of model entries, for models.yaml and the service.
absl::StatusOr<ModelSpec> ModelFromMessage(const v1::Model& entry,
                                           absl::string_view source,
                                           absl::string_view path);

// Reads one catalog entry from a tree through the schema (unknown fields
// and wrong types are errors naming the field), then ModelFromMessage.
absl::StatusOr<ModelSpec> ModelFromJson(const nlohmann::json& entry,
                                        absl::string_view source,
                                        absl::string_view path);

// The catalog-entry form of `model` (omits defaults such as profile_name ==
// name); ModelFromJson(ModelToJson(m)) == m.
nlohmann::json ModelToJson(const ModelSpec& model);

// Parses a catalog file `models: [...]` (YAML or JSON) as an
// arachne.v1.ModelCatalog; duplicate names (case-insensitive) are errors.
absl::StatusOr<std::vector<ModelSpec>> ParseModelCatalog(
    absl::string_view text, absl::string_view source);

// Loads "models.yaml" from `profiles_dir` when given and present there, else
// the built-in copy.
absl::StatusOr<std::vector<ModelSpec>> LoadModelCatalog(
    const std::string& profiles_dir = "");

// Architectures ModelFromHfConfig understands, e.g. "LlamaForCausalLM".
const std::vector<std::string>& SupportedHfArchitectures();

// Converts a Hugging Face config.json to a ModelSpec named `name` (and
// profile_name `name`). Reads num_hidden_layers/n_layer, hidden_size/n_embd,
// num_attention_heads/n_head, num_key_value_heads (default: heads), head_dim
// (default: hidden / heads), intermediate_size/n_inner (default 4 * hidden
// for GPT models), vocab_size, tie_word_embeddings (default: the
// architecture's transformers default), and the MoE / MLA keys of Mixtral,
// Qwen3-MoE and DeepSeek-V3. Other keys are ignored (configs carry many that
// do not change the cost). Errors are InvalidArgument "<name>: ...": an
// unknown architecture (naming it and listing the supported ones), a missing
// required key (naming it), or a layout ModelSpec cannot express
// (e.g. interleaved dense/MoE layers via decoder_sparse_step > 1).
absl::StatusOr<ModelSpec> ModelFromHfConfig(const nlohmann::json& config,
                                            absl::string_view name);

// ModelFromHfConfig of a config.json text (strict JSON, within the limits of
// json_yaml.h), with errors prefixed by `source` and naming the position of
// a syntax error: "model.hf_config_json:1:9: invalid JSON: ...", or
// "model.hf_config_json: architectures: ...". For text that arrives in a
// request rather than a file.
absl::StatusOr<ModelSpec> ModelFromHfConfigText(absl::string_view text,
                                                absl::string_view name,
                                                absl::string_view source);

// Resolves a --model value: a catalog name (case-insensitive) first; else an
// existing file, read as a Hugging Face config.json (a directory holding
// config.json works too; the model is named after the file, or after its
// directory when the file is called config.json); else NotFound naming the
// value and listing the catalog names.
absl::StatusOr<ModelSpec> ResolveModel(absl::string_view name_or_path,
                                       const std::string& profiles_dir = "");

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_MODEL_IO_H_
