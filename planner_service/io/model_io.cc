#include "planner_service/io/model_io.h"

#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/message_json.h"

namespace arachne {
namespace {

using Json = nlohmann::json;

absl::Status Prefixed(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

// head_dim default shared by the catalog and HF import.
absl::StatusOr<int> DefaultHeadDim(const ObjectReader& r,
                                   absl::string_view hidden_key, int hidden,
                                   int heads) {
  if (hidden % heads != 0) {
    return r.Error(hidden_key,
                   absl::StrCat(hidden, " is not divisible by the ", heads,
                                " heads; give head_dim explicitly"));
  }
  return hidden / heads;
}

// ---------------------------------------------------------------------------
// Hugging Face config.json import.

enum class HfFamily { kLlamaLike, kMixtral, kQwen3Moe, kGpt, kDeepseekV3 };

const std::vector<std::pair<std::string, HfFamily>>& HfArchitectureTable() {
  static const auto* const kTable =
      new std::vector<std::pair<std::string, HfFamily>>{
          {"LlamaForCausalLM", HfFamily::kLlamaLike},
          {"MistralForCausalLM", HfFamily::kLlamaLike},
          {"MixtralForCausalLM", HfFamily::kMixtral},
          {"Qwen2ForCausalLM", HfFamily::kLlamaLike},
          {"Qwen3ForCausalLM", HfFamily::kLlamaLike},
          {"Qwen3MoeForCausalLM", HfFamily::kQwen3Moe},
          {"GPTNeoForCausalLM", HfFamily::kGpt},
          {"GPT2LMHeadModel", HfFamily::kGpt},
          {"DeepseekV3ForCausalLM", HfFamily::kDeepseekV3},
      };
  return *kTable;
}

// Reads an HF config with key-name alternatives (GPT-2 says n_layer where
// Llama says num_hidden_layers). Errors name the key as the config spells
// it: "missing required key \"hidden_size\" (or \"n_embd\")".
class HfReader {
 public:
  explicit HfReader(const ObjectReader& r) : r_(r) {}

  // The first present key of `keys`, or "" when none is.
  std::string FirstPresent(
      std::initializer_list<absl::string_view> keys) const {
    for (absl::string_view k : keys) {
      if (r_.Has(k)) return std::string(k);
    }
    return "";
  }

  absl::Status Missing(std::initializer_list<absl::string_view> keys) const {
    std::vector<std::string> quoted;
    for (absl::string_view k : keys)
      quoted.push_back(absl::StrCat("\"", k, "\""));
    std::string msg = absl::StrCat("missing required key ", quoted[0]);
    if (quoted.size() > 1) {
      absl::StrAppend(&msg, " (or ",
                      absl::StrJoin(quoted.begin() + 1, quoted.end(), " or "),
                      ")");
    }
    return FieldError(r_.source(), "", msg);
  }

  absl::StatusOr<int> RequiredInt(std::initializer_list<absl::string_view> keys,
                                  int min = 1) const {
    std::string key = FirstPresent(keys);
    if (key.empty()) return Missing(keys);
    return r_.Int(key, min, kMaxModelDimension);
  }

  absl::StatusOr<int> OptionalInt(std::initializer_list<absl::string_view> keys,
                                  int fallback, int min = 1) const {
    std::string key = FirstPresent(keys);
    if (key.empty()) return fallback;
    return r_.Int(key, min, kMaxModelDimension);
  }

  const ObjectReader& reader() const { return r_; }

 private:
  const ObjectReader& r_;
};

absl::StatusOr<ModelSpec> ModelFromHfConfigImpl(const Json& config,
                                                absl::string_view name,
                                                absl::string_view source) {
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader r,
                              ObjectReader::Create(config, source, ""));
  HfReader hf(r);
  // --- architecture
  if (!r.Has("architectures")) return hf.Missing({"architectures"});
  ARACHNE_IO_ASSIGN_OR_RETURN(std::vector<std::string> archs,
                              r.StringListOr("architectures"));
  if (archs.empty()) {
    return r.Error("architectures", "must list at least one architecture");
  }
  const std::string& arch = archs[0];
  std::vector<std::string> supported;
  const HfFamily* family = nullptr;
  for (const auto& [a, f] : HfArchitectureTable()) {
    supported.push_back(a);
    if (a == arch) family = &f;
  }
  if (family == nullptr) {
    return r.Error(
        "architectures",
        absl::StrCat("unsupported architecture ", QuoteForMessage(arch),
                     "; supported: ", absl::StrJoin(supported, ", ")));
  }
  const bool gpt = *family == HfFamily::kGpt;

  ModelSpec m;
  m.name = std::string(name);
  m.profile_name = m.name;
  m.architecture = arch;
  m.mlp = gpt ? MlpKind::kGelu : MlpKind::kSwiGlu;

  // --- common dimensions
  ARACHNE_IO_ASSIGN_OR_RETURN(
      m.num_layers,
      hf.RequiredInt({"num_hidden_layers", "n_layer", "num_layers"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(m.hidden,
                              hf.RequiredInt({"hidden_size", "n_embd"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(
      m.num_heads,
      hf.RequiredInt({"num_attention_heads", "n_head", "num_heads"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(
      m.num_kv_heads, hf.OptionalInt({"num_key_value_heads"}, m.num_heads));
  ARACHNE_IO_ASSIGN_OR_RETURN(
      int64_t vocab, r.Has("vocab_size")
                         ? r.Int("vocab_size", 1, kMaxModelDimension)
                         : absl::StatusOr<int>(hf.Missing({"vocab_size"})));
  m.vocab = vocab;
  // transformers' defaults: PretrainedConfig ties (GPT-2, GPT-Neo); the Llama
  // family and DeepSeek configs untie.
  ARACHNE_IO_ASSIGN_OR_RETURN(m.tied_embeddings,
                              r.BoolOr("tie_word_embeddings", gpt));
  if (gpt) {
    // n_inner / intermediate_size are null in GPT-2 / GPT-Neo configs: 4h
    // (m.hidden <= kMaxModelDimension, so 4h fits an int).
    ARACHNE_IO_ASSIGN_OR_RETURN(
        m.ffn, hf.OptionalInt({"n_inner", "intermediate_size"}, 4 * m.hidden));
  } else {
    ARACHNE_IO_ASSIGN_OR_RETURN(m.ffn, hf.RequiredInt({"intermediate_size"}));
  }

  // --- attention
  if (*family == HfFamily::kDeepseekV3) {
    m.attention = AttentionKind::kMla;
    ARACHNE_IO_ASSIGN_OR_RETURN(m.mla.q_lora_rank,
                                hf.OptionalInt({"q_lora_rank"}, 0, 0));
    ARACHNE_IO_ASSIGN_OR_RETURN(m.mla.kv_lora_rank,
                                hf.RequiredInt({"kv_lora_rank"}));
    ARACHNE_IO_ASSIGN_OR_RETURN(m.mla.qk_nope_head_dim,
                                hf.RequiredInt({"qk_nope_head_dim"}, 0));
    ARACHNE_IO_ASSIGN_OR_RETURN(m.mla.qk_rope_head_dim,
                                hf.RequiredInt({"qk_rope_head_dim"}, 0));
    ARACHNE_IO_ASSIGN_OR_RETURN(m.mla.v_head_dim,
                                hf.RequiredInt({"v_head_dim"}));
    // The query/key head width (what attention scores are computed over).
    m.head_dim = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim;
  } else if (r.Has("head_dim")) {
    ARACHNE_IO_ASSIGN_OR_RETURN(m.head_dim,
                                r.Int("head_dim", 1, kMaxModelDimension));
  } else {
    ARACHNE_IO_ASSIGN_OR_RETURN(
        m.head_dim,
        DefaultHeadDim(r, hf.FirstPresent({"hidden_size", "n_embd"}), m.hidden,
                       m.num_heads));
  }

  // --- mixture of experts
  switch (*family) {
    case HfFamily::kMixtral: {
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.num_experts,
                                  hf.RequiredInt({"num_local_experts"}));
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.top_k,
                                  hf.RequiredInt({"num_experts_per_tok"}));
      // Mixtral's experts are full-width MLPs.
      m.moe.expert_ffn = m.ffn;
      break;
    }
    case HfFamily::kQwen3Moe: {
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.num_experts,
                                  hf.RequiredInt({"num_experts"}));
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.top_k,
                                  hf.RequiredInt({"num_experts_per_tok"}));
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.expert_ffn,
                                  hf.RequiredInt({"moe_intermediate_size"}));
      ARACHNE_IO_ASSIGN_OR_RETURN(int step,
                                  hf.OptionalInt({"decoder_sparse_step"}, 1));
      if (step != 1) {
        return r.Error("decoder_sparse_step",
                       absl::StrCat("unsupported value ", step,
                                    ": interleaved dense and MoE layers cannot "
                                    "be modelled; only 1 (every layer MoE)"));
      }
      // mlp_only_layers lists dense layers; only a leading run 0..k-1 maps
      // onto ModelSpec (dense_first_layers = k).
      ARACHNE_IO_ASSIGN_OR_RETURN(const Json* dense,
                                  r.ArrayOr("mlp_only_layers"));
      for (int i = 0; i < static_cast<int>(dense->size()); ++i) {
        if (!(*dense)[i].is_number_integer() ||
            (*dense)[i].get<int64_t>() != i) {
          return r.Error(
              "mlp_only_layers",
              absl::StrCat("unsupported value ", DescribeJsonValue(*dense),
                           ": only a leading run of dense layers "
                           "[0, 1, ..., k-1] can be modelled"));
        }
      }
      m.moe.dense_first_layers = static_cast<int>(dense->size());
      break;
    }
    case HfFamily::kDeepseekV3: {
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.num_experts,
                                  hf.RequiredInt({"n_routed_experts"}));
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.top_k,
                                  hf.RequiredInt({"num_experts_per_tok"}));
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.expert_ffn,
                                  hf.RequiredInt({"moe_intermediate_size"}));
      ARACHNE_IO_ASSIGN_OR_RETURN(m.moe.shared_experts,
                                  hf.OptionalInt({"n_shared_experts"}, 0, 0));
      // transformers builds the shared experts as one MLP of width
      // moe_intermediate_size * n_shared_experts: the same parameters as
      // n_shared_experts experts of width moe_intermediate_size.
      m.moe.shared_expert_ffn = m.moe.shared_experts > 0 ? m.moe.expert_ffn : 0;
      ARACHNE_IO_ASSIGN_OR_RETURN(
          m.moe.dense_first_layers,
          hf.OptionalInt({"first_k_dense_replace"}, 0, 0));
      ARACHNE_IO_ASSIGN_OR_RETURN(int freq,
                                  hf.OptionalInt({"moe_layer_freq"}, 1));
      if (freq != 1) {
        return r.Error("moe_layer_freq",
                       absl::StrCat("unsupported value ", freq,
                                    ": interleaved dense and MoE layers cannot "
                                    "be modelled; only 1"));
      }
      break;
    }
    case HfFamily::kLlamaLike:
    case HfFamily::kGpt:
      break;
  }

  if (absl::Status s = m.Validate(); !s.ok()) return Prefixed(s, source);
  return m;
}

std::string ModelNameFromPath(const std::filesystem::path& file) {
  std::string stem = file.stem().string();
  if (stem == "config") {
    std::string dir = file.parent_path().filename().string();
    if (!dir.empty() && dir != "." && dir != "..") return dir;
  }
  return stem;
}

}  // namespace

absl::StatusOr<ModelSpec> ModelFromMessage(const v1::Model& e,
                                           absl::string_view source,
                                           absl::string_view path) {
  const MessageErrors errors(source, path);
  ModelSpec m;
  if (e.name().empty()) return errors.At("name", "must not be empty");
  m.name = e.name();
  m.architecture = e.architecture();
  m.profile_name = e.profile_name().empty() ? m.name : e.profile_name();
  m.policy_relative = e.policy_relative();
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"num_layers", e.num_layers()},
        {"hidden", e.hidden()},
        {"num_heads", e.num_heads()},
        {"vocab", e.vocab()}}) {
    ARACHNE_IO_RETURN_IF_ERROR(
        errors.IntInRange(field, value, 1, kMaxModelDimension));
  }
  ARACHNE_IO_RETURN_IF_ERROR(errors.IntInRange("num_kv_heads", e.num_kv_heads(),
                                               0, kMaxModelDimension));
  ARACHNE_IO_RETURN_IF_ERROR(
      errors.IntInRange("head_dim", e.head_dim(), 0, kMaxModelDimension));
  ARACHNE_IO_RETURN_IF_ERROR(
      errors.IntInRange("ffn", e.ffn(), 0, kMaxModelDimension));
  m.num_layers = e.num_layers();
  m.hidden = e.hidden();
  m.num_heads = e.num_heads();
  m.vocab = e.vocab();
  m.num_kv_heads = e.num_kv_heads() == 0 ? m.num_heads : e.num_kv_heads();
  if (e.head_dim() != 0) {
    m.head_dim = e.head_dim();
  } else if (m.hidden % m.num_heads != 0) {
    return errors.At("hidden",
                     absl::StrCat(m.hidden, " is not divisible by the ",
                                  m.num_heads,
                                  " heads; give head_dim explicitly"));
  } else {
    m.head_dim = m.hidden / m.num_heads;
  }
  m.ffn = e.ffn();

  if (e.mlp().empty() || e.mlp() == "swiglu") {
    m.mlp = MlpKind::kSwiGlu;
  } else if (e.mlp() == "gelu") {
    m.mlp = MlpKind::kGelu;
  } else {
    return errors.At("mlp", absl::StrCat("must be swiglu or gelu, got ",
                                         QuoteForMessage(e.mlp())));
  }
  if (e.attention().empty() || e.attention() == "gqa") {
    m.attention = AttentionKind::kGqa;
  } else if (e.attention() == "mla") {
    m.attention = AttentionKind::kMla;
  } else {
    return errors.At("attention", absl::StrCat("must be gqa or mla, got ",
                                               QuoteForMessage(e.attention())));
  }
  m.tied_embeddings = e.tied_embeddings();
  if (e.has_moe()) {
    const v1::MoeSpec& moe = e.moe();
    const MessageErrors me = errors.Under("moe");
    ARACHNE_IO_RETURN_IF_ERROR(
        me.IntInRange("num_experts", moe.num_experts(), 1, kMaxModelDimension));
    ARACHNE_IO_RETURN_IF_ERROR(
        me.IntInRange("top_k", moe.top_k(), 1, kMaxModelDimension));
    if (moe.top_k() > moe.num_experts()) {
      return me.At("top_k", absl::StrCat("must be an integer <= ",
                                         moe.num_experts(), ", got ",
                                         moe.top_k()));
    }
    ARACHNE_IO_RETURN_IF_ERROR(
        me.IntInRange("expert_ffn", moe.expert_ffn(), 1, kMaxModelDimension));
    ARACHNE_IO_RETURN_IF_ERROR(me.IntInRange(
        "shared_experts", moe.shared_experts(), 0, kMaxModelDimension));
    ARACHNE_IO_RETURN_IF_ERROR(me.IntInRange(
        "shared_expert_ffn", moe.shared_expert_ffn(), 0, kMaxModelDimension));
    ARACHNE_IO_RETURN_IF_ERROR(me.IntInRange(
        "dense_first_layers", moe.dense_first_layers(), 0, kMaxModelDimension));
    m.moe.num_experts = moe.num_experts();
    m.moe.top_k = moe.top_k();
    m.moe.expert_ffn = moe.expert_ffn();
    m.moe.shared_experts = moe.shared_experts();
    m.moe.shared_expert_ffn = moe.shared_expert_ffn();
    m.moe.dense_first_layers = moe.dense_first_layers();
  }
  if (m.attention == AttentionKind::kMla) {
    if (!e.has_mla()) return errors.At("mla", "required when attention is mla");
    const v1::MlaSpec& mla = e.mla();
    const MessageErrors me = errors.Under("mla");
    ARACHNE_IO_RETURN_IF_ERROR(
        me.IntInRange("q_lora_rank", mla.q_lora_rank(), 0, kMaxModelDimension));
    ARACHNE_IO_RETURN_IF_ERROR(me.IntInRange("kv_lora_rank", mla.kv_lora_rank(),
                                             1, kMaxModelDimension));
    ARACHNE_IO_RETURN_IF_ERROR(me.IntInRange(
        "qk_nope_head_dim", mla.qk_nope_head_dim(), 0, kMaxModelDimension));
    ARACHNE_IO_RETURN_IF_ERROR(me.IntInRange(
        "qk_rope_head_dim", mla.qk_rope_head_dim(), 0, kMaxModelDimension));
    ARACHNE_IO_RETURN_IF_ERROR(
        me.IntInRange("v_head_dim", mla.v_head_dim(), 1, kMaxModelDimension));
    m.mla.q_lora_rank = mla.q_lora_rank();
    m.mla.kv_lora_rank = mla.kv_lora_rank();
    m.mla.qk_nope_head_dim = mla.qk_nope_head_dim();
    m.mla.qk_rope_head_dim = mla.qk_rope_head_dim();
    m.mla.v_head_dim = mla.v_head_dim();
  } else if (e.has_mla()) {
    return errors.At("mla", "only allowed with attention: mla");
  }
  if (absl::Status s = m.Validate(); !s.ok()) {
    return Prefixed(s, path.empty() ? std::string(source)
                                    : absl::StrCat(source, ": ", path));
  }
  return m;
}

absl::StatusOr<ModelSpec> ModelFromJson(const nlohmann::json& entry,
                                        absl::string_view source,
                                        absl::string_view path) {
  v1::Model message;
  ARACHNE_IO_RETURN_IF_ERROR(MessageFromJson(entry, source, path, &message));
  return ModelFromMessage(message, source, path);
}

nlohmann::json ModelToJson(const ModelSpec& m) {
  Json j;
  j["name"] = m.name;
  if (!m.architecture.empty()) j["architecture"] = m.architecture;
  if (m.profile_name != m.name) j["profile_name"] = m.profile_name;
  if (!m.policy_relative.empty()) j["policy_relative"] = m.policy_relative;
  j["num_layers"] = m.num_layers;
  j["hidden"] = m.hidden;
  j["num_heads"] = m.num_heads;
  j["num_kv_heads"] = m.num_kv_heads;
  j["head_dim"] = m.head_dim;
  j["ffn"] = m.ffn;
  j["vocab"] = m.vocab;
  j["mlp"] = std::string(MlpKindName(m.mlp));
  j["attention"] = m.attention == AttentionKind::kMla ? "mla" : "gqa";
  j["tied_embeddings"] = m.tied_embeddings;
  if (m.is_moe()) {
    j["moe"] = Json{{"num_experts", m.moe.num_experts},
                    {"top_k", m.moe.top_k},
                    {"expert_ffn", m.moe.expert_ffn},
                    {"shared_experts", m.moe.shared_experts},
                    {"shared_expert_ffn", m.moe.shared_expert_ffn},
                    {"dense_first_layers", m.moe.dense_first_layers}};
  }
  if (m.attention == AttentionKind::kMla) {
    j["mla"] = Json{{"q_lora_rank", m.mla.q_lora_rank},
                    {"kv_lora_rank", m.mla.kv_lora_rank},
                    {"qk_nope_head_dim", m.mla.qk_nope_head_dim},
                    {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                    {"v_head_dim", m.mla.v_head_dim}};
  }
  return j;
}

absl::StatusOr<std::vector<ModelSpec>> ParseModelCatalog(
    absl::string_view text, absl::string_view source) {
  v1::ModelCatalog catalog;
  ARACHNE_IO_RETURN_IF_ERROR(ParseMessageText(text, source, &catalog));
  std::vector<ModelSpec> models;
  absl::flat_hash_map<std::string, int> index_by_lower_name;
  for (int i = 0; i < catalog.models_size(); ++i) {
    const std::string path = IndexFieldPath("models", i);
    ARACHNE_IO_ASSIGN_OR_RETURN(
        ModelSpec m, ModelFromMessage(catalog.models(i), source, path));
    auto [it, inserted] =
        index_by_lower_name.emplace(absl::AsciiStrToLower(m.name), i);
    if (!inserted) {
      return FieldError(source, JoinFieldPath(path, "name"),
                        absl::StrCat("duplicate model name \"", m.name,
                                     "\" (also models[", it->second, "])"));
    }
    models.push_back(std::move(m));
  }
  return models;
}

absl::StatusOr<std::vector<ModelSpec>> LoadModelCatalog(
    const std::string& profiles_dir) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text,
                              ReadDataFile("models.yaml", profiles_dir));
  return ParseModelCatalog(text, "models.yaml");
}

const std::vector<std::string>& SupportedHfArchitectures() {
  static const auto* const kNames = [] {
    auto* names = new std::vector<std::string>;
    for (const auto& [a, f] : HfArchitectureTable()) names->push_back(a);
    return names;
  }();
  return *kNames;
}

absl::StatusOr<ModelSpec> ModelFromHfConfig(const nlohmann::json& config,
                                            absl::string_view name) {
  return ModelFromHfConfigImpl(config, name, name);
}

absl::StatusOr<ModelSpec> ModelFromHfConfigText(absl::string_view text,
                                                absl::string_view name,
                                                absl::string_view source) {
  ARACHNE_IO_ASSIGN_OR_RETURN(Json config, ParseJsonText(text, source));
  return ModelFromHfConfigImpl(config, name, source);
}

absl::StatusOr<ModelSpec> ResolveModel(absl::string_view name_or_path,
                                       const std::string& profiles_dir) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::vector<ModelSpec> catalog,
                              LoadModelCatalog(profiles_dir));
  const std::string lower = absl::AsciiStrToLower(name_or_path);
  for (ModelSpec& m : catalog) {
    if (absl::AsciiStrToLower(m.name) == lower) return std::move(m);
  }
  std::filesystem::path path{std::string(name_or_path)};
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) &&
      std::filesystem::is_regular_file(path / "config.json", ec)) {
    path /= "config.json";
  }
  if (!name_or_path.empty() && std::filesystem::is_regular_file(path, ec)) {
    const std::string file = path.string();
    ARACHNE_IO_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
    ARACHNE_IO_ASSIGN_OR_RETURN(Json config, ParseJsonOrYaml(text, file));
    return ModelFromHfConfigImpl(config, ModelNameFromPath(path), file);
  }
  std::vector<std::string> names;
  for (const ModelSpec& m : catalog) names.push_back(m.name);
  return absl::NotFoundError(absl::StrCat(
      "unknown model ", QuoteForMessage(name_or_path),
      ": neither a catalog model nor a Hugging Face config.json file; "
      "catalog models: ",
      absl::StrJoin(names, ", ")));
}

}  // namespace arachne
