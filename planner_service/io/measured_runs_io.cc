#include "planner_service/io/measured_runs_io.h"

#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/planners/template_builder.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/io/scenario_io.h"

namespace arachne {
namespace {

using Json = nlohmann::json;

// A path as written in the runs file: relative ones are relative to the
// file, so a runs file and the clusters and plans it names move together.
std::string ResolvePath(const std::string& base_dir, const std::string& p) {
  std::filesystem::path path(p);
  if (path.is_absolute() || base_dir.empty()) return p;
  return (std::filesystem::path(base_dir) / path).string();
}

absl::StatusOr<ModelSpec> ReadModel(const ObjectReader& r,
                                    const std::string& profiles_dir) {
  const Json* value = r.Find("model");
  if (value == nullptr) return r.MissingError("model");
  if (value->is_object()) {
    return ModelFromJson(*value, r.source(), r.PathOf("model"));
  }
  if (!value->is_string()) {
    return r.Error("model",
                   absl::StrCat("must be a catalog id or a models.yaml entry "
                                "(mapping), got ",
                                DescribeJsonValue(*value)));
  }
  ARACHNE_IO_ASSIGN_OR_RETURN(const std::string name, r.String("model"));
  absl::StatusOr<ModelSpec> model = ResolveModel(name, profiles_dir);
  if (!model.ok()) {
    return r.Error("model", AbbreviateQuoted(model.status().message(), name));
  }
  return *std::move(model);
}

absl::StatusOr<Cluster> ReadRunCluster(const ObjectReader& r,
                                       const std::string& base_dir,
                                       const GpuCatalog& catalog) {
  const bool inline_cluster = r.Has("cluster");
  const bool file = r.Has("cluster_file");
  if (inline_cluster == file) {
    return FieldError(r.source(), r.path(),
                      inline_cluster
                          ? "give one of cluster and cluster_file, not both"
                          : "missing required field \"cluster\" (or "
                            "\"cluster_file\")");
  }
  if (file) {
    ARACHNE_IO_ASSIGN_OR_RETURN(const std::string path,
                                r.String("cluster_file"));
    absl::StatusOr<Cluster> c =
        LoadClusterFile(ResolvePath(base_dir, path), catalog);
    if (!c.ok()) return r.Error("cluster_file", c.status().message());
    return c;
  }
  const Json* cluster = r.Find("cluster");
  if (!cluster->is_object()) {
    return r.Error("cluster", absl::StrCat("must be a mapping (object), got ",
                                           DescribeJsonValue(*cluster)));
  }
  // As scenario files do: the subtree round-trips through JSON text exactly,
  // and the source names the field.
  return ParseCluster(cluster->dump(),
                      absl::StrCat(r.source(), ": ", r.PathOf("cluster")),
                      catalog);
}

absl::StatusOr<Plan> ReadRunPlan(const ObjectReader& r,
                                 const std::string& base_dir,
                                 const ModelSpec& model,
                                 const TrainingConfig& training,
                                 const Cluster& cluster,
                                 const GpuCatalog& catalog) {
  const bool uniform = r.Has("plan");
  const bool file = r.Has("plan_file");
  if (uniform == file) {
    return FieldError(r.source(), r.path(),
                      uniform ? "give one of plan and plan_file, not both"
                              : "missing required field \"plan\" (or "
                                "\"plan_file\")");
  }
  if (file) {
    ARACHNE_IO_ASSIGN_OR_RETURN(const std::string path, r.String("plan_file"));
    absl::StatusOr<Plan> p =
        LoadPlanFile(ResolvePath(base_dir, path), cluster, catalog);
    if (!p.ok()) return r.Error("plan_file", p.status().message());
    return p;
  }
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader p, r.Object("plan"));
  ARACHNE_IO_RETURN_IF_ERROR(p.AllowOnly({"tp", "pp", "dp", "micro_batch"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(const int tp, p.IntOr("tp", 1, 1, 64));
  ARACHNE_IO_ASSIGN_OR_RETURN(const int pp, p.IntOr("pp", 1, 1, 1024));
  ARACHNE_IO_ASSIGN_OR_RETURN(const int dp, p.Int("dp", 1, 1 << 20));
  ARACHNE_IO_ASSIGN_OR_RETURN(const int mbs, p.Int("micro_batch", 1, 1 << 20));
  absl::StatusOr<Plan> plan =
      MegatronUniformPlan(model, training, cluster, tp, pp, dp, mbs);
  // MegatronUniformPlan's messages start with the field they are about.
  if (!plan.ok()) {
    return FieldError(p.source(), p.path(), plan.status().message());
  }
  return plan;
}

absl::StatusOr<MeasuredRun> ReadRun(const Json& value, absl::string_view file,
                                    int index, const std::string& base_dir,
                                    const GpuCatalog& catalog,
                                    const std::string& profiles_dir) {
  const std::string at = IndexFieldPath("runs", index);
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader first,
                              ObjectReader::Create(value, file, at));
  MeasuredRun run;
  ARACHNE_IO_ASSIGN_OR_RETURN(run.label, first.String("label"));
  // Every further error names the run by index and label: the label is
  // what the user searches for, the index finds it when labels repeat.
  ARACHNE_IO_ASSIGN_OR_RETURN(
      ObjectReader r,
      ObjectReader::Create(
          value,
          absl::StrCat(file, ": ", at, " (", QuoteForMessage(run.label), ")"),
          ""));
  ARACHNE_IO_RETURN_IF_ERROR(
      r.AllowOnly({"label", "source", "model", "cluster", "cluster_file",
                   "training", "plan", "plan_file", "measured"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(run.source, r.String("source"));
  ARACHNE_IO_ASSIGN_OR_RETURN(run.model, ReadModel(r, profiles_dir));
  ARACHNE_IO_ASSIGN_OR_RETURN(run.cluster,
                              ReadRunCluster(r, base_dir, catalog));
  if (!r.Has("training")) return r.MissingError("training");
  ARACHNE_IO_ASSIGN_OR_RETURN(run.training, ReadTrainingConfig(r));
  ARACHNE_IO_ASSIGN_OR_RETURN(
      run.plan,
      ReadRunPlan(r, base_dir, run.model, run.training, run.cluster, catalog));
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader m, r.Object("measured"));
  ARACHNE_IO_RETURN_IF_ERROR(m.AllowOnly({"iteration_s", "peak_memory_gib"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(run.measured_iteration_s,
                              m.Number("iteration_s", 0, true));
  if (m.Has("peak_memory_gib")) {
    ARACHNE_IO_ASSIGN_OR_RETURN(const double peak,
                                m.Number("peak_memory_gib", 0, true));
    run.measured_peak_gib = peak;
  }
  return run;
}

}  // namespace

absl::StatusOr<Plan> MegatronUniformPlan(const ModelSpec& model,
                                         const TrainingConfig& training,
                                         const Cluster& cluster, int tp, int pp,
                                         int dp, int micro_batch) {
  if (tp < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("tp: must be >= 1, got ", tp));
  if (pp < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("pp: must be >= 1, got ", pp));
  if (dp < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("dp: must be >= 1, got ", dp));
  if (micro_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch: must be >= 1, got ", micro_batch));
  }
  const int64_t gpus = int64_t{tp} * pp * dp;
  if (gpus != cluster.total_gpus()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp * pp * dp: must be the cluster's GPU count ", cluster.total_gpus(),
        ", got ", tp, " * ", pp, " * ", dp, " = ", gpus));
  }
  if (pp > model.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("pp: must be at most the model's ", model.num_layers,
                     " layers, got ", pp));
  }
  const int64_t per_step = int64_t{micro_batch} * dp;
  if (training.global_batch % per_step != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch: micro_batch * dp = ", per_step,
                     " must divide the global batch ", training.global_batch,
                     " (Megatron's rule), got micro_batch ", micro_batch));
  }
  // Rank -> (node, local GPU), in cluster order.
  std::vector<std::pair<int, int>> ranks;
  ranks.reserve(gpus);
  for (int n = 0; n < cluster.num_nodes(); ++n) {
    for (int g = 0; g < cluster.node(n).num_gpus; ++g) ranks.push_back({n, g});
  }
  Template t;
  t.replicas = dp;
  t.micro_batch_size = micro_batch;
  t.total_micro_batches = static_cast<int>(training.global_batch / micro_batch);
  t.stages.resize(pp);
  t.placement.resize(static_cast<size_t>(pp) * dp);
  for (int s = 0; s < pp; ++s) {
    for (int r = 0; r < dp; ++r) {
      const int first = (s * dp + r) * tp;
      StagePlacement& place = t.placement[static_cast<size_t>(r) * pp + s];
      place.node = ranks[first].first;
      for (int k = 0; k < tp; ++k) {
        const auto [node, gpu] = ranks[first + k];
        if (node != place.node) {
          return absl::InvalidArgumentError(
              absl::StrCat("tp: the TP group of stage ", s, " replica ", r,
                           " would span nodes ", cluster.node(place.node).name,
                           " and ", cluster.node(node).name,
                           " (tp must divide every node's GPU "
                           "count), got ",
                           tp));
        }
        place.gpus.push_back(gpu);
      }
      const int type = cluster.node(place.node).gpu_type;
      if (r == 0) {
        t.stages[s].gpu_type = type;
        t.stages[s].tp = tp;
      } else if (type != t.stages[s].gpu_type) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pp: stage ", s, " would mix GPU types (replica ", r, " on node ",
            cluster.node(place.node).name,
            "); a uniform plan needs one type per stage, got pp ", pp));
      }
    }
  }
  ApplySplit(t, EvenSplit(model.num_layers, pp));
  ShardExpertsByTp(t, model);
  Plan plan;
  plan.templates.push_back(std::move(t));
  return plan;
}

absl::StatusOr<MeasuredRunsFile> ParseMeasuredRuns(
    absl::string_view text, absl::string_view source,
    const std::string& base_dir, const GpuCatalog& catalog,
    const std::string& profiles_dir) {
  ARACHNE_IO_ASSIGN_OR_RETURN(Json root, ParseJsonOrYaml(text, source));
  if (root.is_null()) {
    return FieldError(source, "", "is empty; expected a mapping with runs");
  }
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader top,
                              ObjectReader::Create(root, source, ""));
  ARACHNE_IO_RETURN_IF_ERROR(top.AllowOnly({"source", "runs"}));
  MeasuredRunsFile file;
  ARACHNE_IO_ASSIGN_OR_RETURN(file.source, top.StringOr("source", ""));
  if (!top.Has("runs")) return top.MissingError("runs");
  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* list, top.Array("runs"));
  if (list->empty()) return top.Error("runs", "must not be empty");
  absl::flat_hash_map<std::string, int> index_by_label;
  for (int i = 0; i < static_cast<int>(list->size()); ++i) {
    ARACHNE_IO_ASSIGN_OR_RETURN(
        MeasuredRun run,
        ReadRun((*list)[i], source, i, base_dir, catalog, profiles_dir));
    auto [it, inserted] = index_by_label.emplace(run.label, i);
    if (!inserted) {
      return FieldError(
          source, JoinFieldPath(IndexFieldPath("runs", i), "label"),
          absl::StrCat("duplicate label ", QuoteForMessage(run.label),
                       " (also runs[", it->second, "])"));
    }
    file.runs.push_back(std::move(run));
  }
  return file;
}

absl::StatusOr<MeasuredRunsFile> LoadMeasuredRunsFile(
    const std::string& path, const GpuCatalog& catalog,
    const std::string& profiles_dir) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseMeasuredRuns(text, path,
                           std::filesystem::path(path).parent_path().string(),
                           catalog, profiles_dir);
}

}  // namespace arachne
