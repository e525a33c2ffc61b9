#include "planner_service/core/planners/composition_generator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne {
namespace {

// Bounded draws written out here rather than std::uniform_*_distribution,
// whose algorithms the standard leaves to the library: with these, a seed
// gives the same compositions with any standard library.
class Draws {
 public:
  explicit Draws(uint64_t seed) : engine_(seed) {}

  // Uniform in [lo, hi] (inclusive), by rejection (no modulo bias).
  int Int(int lo, int hi) {
    CHECK_LE(lo, hi);
    const uint64_t span = static_cast<uint64_t>(hi) - lo + 1;
    const uint64_t limit =
        std::mt19937_64::max() - (std::mt19937_64::max() % span + 1) % span;
    uint64_t x;
    do {
      x = engine_();
    } while (x > limit);
    return lo + static_cast<int>(x % span);
  }
  // Uniform in [lo, hi) from the top 53 bits.
  double Real(double lo, double hi) {
    const double u = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
    return lo + (hi - lo) * u;
  }
  bool Bernoulli(double p) { return Real(0, 1) < p; }

 private:
  std::mt19937_64 engine_;
};

// One draw of the node list (names assigned by the caller).
struct Draft {
  std::vector<Node> nodes;
  int total_gpus = 0;
};

}  // namespace

CompositionKey CompositionKeyOf(const Cluster& cluster) {
  std::map<std::pair<int, int>, int> counts;
  for (const Node& n : cluster.nodes()) ++counts[{n.gpu_type, n.num_gpus}];
  CompositionKey key;
  key.reserve(counts.size());
  for (const auto& [type_size, count] : counts)
    key.emplace_back(type_size.first, type_size.second, count);
  return key;
}

absl::StatusOr<CompositionGenerator> CompositionGenerator::Create(
    const GpuCatalog& catalog, CompositionGeneratorConfig config,
    const std::vector<Cluster>& excluded) {
  auto bad = [](absl::string_view field, const auto& value,
                absl::string_view want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "composition generator: ", field, ": ", want, ", got ", value));
  };
  absl::flat_hash_set<int> seen;
  for (size_t i = 0; i < config.gpu_types.size(); ++i) {
    const int t = config.gpu_types[i];
    const std::string field = absl::StrCat("gpu_types[", i, "]");
    if (t < 0 || t >= catalog.size())
      return bad(field, t, "not a catalog type index");
    if (!seen.insert(t).second) return bad(field, t, "repeated type index");
  }
  if (config.max_types < 1)
    return bad("max_types", config.max_types, "must be >= 1");
  if (config.min_types < 1 || config.min_types > config.max_types) {
    return bad(
        "min_types", config.min_types,
        absl::StrCat("must be in [1, max_types = ", config.max_types, "]"));
  }
  if (static_cast<int>(config.gpu_types.size()) < config.min_types) {
    return bad("gpu_types", config.gpu_types.size(),
               absl::StrCat("must hold at least min_types = ", config.min_types,
                            " types"));
  }
  if (config.min_gpus < 1)
    return bad("min_gpus", config.min_gpus, "must be >= 1");
  if (config.max_gpus < config.min_gpus) {
    return bad("max_gpus", config.max_gpus,
               absl::StrCat("must be >= min_gpus = ", config.min_gpus));
  }
  if (config.node_sizes.empty())
    return bad("node_sizes", "[]", "must not be empty");
  for (size_t i = 0; i < config.node_sizes.size(); ++i) {
    const int s = config.node_sizes[i];
    if (s < 1 || s > 64)
      return bad(absl::StrCat("node_sizes[", i, "]"), s, "must be in [1, 64]");
  }
  if (!(config.mixed_node_size_probability >= 0 &&
        config.mixed_node_size_probability <= 1)) {
    return bad("mixed_node_size_probability",
               config.mixed_node_size_probability, "must be in [0, 1]");
  }
  if (!(config.dominant_type_probability >= 0 &&
        config.dominant_type_probability <= 1)) {
    return bad("dominant_type_probability", config.dominant_type_probability,
               "must be in [0, 1]");
  }
  if (config.inter_node_gbps.empty())
    return bad("inter_node_gbps", "[]", "must not be empty");
  for (size_t i = 0; i < config.inter_node_gbps.size(); ++i) {
    if (!(config.inter_node_gbps[i] > 0)) {
      return bad(absl::StrCat("inter_node_gbps[", i, "]"),
                 config.inter_node_gbps[i], "must be > 0");
    }
  }
  if (config.max_attempts < 1)
    return bad("max_attempts", config.max_attempts, "must be >= 1");
  std::vector<CompositionKey> keys;
  keys.reserve(excluded.size());
  for (const Cluster& c : excluded) keys.push_back(CompositionKeyOf(c));
  return CompositionGenerator(catalog, std::move(config), std::move(keys));
}

absl::StatusOr<std::vector<Cluster>> CompositionGenerator::Generate(
    int count, uint64_t seed) const {
  const CompositionGeneratorConfig& c = config_;
  Draws rng(seed);
  const int type_choices = static_cast<int>(c.gpu_types.size());
  const int max_types = std::min(c.max_types, type_choices);
  const int sizes = static_cast<int>(c.node_sizes.size());
  std::vector<CompositionKey> emitted;
  std::vector<Cluster> out;
  out.reserve(count);

  auto draw = [&]() -> Draft {
    // Which types (a partial Fisher-Yates shuffle picks k distinct ones).
    const int k = rng.Int(c.min_types, max_types);
    std::vector<int> types = c.gpu_types;
    for (int i = 0; i < k; ++i)
      std::swap(types[i], types[rng.Int(i, type_choices - 1)]);
    types.resize(k);
    // How many GPUs: log-uniform, so 8-64 is as likely as 64-512.
    const double target =
        std::exp2(rng.Real(std::log2(c.min_gpus), std::log2(c.max_gpus + 1.0)));
    // Which type dominates, if any.
    std::vector<double> weight(k);
    if (rng.Bernoulli(c.dominant_type_probability)) {
      const int dominant = rng.Int(0, k - 1);
      for (int i = 0; i < k; ++i)
        weight[i] = i == dominant ? rng.Real(2, 6) : rng.Real(0.5, 1.5);
    } else {
      for (int i = 0; i < k; ++i) weight[i] = rng.Real(0.75, 1.25);
    }
    double weight_sum = 0;
    for (double w : weight) weight_sum += w;
    Draft d;
    const double nic =
        c.inter_node_gbps[rng.Int(0, c.inter_node_gbps.size() - 1)];
    for (int i = 0; i < k; ++i) {
      const double gpus = target * weight[i] / weight_sum;
      // One node size, or two splitting the type's GPUs.
      std::vector<std::pair<int, double>> parts;
      const int a = c.node_sizes[rng.Int(0, sizes - 1)];
      if (sizes >= 2 && rng.Bernoulli(c.mixed_node_size_probability)) {
        int b = c.node_sizes[rng.Int(0, sizes - 2)];
        if (b == a) b = c.node_sizes[sizes - 1];
        const double f = rng.Real(0.25, 0.75);
        parts = {{a, gpus * f}, {b, gpus * (1 - f)}};
      } else {
        parts = {{a, gpus}};
      }
      for (const auto& [size, part] : parts) {
        const int nodes =
            std::max(1, static_cast<int>(std::lround(part / size)));
        for (int n = 0; n < nodes; ++n) {
          d.nodes.push_back(Node{.name = "",
                                 .gpu_type = types[i],
                                 .num_gpus = size,
                                 .nic_gbps = nic});
          d.total_gpus += size;
        }
      }
    }
    return d;
  };

  for (int i = 0; i < count; ++i) {
    bool found = false;
    for (int attempt = 0; attempt < c.max_attempts && !found; ++attempt) {
      Draft d = draw();
      if (d.total_gpus < c.min_gpus || d.total_gpus > c.max_gpus) continue;
      std::map<int, int> per_type;
      for (Node& n : d.nodes) {
        n.name =
            absl::StrCat(absl::AsciiStrToLower(catalog_->type(n.gpu_type).id),
                         "-", per_type[n.gpu_type]++);
      }
      absl::StatusOr<Cluster> cluster =
          Cluster::Create(std::move(d.nodes), *catalog_);
      CHECK(cluster.ok()) << "drafts are valid by construction: "
                          << cluster.status();
      CompositionKey key = CompositionKeyOf(*cluster);
      if (std::find(excluded_.begin(), excluded_.end(), key) !=
              excluded_.end() ||
          std::find(emitted.begin(), emitted.end(), key) != emitted.end())
        continue;
      emitted.push_back(std::move(key));
      out.push_back(*std::move(cluster));
      found = true;
    }
    if (!found) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "composition generator: no new composition outside the excluded ",
          "ones after ", c.max_attempts, " draws (composition ", i, " of ",
          count, ")"));
    }
  }
  return out;
}

}  // namespace arachne
