#include "planner_service/io/model_io.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

const std::string kHfDir = std::string(ARACHNE_SOURCE_DIR) + "/test/data/hf/";

ModelSpec Catalog(const std::string& name) {
  absl::StatusOr<ModelSpec> m = ResolveModel(name);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : ModelSpec{};
}

Json HfConfig(const std::string& file) {
  absl::StatusOr<std::string> text = ReadFileToString(kHfDir + file);
  EXPECT_TRUE(text.ok()) << text.status();
  absl::StatusOr<Json> j = ParseJsonOrYaml(*text, file);
  EXPECT_TRUE(j.ok()) << j.status();
  return *j;
}

// Everything but name/profile_name/policy_relative: what decides cost.
void ExpectSameArchitecture(const ModelSpec& a, const ModelSpec& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.ffn, b.ffn);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.mlp, b.mlp);
  EXPECT_EQ(a.attention, b.attention);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.moe.num_experts, b.moe.num_experts);
  EXPECT_EQ(a.moe.top_k, b.moe.top_k);
  EXPECT_EQ(a.moe.expert_ffn, b.moe.expert_ffn);
  EXPECT_EQ(a.moe.shared_experts, b.moe.shared_experts);
  EXPECT_EQ(a.moe.shared_expert_ffn, b.moe.shared_expert_ffn);
  EXPECT_EQ(a.moe.dense_first_layers, b.moe.dense_first_layers);
  EXPECT_EQ(a.mla.q_lora_rank, b.mla.q_lora_rank);
  EXPECT_EQ(a.mla.kv_lora_rank, b.mla.kv_lora_rank);
  EXPECT_EQ(a.mla.qk_nope_head_dim, b.mla.qk_nope_head_dim);
  EXPECT_EQ(a.mla.qk_rope_head_dim, b.mla.qk_rope_head_dim);
  EXPECT_EQ(a.mla.v_head_dim, b.mla.v_head_dim);
}

TEST(ModelCatalogTest, HasTheCatalogModels) {
  absl::StatusOr<std::vector<ModelSpec>> models = LoadModelCatalog();
  ASSERT_TRUE(models.ok()) << models.status();
  std::vector<std::string> names;
  for (const ModelSpec& m : *models) {
    names.push_back(m.name);
    EXPECT_TRUE(m.Validate().ok()) << m.name;
    // Qwen3-64B is Qwen3-32B's block stacked 128 deep: it shares its
    // profiles (and its policy); every other model profiles itself.
    EXPECT_EQ(m.profile_name, m.name == "qwen3-64b" ? "qwen3-32b" : m.name);
  }
  EXPECT_THAT(names, ::testing::ElementsAre(
                         "llama3-8b", "llama3-70b", "qwen3-8b", "qwen3-32b",
                         "qwen3-64b", "qwen3-30b-a3b", "mixtral-8x7b",
                         "deepseek-v3", "gpt-neo-2.7b", "gpt3-175b",
                         "tiny-gpt", "tiny-moe"));
}

TEST(ModelCatalogTest, Qwen3_64bIsQwen3_32bTwiceAsDeep) {
  ModelSpec a = Catalog("qwen3-32b");
  ModelSpec b = Catalog("qwen3-64b");
  EXPECT_EQ(b.policy_relative, "qwen3-32b");
  EXPECT_EQ(b.num_layers, 128);
  b.num_layers = a.num_layers;
  ExpectSameArchitecture(a, b);
  EXPECT_EQ(a.num_heads * a.head_dim, 8192);  // q width != hidden
}

TEST(ModelCatalogTest, ParameterCountsMatchPublishedSizes) {
  auto near = [](const char* name, double want, double rel) {
    const double got = static_cast<double>(Catalog(name).TotalParams());
    EXPECT_NEAR(got, want, want * rel) << name << " has " << got;
  };
  near("llama3-8b", 8.03e9, 0.01);
  near("llama3-70b", 70.6e9, 0.01);
  near("qwen3-8b", 8.19e9, 0.01);
  near("qwen3-32b", 32.8e9, 0.01);
  near("mixtral-8x7b", 46.7e9, 0.01);
  near("qwen3-30b-a3b", 30.5e9, 0.01);
  near("deepseek-v3", 671e9, 0.03);
  near("gpt3-175b", 175e9, 0.02);
  near("gpt-neo-2.7b", 2.7e9, 0.03);
  // Active parameters of the MoE models (published: 12.9B, 3.3B, 37B).
  EXPECT_NEAR(static_cast<double>(Catalog("mixtral-8x7b").ActiveParams()),
              12.9e9, 12.9e9 * 0.02);
  EXPECT_NEAR(static_cast<double>(Catalog("qwen3-30b-a3b").ActiveParams()),
              3.3e9, 3.3e9 * 0.05);
  EXPECT_NEAR(static_cast<double>(Catalog("deepseek-v3").ActiveParams()), 37e9,
              37e9 * 0.05);
}

TEST(ModelCatalogTest, ModelToJsonRoundTrips) {
  const std::vector<ModelSpec> catalog = *LoadModelCatalog();
  for (const ModelSpec& m : catalog) {
    absl::StatusOr<ModelSpec> again = ModelFromJson(ModelToJson(m), "t", "m");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->name, m.name);
    EXPECT_EQ(again->profile_name, m.profile_name);
    EXPECT_EQ(again->policy_relative, m.policy_relative);
    ExpectSameArchitecture(*again, m);
  }
}

TEST(ModelCatalogTest, CatalogErrorsNamePath) {
  const std::string base =
      "models:\n"
      "  - {name: a, num_layers: 2, hidden: 64, num_heads: 4, ffn: 128, "
      "vocab: 100}\n";
  ASSERT_TRUE(ParseModelCatalog(base, "models.yaml").ok());
  absl::StatusOr<std::vector<ModelSpec>> r =
      ParseModelCatalog(base + base.substr(base.find('\n') + 1), "models.yaml");
  EXPECT_EQ(std::string(r.status().message()),
            "models.yaml: models[1].name: duplicate model name \"a\" (also "
            "models[0])");
  r = ParseModelCatalog(
      "models:\n  - {name: a, num_layers: 2, hidden: 64, num_heads: 4, "
      "ffn: 128, vocab: 100, moe: {num_experts: 4, top_k: 2, expert_ffn: 8, "
      "topk: 1}}\n",
      "models.yaml");
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("models.yaml: models[0].moe: unknown field \"topk\""));
  r = ParseModelCatalog(
      "models:\n  - {name: a, num_layers: 2, hidden: 64, num_heads: 4, "
      "num_kv_heads: 3, ffn: 128, vocab: 100}\n",
      "models.yaml");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("models.yaml: models[0]: "));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("num_kv_heads"));
  r = ParseModelCatalog(
      "models:\n  - {name: a, num_layers: 2, hidden: 64, num_heads: 4, "
      "ffn: 128, vocab: 100, mlp: relu}\n",
      "models.yaml");
  EXPECT_EQ(std::string(r.status().message()),
            "models.yaml: models[0].mlp: must be swiglu or gelu, got \"relu\"");
}

struct HfCase {
  const char* file;
  const char* catalog;
};

TEST(HfImportTest, ConfigsMatchCatalogEntries) {
  for (const HfCase& c :
       std::vector<HfCase>{{"llama3-8b.json", "llama3-8b"},
                           {"qwen3-8b.json", "qwen3-8b"},
                           {"qwen3-32b.json", "qwen3-32b"},
                           {"qwen3-30b-a3b.json", "qwen3-30b-a3b"},
                           {"mixtral-8x7b.json", "mixtral-8x7b"},
                           {"deepseek-v3.json", "deepseek-v3"},
                           {"gpt-neo-2.7b.json", "gpt-neo-2.7b"}}) {
    SCOPED_TRACE(c.file);
    absl::StatusOr<ModelSpec> m =
        ModelFromHfConfig(HfConfig(c.file), "imported");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->name, "imported");
    EXPECT_EQ(m->profile_name, "imported");
    ExpectSameArchitecture(*m, Catalog(c.catalog));
    EXPECT_EQ(m->TotalParams(), Catalog(c.catalog).TotalParams());
  }
}

TEST(HfImportTest, OtherArchitectures) {
  absl::StatusOr<ModelSpec> mistral =
      ModelFromHfConfig(HfConfig("mistral-7b.json"), "mistral-7b");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->architecture, "MistralForCausalLM");
  EXPECT_NEAR(static_cast<double>(mistral->TotalParams()), 7.24e9,
              7.24e9 * 0.01);

  absl::StatusOr<ModelSpec> qwen2 =
      ModelFromHfConfig(HfConfig("qwen2.5-7b.json"), "qwen2.5-7b");
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_EQ(qwen2->head_dim, 128);  // 3584 / 28
  EXPECT_EQ(qwen2->num_kv_heads, 4);
  EXPECT_FALSE(qwen2->tied_embeddings);
  // 7.62B published; Qwen2 q/k/v biases are not counted by core.
  EXPECT_NEAR(static_cast<double>(qwen2->TotalParams()), 7.62e9, 7.62e9 * 0.01);

  absl::StatusOr<ModelSpec> gpt2 =
      ModelFromHfConfig(HfConfig("gpt2-xl.json"), "gpt2-xl");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ(gpt2->mlp, MlpKind::kGelu);
  EXPECT_EQ(gpt2->num_layers, 48);
  EXPECT_EQ(gpt2->hidden, 1600);
  EXPECT_EQ(gpt2->num_heads, 25);
  EXPECT_EQ(gpt2->num_kv_heads, 25);
  EXPECT_EQ(gpt2->head_dim, 64);
  EXPECT_EQ(gpt2->ffn, 6400);  // n_inner null: 4h
  EXPECT_TRUE(gpt2->tied_embeddings);
  // 1.56B published, of which 1.6M are position embeddings (not counted).
  EXPECT_NEAR(static_cast<double>(gpt2->TotalParams()), 1.56e9, 1.56e9 * 0.01);
}

TEST(HfImportTest, UnknownArchitectureListsSupportedOnes) {
  Json config = HfConfig("llama3-8b.json");
  config["architectures"] = {"GemmaForCausalLM"};
  absl::StatusOr<ModelSpec> m = ModelFromHfConfig(config, "gemma");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("unsupported architecture \"GemmaForCausalLM\""));
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("LlamaForCausalLM, MistralForCausalLM"));
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("DeepseekV3ForCausalLM"));
  EXPECT_EQ(SupportedHfArchitectures().size(), 9u);
}

TEST(HfImportTest, MissingKeysAreNamed) {
  Json config = HfConfig("llama3-8b.json");
  config.erase("hidden_size");
  absl::StatusOr<ModelSpec> m = ModelFromHfConfig(config, "x");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(m.status().message()),
            "x: missing required key \"hidden_size\" (or \"n_embd\")");

  config = HfConfig("llama3-8b.json");
  config.erase("intermediate_size");
  EXPECT_EQ(std::string(ModelFromHfConfig(config, "x").status().message()),
            "x: missing required key \"intermediate_size\"");

  config = HfConfig("mixtral-8x7b.json");
  config.erase("num_local_experts");
  EXPECT_EQ(std::string(ModelFromHfConfig(config, "x").status().message()),
            "x: missing required key \"num_local_experts\"");

  config = HfConfig("llama3-8b.json");
  config.erase("architectures");
  EXPECT_EQ(std::string(ModelFromHfConfig(config, "x").status().message()),
            "x: missing required key \"architectures\"");

  config = HfConfig("llama3-8b.json");
  config["num_hidden_layers"] = "32";
  EXPECT_EQ(std::string(ModelFromHfConfig(config, "x").status().message()),
            "x: num_hidden_layers: must be an integer > 0, got \"32\"");
}

TEST(HfImportTest, KvHeadsAndHeadDimDefault) {
  Json config = HfConfig("llama3-8b.json");
  config.erase("num_key_value_heads");
  absl::StatusOr<ModelSpec> m = ModelFromHfConfig(config, "x");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_kv_heads, 32);
  EXPECT_EQ(m->head_dim, 128);
}

TEST(HfImportTest, Qwen3MoeLayoutLimits) {
  Json config = HfConfig("qwen3-30b-a3b.json");
  config["decoder_sparse_step"] = 2;
  absl::StatusOr<ModelSpec> m = ModelFromHfConfig(config, "x");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("x: decoder_sparse_step: unsupported value 2"));

  config = HfConfig("qwen3-30b-a3b.json");
  config["mlp_only_layers"] = {0, 1};
  m = ModelFromHfConfig(config, "x");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->moe.dense_first_layers, 2);
  EXPECT_EQ(m->ffn, 6144);

  config["mlp_only_layers"] = {3};
  m = ModelFromHfConfig(config, "x");
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("x: mlp_only_layers: unsupported value [3]"));
}

TEST(HfImportTest, DeepseekLayoutLimits) {
  Json config = HfConfig("deepseek-v3.json");
  config["moe_layer_freq"] = 2;
  EXPECT_THAT(std::string(ModelFromHfConfig(config, "x").status().message()),
              HasSubstr("x: moe_layer_freq: unsupported value 2"));
}

TEST(ResolveModelTest, CatalogNamesAreCaseInsensitive) {
  absl::StatusOr<ModelSpec> m = ResolveModel("LLaMA3-8B");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "llama3-8b");
}

TEST(ResolveModelTest, FilePathIsReadAsHfConfig) {
  absl::StatusOr<ModelSpec> m = ResolveModel(kHfDir + "mistral-7b.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "mistral-7b");
  EXPECT_EQ(m->architecture, "MistralForCausalLM");

  // A Hugging Face snapshot directory: config.json is named after the dir.
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              "arachne_model_io_test" / "Meta-Llama-3-8B";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kHfDir + "llama3-8b.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  for (const std::filesystem::path& p : {dir / "config.json", dir}) {
    m = ResolveModel(p.string());
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->name, "Meta-Llama-3-8B");
    ExpectSameArchitecture(*m, Catalog("llama3-8b"));
  }

  // Errors inside the file name the file.
  std::ofstream(dir / "config.json")
      << R"({"architectures": ["LlamaForCausalLM"]})";
  m = ResolveModel((dir / "config.json").string());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr((dir / "config.json").string() +
                        ": missing required key \"num_hidden_layers\""));
  std::filesystem::remove_all(dir.parent_path());
}

TEST(ResolveModelTest, UnknownNameListsCatalog) {
  absl::StatusOr<ModelSpec> m = ResolveModel("llama4-9000b");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("unknown model \"llama4-9000b\""));
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("llama3-8b, llama3-70b"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("gpt3-175b"));
}

}  // namespace
}  // namespace arachne
