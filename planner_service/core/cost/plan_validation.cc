#include "planner_service/core/cost/plan_validation.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner_service/core/model/node_pool.h"

namespace arachne {

absl::Status ValidatePlan(const Plan& plan, const CostModel& cm) {
  const ModelSpec& model = cm.model();
  const Cluster& cluster = cm.cluster();
  const GpuCatalog& catalog = cm.catalog();
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (plan.templates.empty()) return invalid("templates: plan has no template");
  int64_t samples = 0;
  for (size_t t = 0; t < plan.templates.size(); ++t) {
    const Template& tmpl = plan.templates[t];
    const std::string where = absl::StrCat("templates[", t, "]");
    if (tmpl.stages.empty()) return invalid(where, ".stages: is empty");
    if (tmpl.depth() > model.num_layers) {
      return invalid(where, ".stages: ", tmpl.depth(),
                     " stages for a model of ", model.num_layers, " layers");
    }
    if (tmpl.replicas <= 0)
      return invalid(where, ".replicas: must be > 0, got ", tmpl.replicas);
    if (Log2Exact(tmpl.micro_batch_size) < 0 ||
        Log2Exact(tmpl.micro_batch_size) > kMaxMbsLog2) {
      return invalid(where, ".micro_batch_size: must be a power of two <= ",
                     1 << kMaxMbsLog2, ", got ", tmpl.micro_batch_size);
    }
    if (tmpl.total_micro_batches < tmpl.replicas) {
      return invalid(where, ".total_micro_batches: ", tmpl.total_micro_batches,
                     " leaves a replica of ", tmpl.replicas, " without work");
    }
    samples += static_cast<int64_t>(tmpl.total_micro_batches) *
               tmpl.micro_batch_size;
    int next_layer = 0;
    for (int s = 0; s < tmpl.depth(); ++s) {
      const Stage& st = tmpl.stages[s];
      const std::string sw = absl::StrCat(where, ".stages[", s, "]");
      if (st.gpu_type < 0 || st.gpu_type >= catalog.size())
        return invalid(sw, ".gpu_type: unknown type index ", st.gpu_type);
      const std::string& gpu = catalog.type(st.gpu_type).id;
      const int max_node = cluster.MaxNodeSizeOfType(st.gpu_type);
      if (max_node == 0)
        return invalid(sw, ".gpu_type: the cluster has no ", gpu, " GPUs");
      if (Log2Exact(st.tp) < 0 || st.tp > max_node) {
        return invalid(sw, ".tp: must be a power of two <= ", max_node,
                       " (largest ", gpu, " node), got ", st.tp);
      }
      if (st.layer_begin != next_layer || st.layer_end <= st.layer_begin) {
        return invalid(sw, ".layers: [", st.layer_begin, ", ", st.layer_end,
                       ") must start at layer ", next_layer,
                       " and hold at least one layer");
      }
      next_layer = st.layer_end;
      const int w = st.tp * tmpl.replicas;
      const ExpertTiling& x = st.tiling;
      if (model.MoeLayersIn(st.layer_begin, st.layer_end) == 0) {
        if (!(x == ExpertTiling{}))
          return invalid(sw, ".expert_tiling: a stage without MoE layers must "
                             "be 1x1x1, got ", x.ep, "x", x.etp, "x", x.edp);
      } else {
        if (x.ep <= 0 || x.etp <= 0 || x.edp <= 0 ||
            x.ep * x.etp * x.edp != w) {
          return invalid(sw, ".expert_tiling: ep*etp*edp = ", x.ep, "*", x.etp,
                         "*", x.edp, " must equal the stage's ", w,
                         " GPUs (tp ", st.tp, " x ", tmpl.replicas,
                         " replicas)");
        }
        if (model.moe.num_experts % x.ep != 0) {
          return invalid(sw, ".expert_tiling.ep: ", x.ep,
                         " does not divide the ", model.moe.num_experts,
                         " experts");
        }
        if (Log2Exact(x.etp) < 0 || x.etp > max_node) {
          return invalid(sw, ".expert_tiling.etp: must be a power of two <= ",
                         max_node, ", got ", x.etp);
        }
      }
    }
    if (next_layer != model.num_layers) {
      return invalid(where, ".stages: cover layers [0, ", next_layer,
                     ") but the model has ", model.num_layers);
    }
    if (static_cast<int>(tmpl.placement.size()) !=
        tmpl.replicas * tmpl.depth()) {
      return invalid(where, ".placement: has ", tmpl.placement.size(),
                     " entries, expected replicas*stages = ",
                     tmpl.replicas * tmpl.depth());
    }
    for (int r = 0; r < tmpl.replicas; ++r) {
      for (int s = 0; s < tmpl.depth(); ++s) {
        const StagePlacement& p = tmpl.at(r, s);
        const std::string pw =
            absl::StrCat(where, ".placement[", r, "].stages[", s, "]");
        if (p.node < 0 || p.node >= cluster.num_nodes())
          return invalid(pw, ".node: no node with index ", p.node);
        const Node& node = cluster.node(p.node);
        if (node.gpu_type != tmpl.stages[s].gpu_type) {
          return invalid(pw, ".node: \"", node.name, "\" has ",
                         catalog.type(node.gpu_type).id, " GPUs but the stage "
                         "needs ", catalog.type(tmpl.stages[s].gpu_type).id);
        }
        if (static_cast<int>(p.gpus.size()) != tmpl.stages[s].tp) {
          return invalid(pw, ".gpus: ", p.gpus.size(),
                         " GPUs for a TP group of ", tmpl.stages[s].tp,
                         " (a TP group lies inside one node)");
        }
      }
    }
    for (int s = 0; s < tmpl.depth(); ++s) {
      if (cm.model().MoeLayersIn(tmpl.stages[s].layer_begin,
                                 tmpl.stages[s].layer_end) > 0 &&
          !GroupsStayInNode(tmpl, s, tmpl.stages[s].tiling.etp)) {
        return invalid(where, ".stages[", s, "].expert_tiling.etp: ETP group of ",
                       tmpl.stages[s].tiling.etp, " GPUs crosses a node");
      }
    }
  }
  NodePool pool(cluster);
  if (absl::Status s = pool.Take(plan); !s.ok()) return s;
  if (samples != cm.training().global_batch) {
    return invalid("templates: micro-batches hold ", samples,
                   " sequences but the global batch is ",
                   cm.training().global_batch);
  }
  return cm.Predict(plan).status();
}

namespace {

// The least memory one stage can need on `type`: a middle stage of one layer
// (MoE where the model has them) at `tp`, one micro-batch in flight.
StageMemory LeastStageMemory(const CostModel& cm, int type, int tp) {
  const ModelSpec& model = cm.model();
  Plan plan;
  Template t;
  for (int s = 0; s < 3; ++s) {
    Stage st;
    st.gpu_type = type;
    st.tp = tp;
    t.stages.push_back(st);
  }
  const int L = model.num_layers;
  t.stages[0].layer_end = L - 2;
  t.stages[1].layer_begin = L - 2;
  t.stages[1].layer_end = L - 1;
  t.stages[2].layer_begin = L - 1;
  t.stages[2].layer_end = L;
  if (model.is_moe()) {
    int ep = tp;
    while (model.moe.num_experts % ep != 0) ep /= 2;
    t.stages[1].tiling = ExpertTiling{ep, 1, tp / ep};
  }
  t.replicas = 1;
  t.total_micro_batches = 1;
  plan.templates.push_back(t);
  return cm.StageMemoryOf(plan, 0, 1);
}

// The largest TP degree `type` supports at micro-batch 1; 0 for none.
int LargestTp(const CostModel& cm, int type) {
  int tp = 0;
  for (int t = 1; t <= cm.cluster().MaxNodeSizeOfType(type); t *= 2)
    if (cm.Supports(type, t, 1)) tp = t;
  return tp;
}

}  // namespace

bool SomeLayerFits(const CostModel& cm) {
  // Too few layers for the three-stage probe: assume it may fit.
  if (cm.model().num_layers < 3) return true;
  for (int type : cm.cluster().types_present()) {
    const int tp = LargestTp(cm, type);
    if (tp == 0) continue;
    if (LeastStageMemory(cm, type, tp).total_gib() <= cm.UsableMemoryGib(type))
      return true;
  }
  return false;
}

std::string ExplainNoFit(const CostModel& cm) {
  const ModelSpec& model = cm.model();
  if (model.num_layers < 3) return "";
  std::vector<std::string> parts;
  for (int type : cm.cluster().types_present()) {
    const int tp = LargestTp(cm, type);
    if (tp == 0) {
      parts.push_back(absl::StrCat(cm.catalog().type(type).id,
                                   ": no profile entry at micro-batch 1"));
      continue;
    }
    const StageMemory m = LeastStageMemory(cm, type, tp);
    parts.push_back(absl::StrFormat(
        "%s: one layer needs %.1f GiB per GPU at tp=%d, micro-batch 1 "
        "(%.1f GiB usable)",
        cm.catalog().type(type).id, m.total_gib(), tp,
        cm.UsableMemoryGib(type)));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace arachne
