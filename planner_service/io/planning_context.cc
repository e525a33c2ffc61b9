#include "planner_service/io/planning_context.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner_service/core/cost/profile_synthesizer.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/profile_io.h"

namespace arachne {

absl::Status SynthesizeMissingProfiles(const ModelSpec& model,
                                       const GpuType& gpu, int max_node,
                                       int seq, const CostParams& params,
                                       const std::string& profiles_dir,
                                       ProfileStore* store,
                                       const SynthesisKernels& kernels) {
  absl::StatusOr<CalibrationSet> calibration = LoadCalibration(profiles_dir);
  if (!calibration.ok()) return calibration.status();
  std::vector<int> tps, mbss;
  for (int tp = 1; tp <= std::min(params.max_tp, max_node); tp *= 2)
    tps.push_back(tp);
  for (int mbs = 1; mbs <= params.max_micro_batch_size; mbs *= 2)
    mbss.push_back(mbs);
  ProfileSynthesizer synthesizer(calibration->For(gpu), kernels);
  synthesizer.Fill(model, gpu, tps, mbss, seq, store);
  return absl::OkStatus();
}

absl::StatusOr<ProfileStore> LoadPlanningProfiles(
    const GpuCatalog& catalog, const ModelSpec& model,
    const TrainingConfig& training, const Cluster& cluster,
    const std::string& profiles_dir, const CostParams& cost_params) {
  ProfileStore profiles;
  if (absl::Status s = LoadProfileFiles(profiles_dir, catalog, &profiles);
      !s.ok()) {
    return s;
  }
  for (int type : cluster.types_present()) {
    if (absl::Status s = SynthesizeMissingProfiles(
            model, catalog.type(type), cluster.MaxNodeSizeOfType(type),
            training.seq_len, cost_params, profiles_dir, &profiles,
            KernelsOf(training.framework));
        !s.ok()) {
      return s;
    }
  }
  return profiles;
}

absl::StatusOr<std::unique_ptr<PlanningContext>> PlanningContext::Create(
    const PlanningRequest& request) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(request.profiles_dir);
  if (!catalog.ok()) return catalog.status();
  absl::StatusOr<ModelSpec> model =
      ResolveModel(request.model, request.profiles_dir);
  if (!model.ok()) return model.status();
  absl::StatusOr<Cluster> cluster =
      LoadClusterFile(request.cluster_file, *catalog);
  if (!cluster.ok()) return cluster.status();
  return Create(*std::move(catalog), *std::move(model), request.training,
                *std::move(cluster), request.profiles_dir,
                request.cost_params);
}

absl::StatusOr<std::unique_ptr<PlanningContext>> PlanningContext::Create(
    GpuCatalog catalog, ModelSpec model, TrainingConfig training,
    Cluster cluster, const std::string& profiles_dir, CostParams cost_params) {
  if (absl::Status s = training.Validate(); !s.ok()) return s;
  if (absl::Status s = model.Validate(); !s.ok()) return s;
  std::unique_ptr<PlanningContext> ctx(new PlanningContext());
  ctx->catalog_ = std::move(catalog);
  ctx->model_ = std::move(model);
  ctx->training_ = training;
  ctx->cluster_ = std::move(cluster);
  absl::StatusOr<ProfileStore> profiles =
      LoadPlanningProfiles(ctx->catalog_, ctx->model_, ctx->training_,
                           ctx->cluster_, profiles_dir, cost_params);
  if (!profiles.ok()) return profiles.status();
  ctx->profiles_ = *std::move(profiles);
  absl::StatusOr<CostModel> cm =
      CostModel::Create(ctx->catalog_, ctx->model_, ctx->training_,
                        ctx->cluster_, ctx->profiles_, cost_params);
  if (!cm.ok()) return cm.status();
  ctx->cost_model_ = std::make_unique<CostModel>(*std::move(cm));
  return ctx;
}

}  // namespace arachne
