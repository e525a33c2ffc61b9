#include "planner_service/io/plan_io.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {
namespace {

using Json = nlohmann::json;

Json StageToJson(const Stage& s, int t, int index, const Prediction& pred,
                 const GpuCatalog& catalog, bool moe) {
  Json j{{"gpu_type", catalog.type(s.gpu_type).id},
         {"tp", s.tp},
         {"layers", Json::array({s.layer_begin, s.layer_end})}};
  if (t < static_cast<int>(pred.stage_memory.size()) &&
      index < static_cast<int>(pred.stage_memory[t].size())) {
    j["memory_gib"] = pred.stage_memory[t][index].total_gib();
  }
  if (moe) {
    j["expert_tiling"] =
        Json{{"ep", s.tiling.ep}, {"etp", s.tiling.etp}, {"edp", s.tiling.edp}};
  }
  return j;
}

absl::StatusOr<Stage> StageFromJson(const ObjectReader& r,
                                    const GpuCatalog& catalog) {
  ARACHNE_IO_RETURN_IF_ERROR(
      r.AllowOnly({"gpu_type", "tp", "layers", "memory_gib", "expert_tiling"}));
  Stage s;
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string gpu, r.String("gpu_type"));
  absl::StatusOr<int> type = catalog.IndexOf(gpu);
  if (!type.ok()) return r.Error("gpu_type", type.status().message());
  s.gpu_type = *type;
  ARACHNE_IO_ASSIGN_OR_RETURN(s.tp, r.Int("tp", 1));
  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* layers, r.Array("layers"));
  const bool pair = layers->size() == 2 && (*layers)[0].is_number_integer() &&
                    (*layers)[1].is_number_integer();
  if (!pair || (*layers)[0].get<int64_t>() < 0 ||
      (*layers)[0].get<int64_t>() >= (*layers)[1].get<int64_t>() ||
      (*layers)[1].get<int64_t>() > std::numeric_limits<int>::max()) {
    return r.Error("layers",
                   absl::StrCat("must be [begin, end] with 0 <= begin < end, "
                                "got ",
                                DescribeJsonValue(*layers)));
  }
  s.layer_begin = (*layers)[0].get<int>();
  s.layer_end = (*layers)[1].get<int>();
  // memory_gib is a prediction: accepted for round trips, not read.
  if (r.Has("expert_tiling")) {
    ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader et, r.Object("expert_tiling"));
    ARACHNE_IO_RETURN_IF_ERROR(et.AllowOnly({"ep", "etp", "edp"}));
    ARACHNE_IO_ASSIGN_OR_RETURN(s.tiling.ep, et.IntOr("ep", 1, 1));
    ARACHNE_IO_ASSIGN_OR_RETURN(s.tiling.etp, et.IntOr("etp", 1, 1));
    ARACHNE_IO_ASSIGN_OR_RETURN(s.tiling.edp, et.IntOr("edp", 1, 1));
  }
  return s;
}

absl::StatusOr<StagePlacement> PlacementFromJson(
    const ObjectReader& r, int tp,
    const absl::flat_hash_map<std::string, int>& node_by_name) {
  ARACHNE_IO_RETURN_IF_ERROR(r.AllowOnly({"node", "gpus"}));
  StagePlacement p;
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string node, r.String("node"));
  auto it = node_by_name.find(node);
  if (it == node_by_name.end()) {
    return r.Error("node", absl::StrCat("unknown node \"", node,
                                        "\" (not in the cluster)"));
  }
  p.node = it->second;
  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* gpus, r.Array("gpus"));
  for (int i = 0; i < static_cast<int>(gpus->size()); ++i) {
    const Json& g = (*gpus)[i];
    if (!g.is_number_integer() || g.get<int64_t>() < 0 ||
        g.get<int64_t>() > std::numeric_limits<int>::max()) {
      return FieldError(
          r.source(), IndexFieldPath(r.PathOf("gpus"), i),
          absl::StrCat("must be a GPU index >= 0, got ", DescribeJsonValue(g)));
    }
    p.gpus.push_back(g.get<int>());
  }
  if (static_cast<int>(p.gpus.size()) != tp) {
    return r.Error("gpus", absl::StrCat("must list tp = ", tp, " GPUs, got ",
                                        p.gpus.size()));
  }
  return p;
}

absl::StatusOr<Template> TemplateFromJson(
    const ObjectReader& r, const GpuCatalog& catalog,
    const absl::flat_hash_map<std::string, int>& node_by_name) {
  ARACHNE_IO_RETURN_IF_ERROR(
      r.AllowOnly({"replicas", "micro_batch_size", "micro_batches",
                   "total_micro_batches", "stages", "placement"}));
  Template t;
  ARACHNE_IO_ASSIGN_OR_RETURN(t.replicas, r.Int("replicas", 1));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.micro_batch_size, r.Int("micro_batch_size", 1));
  if (r.Has("total_micro_batches")) {
    ARACHNE_IO_ASSIGN_OR_RETURN(t.total_micro_batches,
                                r.Int("total_micro_batches", 1));
    if (r.Has("micro_batches")) {
      ARACHNE_IO_ASSIGN_OR_RETURN(int per_replica, r.Int("micro_batches", 1));
      if (per_replica != t.max_micro_batches()) {
        return r.Error(
            "micro_batches",
            absl::StrCat(per_replica, " does not match total_micro_batches ",
                         t.total_micro_batches, " over ", t.replicas,
                         " replicas (busiest replica runs ",
                         t.max_micro_batches(), ")"));
      }
    }
  } else if (r.Has("micro_batches")) {
    ARACHNE_IO_ASSIGN_OR_RETURN(int per_replica, r.Int("micro_batches", 1));
    if (static_cast<int64_t>(per_replica) * t.replicas >
        std::numeric_limits<int>::max()) {
      return r.Error("micro_batches", "micro_batches * replicas is too large");
    }
    t.total_micro_batches = per_replica * t.replicas;
  } else {
    return r.MissingError("total_micro_batches");
  }

  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* stages, r.Array("stages"));
  if (stages->empty()) return r.Error("stages", "must not be empty");
  for (int s = 0; s < static_cast<int>(stages->size()); ++s) {
    ARACHNE_IO_ASSIGN_OR_RETURN(
        ObjectReader sr,
        ObjectReader::Create((*stages)[s], r.source(),
                             IndexFieldPath(r.PathOf("stages"), s)));
    ARACHNE_IO_ASSIGN_OR_RETURN(Stage stage, StageFromJson(sr, catalog));
    t.stages.push_back(std::move(stage));
  }

  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* rows, r.Array("placement"));
  if (static_cast<int>(rows->size()) != t.replicas) {
    return r.Error("placement",
                   absl::StrCat("must have one row per replica (", t.replicas,
                                "), got ", rows->size()));
  }
  for (int rep = 0; rep < t.replicas; ++rep) {
    const std::string row_path = IndexFieldPath(r.PathOf("placement"), rep);
    const Json& row = (*rows)[rep];
    if (!row.is_array() || static_cast<int>(row.size()) != t.depth()) {
      return FieldError(
          r.source(), row_path,
          absl::StrCat("must be a list with one entry per stage (", t.depth(),
                       "), got ", DescribeJsonValue(row)));
    }
    for (int s = 0; s < t.depth(); ++s) {
      ARACHNE_IO_ASSIGN_OR_RETURN(
          ObjectReader pr, ObjectReader::Create(row[s], r.source(),
                                                IndexFieldPath(row_path, s)));
      ARACHNE_IO_ASSIGN_OR_RETURN(
          StagePlacement p,
          PlacementFromJson(pr, t.stages[s].tp, node_by_name));
      t.placement.push_back(std::move(p));
    }
  }
  return t;
}

}  // namespace

nlohmann::json PlanToJson(const Plan& plan, const Prediction& prediction,
                          const Cluster& cluster, const GpuCatalog& catalog,
                          const ModelSpec& model,
                          const TrainingConfig& training) {
  Json j;
  j["model"] = model.name;
  j["training"] =
      Json{{"seq_len", training.seq_len},
           {"global_batch", training.global_batch},
           {"precision", std::string(PrecisionName(training.precision))},
           {"recompute", std::string(RecomputeName(training.recompute))},
           {"distributed_optimizer", training.distributed_optimizer}};
  j["iteration_time_s"] = prediction.iteration_time_s;
  j["throughput_iters_per_s"] = prediction.throughput_iters_per_s;
  j["tokens_per_s"] = prediction.tokens_per_s;
  j["mfu"] = prediction.mfu;
  j["usd_per_hour"] = prediction.usd_per_hour;
  j["max_memory_gib"] = prediction.max_memory_gib;
  j["unused_gpus"] = cluster.total_gpus() - plan.used_gpus();
  const TimeBreakdown& b = prediction.breakdown;
  j["breakdown"] = Json{{"compute_s", b.compute_s},
                        {"tp_comm_s", b.tp_comm_s},
                        {"p2p_s", b.p2p_s},
                        {"bubble_s", b.bubble_s},
                        {"dp_sync_s", b.dp_sync_s},
                        {"all_to_all_s", b.all_to_all_s},
                        {"optimizer_s", b.optimizer_s}};
  Json templates = Json::array();
  for (int t = 0; t < static_cast<int>(plan.templates.size()); ++t) {
    const Template& tmpl = plan.templates[t];
    Json stages = Json::array();
    for (int s = 0; s < tmpl.depth(); ++s) {
      stages.push_back(StageToJson(tmpl.stages[s], t, s, prediction, catalog,
                                   model.is_moe()));
    }
    Json placement = Json::array();
    for (int r = 0; r < tmpl.replicas; ++r) {
      Json row = Json::array();
      for (int s = 0; s < tmpl.depth(); ++s) {
        const int index = r * tmpl.depth() + s;
        if (index >= static_cast<int>(tmpl.placement.size())) break;
        const StagePlacement& p = tmpl.placement[index];
        const bool known_node = p.node >= 0 && p.node < cluster.num_nodes();
        row.push_back(Json{{"node", known_node ? Json(cluster.node(p.node).name)
                                               : Json(nullptr)},
                           {"gpus", p.gpus}});
      }
      placement.push_back(std::move(row));
    }
    templates.push_back(Json{{"replicas", tmpl.replicas},
                             {"micro_batch_size", tmpl.micro_batch_size},
                             {"micro_batches", tmpl.max_micro_batches()},
                             {"total_micro_batches", tmpl.total_micro_batches},
                             {"stages", std::move(stages)},
                             {"placement", std::move(placement)}});
  }
  j["templates"] = std::move(templates);
  return j;
}

absl::StatusOr<Plan> PlanFromJson(const nlohmann::json& json,
                                  const Cluster& cluster,
                                  const GpuCatalog& catalog,
                                  absl::string_view source) {
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader top,
                              ObjectReader::Create(json, source, ""));
  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* templates, top.Array("templates"));
  if (templates->empty()) return top.Error("templates", "must not be empty");
  absl::flat_hash_map<std::string, int> node_by_name;
  for (int i = 0; i < cluster.num_nodes(); ++i) {
    node_by_name.emplace(cluster.node(i).name, i);
  }
  Plan plan;
  for (int t = 0; t < static_cast<int>(templates->size()); ++t) {
    ARACHNE_IO_ASSIGN_OR_RETURN(
        ObjectReader r, ObjectReader::Create((*templates)[t], source,
                                             IndexFieldPath("templates", t)));
    ARACHNE_IO_ASSIGN_OR_RETURN(Template tmpl,
                                TemplateFromJson(r, catalog, node_by_name));
    plan.templates.push_back(std::move(tmpl));
  }
  return plan;
}

absl::StatusOr<Plan> LoadPlanFile(const std::string& path,
                                  const Cluster& cluster,
                                  const GpuCatalog& catalog) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  ARACHNE_IO_ASSIGN_OR_RETURN(Json json, ParseJsonOrYaml(text, path));
  return PlanFromJson(json, cluster, catalog, path);
}

}  // namespace arachne
