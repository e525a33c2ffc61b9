// Everything one planning request needs, loaded and resolved once: the GPU
// catalog, the model, the training config, the cluster, the profile store
// (shipped measured profiles, then synthesized entries for whatever the
// cluster's GPU types still lack) and the cost model built over them.
#ifndef ARACHNE_PLANNER_SERVICE_IO_PLANNING_CONTEXT_H_
#define ARACHNE_PLANNER_SERVICE_IO_PLANNING_CONTEXT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/cost/profile_store.h"
#include "planner_service/core/cost/profile_synthesizer.h"

namespace arachne {

struct PlanningRequest {
  std::string model;         // catalog id or path to a HF config.json
  std::string cluster_file;  // YAML or JSON cluster spec
  TrainingConfig training;
  std::string profiles_dir;  // "" = the data built into the binary
  CostParams cost_params;
};

// Owns the inputs the CostModel points into; not copyable or movable.
class PlanningContext {
 public:
  // Loads and resolves `request`. Errors name the bad field or file:
  // NotFound (unknown model/GPU/file), InvalidArgument (malformed input).
  static absl::StatusOr<std::unique_ptr<PlanningContext>> Create(
      const PlanningRequest& request);
  // Same from already-loaded parts (the service and tests use this).
  static absl::StatusOr<std::unique_ptr<PlanningContext>> Create(
      GpuCatalog catalog, ModelSpec model, TrainingConfig training,
      Cluster cluster, const std::string& profiles_dir,
      CostParams cost_params = {});

  PlanningContext(const PlanningContext&) = delete;
  PlanningContext& operator=(const PlanningContext&) = delete;

  const GpuCatalog& catalog() const { return catalog_; }
  const ModelSpec& model() const { return model_; }
  const TrainingConfig& training() const { return training_; }
  const Cluster& cluster() const { return cluster_; }
  const ProfileStore& profiles() const { return profiles_; }
  const CostModel& cost_model() const { return *cost_model_; }

 private:
  PlanningContext() = default;
  GpuCatalog catalog_;
  ModelSpec model_;
  TrainingConfig training_;
  Cluster cluster_;
  ProfileStore profiles_;
  std::unique_ptr<CostModel> cost_model_;
};

// The profiles a PlanningContext prices `model` on `cluster` with: the
// measured profiles of `profiles_dir` ("" = built in), then synthesized
// entries for whatever the cluster's GPU types still lack (with
// `training`'s sequence length and framework kernels, up to `cost_params`'
// TP and micro-batch limits).
absl::StatusOr<ProfileStore> LoadPlanningProfiles(
    const GpuCatalog& catalog, const ModelSpec& model,
    const TrainingConfig& training, const Cluster& cluster,
    const std::string& profiles_dir, const CostParams& cost_params);

// Adds synthesized entries for `model` on GPU `gpu` (every layer kind, TP
// 1..min(max_tp, max_node), micro-batch 1..max_mbs, `seq`) with the shipped
// calibration of that GPU and the framework's `kernels`; measured entries
// already in `store` win.
absl::Status SynthesizeMissingProfiles(const ModelSpec& model,
                                       const GpuType& gpu, int max_node,
                                       int seq, const CostParams& params,
                                       const std::string& profiles_dir,
                                       ProfileStore* store,
                                       const SynthesisKernels& kernels = {});

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_PLANNING_CONTEXT_H_
