// Training compositions for the learned planner (paper §5.5, §6: "synthetic
// clusters of two to four GPU types ... cover which type holds the most
// GPUs, how many types a cluster holds, the cluster size, and the node
// size"). A seeded generator draws clusters from the profiled GPU types the
// caller names and never emits one whose composition equals an excluded
// cluster's (the caller passes the evaluation suite, bench/scenarios, so
// every evaluation composition stays unseen in training).
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_COMPOSITION_GENERATOR_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_COMPOSITION_GENERATOR_H_

#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"

namespace arachne {

// A composition up to node names, order and NIC bandwidth: the sorted
// multiset of (catalog type, node size) with its node counts. Two clusters
// with equal keys are "the same composition".
using CompositionKey =
    std::vector<std::tuple<int, int, int>>;  // type, size, count
CompositionKey CompositionKeyOf(const Cluster& cluster);

struct CompositionGeneratorConfig {
  // Catalog indices of the GPU types to draw from (distinct, at least
  // min_types of them): the types the model has profiles for.
  std::vector<int> gpu_types;
  int min_types = 2;  // types per composition, drawn uniformly in range
  int max_types = 4;
  int min_gpus = 8;  // total GPUs, drawn log-uniformly in range
  int max_gpus = 512;
  // Node sizes (GPUs per node) to draw from, each in [1, 64].
  std::vector<int> node_sizes = {1, 2, 4, 8};
  // Probability that a type's GPUs come in two node sizes instead of one.
  double mixed_node_size_probability = 0.25;
  // Probability that one type dominates (weight 2-6 against 0.5-1.5 for the
  // others); otherwise the weights are 0.75-1.25 (a balanced mix).
  double dominant_type_probability = 0.6;
  // NIC bandwidths (Gb/s) to draw from; one per composition.
  std::vector<double> inter_node_gbps = {50, 100, 200};
  // Draws allowed per composition before giving up (rejections: size out of
  // range, excluded, or already emitted in the same batch).
  int max_attempts = 10000;
};

class CompositionGenerator {
 public:
  // Validates `config` against `catalog` (InvalidArgument naming the field
  // and value: unknown or repeated type index, fewer types than min_types,
  // min_types outside [1, max_types], max_gpus < min_gpus or min_gpus < 1,
  // an empty or out-of-range node size list, probabilities outside [0, 1],
  // an empty or non-positive bandwidth list). `catalog` must outlive the
  // generator; `excluded` is copied as keys.
  static absl::StatusOr<CompositionGenerator> Create(
      const GpuCatalog& catalog, CompositionGeneratorConfig config,
      const std::vector<Cluster>& excluded);

  // `count` compositions with pairwise distinct keys, none equal to an
  // excluded one, each valid under Cluster::Create, with min_types to
  // max_types types of config.gpu_types, min_gpus to max_gpus GPUs and node
  // sizes from config.node_sizes. The same (config, excluded, seed, count)
  // gives the same clusters with any compiler and standard library
  // (std::mt19937_64, whose output the standard fixes, and this file's own
  // bounded draws; the size's log-uniform draw also needs exp2/log2, which
  // common libms round alike). A batch is a prefix of a longer batch of the
  // same seed. Nodes are named "<lower-case type id>-<i>".
  // ResourceExhausted when max_attempts draws in a row find no new
  // admissible composition (the space is too small for `count`).
  absl::StatusOr<std::vector<Cluster>> Generate(int count, uint64_t seed) const;

 private:
  CompositionGenerator(const GpuCatalog& catalog,
                       CompositionGeneratorConfig config,
                       std::vector<CompositionKey> excluded)
      : catalog_(&catalog),
        config_(std::move(config)),
        excluded_(std::move(excluded)) {}

  const GpuCatalog* catalog_;
  CompositionGeneratorConfig config_;
  std::vector<CompositionKey> excluded_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_COMPOSITION_GENERATOR_H_
