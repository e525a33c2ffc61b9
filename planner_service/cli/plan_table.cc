#include "planner_service/cli/plan_table.h"

#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace arachne {

std::string RenderPlanTable(const Plan& plan, const Prediction& p,
                            const CostModel& cm) {
  const Cluster& cluster = cm.cluster();
  const GpuCatalog& catalog = cm.catalog();
  std::string out;
  std::vector<std::string> mix;
  for (int type : cluster.types_present())
    mix.push_back(absl::StrCat(cluster.GpusOfType(type), " ",
                               catalog.type(type).id));
  absl::StrAppendFormat(
      &out, "%s on %d GPUs (%s), seq %d, global batch %d\n", cm.model().name,
      cluster.total_gpus(), absl::StrJoin(mix, " + "), cm.training().seq_len,
      cm.training().global_batch);
  absl::StrAppendFormat(
      &out,
      "iteration %.3f s | %.4f iter/s | %.0f tokens/s | MFU %.1f%% | "
      "$%.0f/h | peak memory %.1f GiB | unused GPUs %d\n",
      p.iteration_time_s, p.throughput_iters_per_s, p.tokens_per_s,
      100 * p.mfu, p.usd_per_hour, p.max_memory_gib,
      cluster.total_gpus() - plan.used_gpus());
  const TimeBreakdown& b = p.breakdown;
  absl::StrAppendFormat(
      &out,
      "time: compute %.3f s, TP comm %.3f, p2p %.3f, bubble %.3f, DP sync "
      "%.3f, all-to-all %.3f, optimizer %.3f\n",
      b.compute_s, b.tp_comm_s, b.p2p_s, b.bubble_s, b.dp_sync_s,
      b.all_to_all_s, b.optimizer_s);
  for (size_t j = 0; j < plan.templates.size(); ++j) {
    const Template& t = plan.templates[j];
    absl::StrAppendFormat(
        &out,
        "\ntemplate %d: %d replica%s x %d stage%s, micro-batch %d, %d "
        "micro-batches per replica (%d in all), %d GPUs\n",
        j + 1, t.replicas, t.replicas == 1 ? "" : "s", t.depth(),
        t.depth() == 1 ? "" : "s", t.micro_batch_size, t.max_micro_batches(),
        t.total_micro_batches, t.gpus_per_replica() * t.replicas);
    const bool moe = cm.model().is_moe();
    absl::StrAppendFormat(&out, "  %-5s %-13s %3s  %-9s %10s%s  %s\n", "stage",
                          "gpu", "tp", "layers", "mem/GPU",
                          moe ? "  ep x etp x edp" : "", "nodes (replica 1..n)");
    for (int s = 0; s < t.depth(); ++s) {
      const Stage& st = t.stages[s];
      std::vector<std::string> nodes;
      std::set<int> seen;
      for (int r = 0; r < t.replicas; ++r) {
        const int n = t.at(r, s).node;
        if (seen.insert(n).second) nodes.push_back(cluster.node(n).name);
      }
      std::string node_list = nodes.size() <= 4
                                  ? absl::StrJoin(nodes, ",")
                                  : absl::StrCat(nodes.front(), ",", nodes[1],
                                                 ",... (", nodes.size(),
                                                 " nodes)");
      const double mem = j < p.stage_memory.size() &&
                                 s < static_cast<int>(p.stage_memory[j].size())
                             ? p.stage_memory[j][s].total_gib()
                             : 0;
      std::string tiling =
          moe ? absl::StrFormat("  %4d x %3d x %3d", st.tiling.ep,
                                st.tiling.etp, st.tiling.edp)
              : "";
      absl::StrAppendFormat(&out, "  %-5d %-13s %3d  %-9s %6.1f GiB%s  %s\n",
                            s, catalog.type(st.gpu_type).id, st.tp,
                            absl::StrCat(st.layer_begin, "-", st.layer_end),
                            mem, tiling, node_list);
    }
  }
  return out;
}

}  // namespace arachne
