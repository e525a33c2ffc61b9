#include "planner_service/core/model/model_generator.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne {
namespace {

absl::Status OutOfRange(absl::string_view field, double value,
                        absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "model generator: ", field, " must be ", want, ", got ", value));
}

int RoundTo(double x, int multiple) {
  return std::max(multiple,
                  static_cast<int>(std::lround(x / multiple)) * multiple);
}

}  // namespace

absl::StatusOr<std::vector<ModelSpec>> GenerateModelShapes(
    const ModelGeneratorConfig& c, int count, uint64_t seed,
    const std::string& prefix) {
  if (count < 0) return OutOfRange("count", count, ">= 0");
  if (!(c.moe_share >= 0 && c.moe_share <= 1))
    return OutOfRange("moe_share", c.moe_share, "in [0, 1]");
  if (c.min_layers < 1 || c.min_layers > 1024)
    return OutOfRange("min_layers", c.min_layers, "in [1, 1024]");
  if (c.max_layers < c.min_layers || c.max_layers > 1024)
    return OutOfRange("max_layers", c.max_layers,
                      absl::StrCat("in [min_layers=", c.min_layers, ", 1024]"));
  if (c.min_hidden < 128 || c.min_hidden > 65536)
    return OutOfRange("min_hidden", c.min_hidden, "in [128, 65536]");
  if (c.max_hidden < c.min_hidden || c.max_hidden > 65536)
    return OutOfRange("max_hidden", c.max_hidden,
                      absl::StrCat("in [min_hidden=", c.min_hidden, ", 65536]"));
  std::mt19937_64 rng(seed);
  auto uniform = [&rng](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto pick = [&rng](std::initializer_list<int> values) {
    std::vector<int> v(values);
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  constexpr int kHeadDim = 128;
  std::vector<ModelSpec> shapes;
  shapes.reserve(count);
  for (int i = 0; i < count; ++i) {
    ModelSpec m;
    m.name = absl::StrCat(prefix, i);
    const bool moe = uniform(0, 1) < c.moe_share;
    m.architecture = moe ? "MixtralForCausalLM" : "LlamaForCausalLM";
    // Width and depth log-uniform, so small and large shapes are as likely.
    m.hidden = RoundTo(std::exp(uniform(std::log(c.min_hidden),
                                        std::log(c.max_hidden))),
                       kHeadDim);
    m.num_layers = static_cast<int>(std::lround(std::exp(
        uniform(std::log(c.min_layers), std::log(c.max_layers + 0.5)))));
    m.num_layers = std::clamp(m.num_layers, c.min_layers, c.max_layers);
    m.head_dim = kHeadDim;
    m.num_heads = m.hidden / kHeadDim;
    // Grouped-query attention with 8 KV heads where the heads divide by 8,
    // else full multi-head attention.
    m.num_kv_heads = (m.num_heads % 8 == 0 && uniform(0, 1) < 0.8)
                         ? 8
                         : m.num_heads;
    const bool gelu = !moe && uniform(0, 1) < 0.2;
    m.mlp = gelu ? MlpKind::kGelu : MlpKind::kSwiGlu;
    m.ffn = RoundTo(m.hidden * (gelu ? 4.0 : uniform(2.5, 4.0)), 256);
    m.vocab = pick({32000, 50257, 128256, 151936});
    m.tied_embeddings = m.hidden <= 2560 && uniform(0, 1) < 0.5;
    if (moe) {
      m.moe.num_experts = pick({8, 16, 32, 64, 128});
      m.moe.top_k = std::min(m.moe.num_experts, pick({1, 2, 4, 8}));
      // Fine-grained experts when there are many of them.
      const double width = m.moe.num_experts >= 64 ? uniform(0.25, 0.75)
                                                   : uniform(2.0, 3.5);
      m.moe.expert_ffn = RoundTo(m.hidden * width, 128);
      if (uniform(0, 1) < 0.3) {
        m.moe.shared_experts = 1;
        m.moe.shared_expert_ffn = m.moe.expert_ffn;
      }
      if (uniform(0, 1) < 0.3)
        m.moe.dense_first_layers = std::min(m.num_layers - 1, pick({1, 3}));
    }
    const absl::Status valid = m.Validate();
    CHECK(valid.ok()) << valid;
    shapes.push_back(std::move(m));
  }
  return shapes;
}

}  // namespace arachne
