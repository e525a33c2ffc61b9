#include "planner_service/core/learned/episode_moves.h"

#include <algorithm>
#include <utility>

#include "planner_service/core/learned/construction_env.h"

namespace arachne {
namespace {

constexpr size_t kNone = ~size_t{0};  // no run replaced

// `stages` resampled evenly to `count` stages (stage i of the result is
// stage i * size / count of `stages`).
TemplateActions Resampled(const TemplateActions& stages, int count) {
  TemplateActions out;
  for (int i = 0; i < count; ++i)
    out.push_back(stages[static_cast<size_t>(i) * stages.size() / count]);
  return out;
}

}  // namespace

std::vector<TemplateActions> ReadTemplates(absl::Span<const int> actions) {
  std::vector<TemplateActions> templates;
  size_t i = 0;
  while (i < actions.size()) {
    const int depth = actions[i++];
    if (depth <= 0 || i + 2 * static_cast<size_t>(depth) > actions.size())
      break;
    TemplateActions t;
    for (int stage = 0; stage < depth; ++stage, i += 2)
      t.push_back({actions[i], actions[i + 1]});
    templates.push_back(std::move(t));
  }
  return templates;
}

std::vector<int> WriteTemplates(const std::vector<TemplateActions>& templates) {
  std::vector<int> actions;
  for (const TemplateActions& t : templates) {
    actions.push_back(static_cast<int>(t.size()));
    for (const StageActions& stage : t) {
      actions.push_back(stage[0]);
      actions.push_back(stage[1]);
    }
  }
  actions.push_back(0);
  return actions;
}

std::vector<std::vector<TemplateActions>> StructuralNeighbours(
    const std::vector<TemplateActions>& templates,
    absl::Span<const int> slots) {
  std::vector<std::vector<TemplateActions>> out;
  const int count = static_cast<int>(templates.size());
  for (int k = 0; k < count; ++k) {
    const TemplateActions& t = templates[k];
    const int depth = static_cast<int>(t.size());
    auto with = [&](TemplateActions replaced) {
      std::vector<TemplateActions> n = templates;
      n[k] = std::move(replaced);
      out.push_back(std::move(n));
    };
    for (int slot : slots) {
      for (int tp = 0; tp < kEnvTpSlots; ++tp)
        with(TemplateActions(depth, StageActions{slot, tp}));
      for (int cut = 0; cut < depth; ++cut) {
        TemplateActions prefix = t, suffix = t;
        for (int i = 0; i <= cut; ++i) prefix[i][0] = slot;
        for (int i = cut; i < depth; ++i) suffix[i][0] = slot;
        with(std::move(prefix));
        if (cut > 0) with(std::move(suffix));
      }
    }
    for (int tp = 0; tp < kEnvTpSlots; ++tp) {
      TemplateActions n = t;
      for (StageActions& stage : n) stage[1] = tp;
      with(std::move(n));
    }
    std::vector<int> depths = {depth / 2, depth - 1, depth + 1, 2 * depth};
    std::sort(depths.begin(), depths.end());
    depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
    for (int d : depths) {
      if (d < 1 || d > kEnvMaxDepth || d == depth) continue;
      with(Resampled(t, d));
    }
    for (int i = 0; i < depth; ++i) {
      for (int j = i + 1; j < depth; ++j) {
        if (t[i] == t[j]) continue;
        TemplateActions n = t;
        std::swap(n[i], n[j]);
        with(std::move(n));
      }
      if (depth > 1) {
        TemplateActions n = t;
        n.erase(n.begin() + i);
        with(std::move(n));
      }
    }
    if (depth > 1) with(TemplateActions(t.rbegin(), t.rend()));
    for (int r = 1; r < depth; ++r) {
      TemplateActions n = t;
      std::rotate(n.begin(), n.begin() + r, n.end());
      with(std::move(n));
    }
    // Two neighbouring stages of one type and TP as one stage of twice the
    // TP, and a stage of TP >= 2 as two of half the TP.
    for (int i = 0; i < depth; ++i) {
      if (i + 1 < depth && t[i] == t[i + 1] && t[i][1] + 1 < kEnvTpSlots) {
        TemplateActions n = t;
        n[i][1] += 1;
        n.erase(n.begin() + i + 1);
        with(std::move(n));
      }
      if (t[i][1] > 0 && depth < kEnvMaxDepth) {
        TemplateActions n = t;
        n[i][1] -= 1;
        n.insert(n.begin() + i, n[i]);
        with(std::move(n));
      }
    }
    if (depth < kEnvMaxDepth) {
      for (int slot : slots) {
        for (int tp = 0; tp < kEnvTpSlots; ++tp) {
          TemplateActions front = t, back = t;
          front.insert(front.begin(), StageActions{slot, tp});
          back.push_back(StageActions{slot, tp});
          with(std::move(front));
          with(std::move(back));
        }
      }
    }
    if (count > 1) {
      std::vector<TemplateActions> n = templates;
      n.erase(n.begin() + k);
      out.push_back(std::move(n));
    }
    if (k + 1 < count &&
        depth + static_cast<int>(templates[k + 1].size()) <= kEnvMaxDepth) {
      std::vector<TemplateActions> n = templates;
      n[k].insert(n[k].end(), n[k + 1].begin(), n[k + 1].end());
      n.erase(n.begin() + k + 1);
      out.push_back(std::move(n));
    }
    if (k + 1 < count) {
      std::vector<TemplateActions> n = templates;
      std::swap(n[k], n[k + 1]);
      out.push_back(std::move(n));
    }
  }
  return out;
}

std::vector<TemplateActions> RunNeighbours(const TemplateActions& t,
                                           absl::Span<const int> slots,
                                           bool pairs) {
  // The slots t uses, in order of first use: the order of the runs.
  std::vector<int> order;
  for (const StageActions& stage : t)
    if (std::find(order.begin(), order.end(), stage[0]) == order.end())
      order.push_back(stage[0]);
  // runs[i]: the stages of slot order[i], in the template's order.
  std::vector<TemplateActions> runs(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    for (const StageActions& stage : t)
      if (stage[0] == order[i]) runs[i].push_back(stage);
  // The runs joined in `sequence` (indices into runs), with run i replaced
  // by *ri and run j by *rj where given.
  auto join = [&](absl::Span<const size_t> sequence, size_t i = kNone,
                  const TemplateActions* ri = nullptr, size_t j = kNone,
                  const TemplateActions* rj = nullptr) {
    TemplateActions n;
    for (size_t k : sequence) {
      const TemplateActions& r = k == i ? *ri : k == j ? *rj : runs[k];
      n.insert(n.end(), r.begin(), r.end());
    }
    return n;
  };
  std::vector<size_t> sequence(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) sequence[i] = i;
  std::vector<TemplateActions> out;
  // Two runs changed together, each to any TP action with one stage fewer,
  // as many or one more: the replicas a template packs are set by its
  // scarcest type, so a better run of one type often needs the other's
  // run resized with it (Figure 9(b)'s 160 GPUs: from [A100 tp4 x5, H100
  // tp4 x5], where every single-run move is slower, to [A100 tp2 x4, H100
  // tp4 x4]; docs/learned-policy.md, Inference).
  if (pairs) {
    auto variants = [&](size_t i) {
      std::vector<TemplateActions> v;
      const int run = static_cast<int>(runs[i].size());
      for (int count : {run - 1, run, run + 1}) {
        for (int tp = 0; tp < kEnvTpSlots; ++tp) {
          if (count == 0 && tp > 0) break;  // no stages: one variant
          TemplateActions r = Resampled(runs[i], count);
          for (StageActions& stage : r) stage[1] = tp;
          if (r != runs[i]) v.push_back(std::move(r));
        }
      }
      return v;
    };
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::vector<TemplateActions> vi = variants(i);
      for (size_t j = i + 1; j < runs.size(); ++j) {
        for (const TemplateActions& rj : variants(j)) {
          for (const TemplateActions& ri : vi) {
            TemplateActions n = join(sequence, i, &ri, j, &rj);
            if (!n.empty() && static_cast<int>(n.size()) <= kEnvMaxDepth)
              out.push_back(std::move(n));
          }
        }
      }
    }
    return out;
  }
  const TemplateActions grouped = join(sequence);
  out.push_back(grouped);
  for (size_t i = 0; i + 1 < runs.size(); ++i) {
    std::vector<size_t> swapped = sequence;
    std::swap(swapped[i], swapped[i + 1]);
    out.push_back(join(swapped));
  }
  const int depth = static_cast<int>(t.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const int run = static_cast<int>(runs[i].size());
    for (int tp = 0; tp < kEnvTpSlots; ++tp) {
      TemplateActions r = runs[i];
      for (StageActions& stage : r) stage[1] = tp;
      out.push_back(join(sequence, i, &r));
    }
    for (int count : {run - 1, run + 1, run / 2, 2 * run}) {
      const int total = depth - run + count;
      if (count == run || count < 0 || total < 1 || total > kEnvMaxDepth)
        continue;
      const TemplateActions r = Resampled(runs[i], count);
      out.push_back(join(sequence, i, &r));
    }
    // The run's first or last stage split into two of half the TP, or its
    // first or last two stages of one TP merged into one of twice the TP:
    // the run keeps its GPUs (so the template its replica count) and moves
    // layers between TP degrees (Figure 7(d)'s 32+32: [A100 tp2 x4, H100
    // tp2 x4] to Metis's [A100 tp2 x4, H100 tp2 x3, H100 tp1 x2]).
    for (const bool last : {false, true}) {
      const size_t end = last ? static_cast<size_t>(run) - 1 : 0;
      const size_t next = last ? end - 1 : 1;
      if (runs[i][end][1] > 0 && depth < kEnvMaxDepth) {
        TemplateActions r = runs[i];
        r[end][1] -= 1;
        r.insert(r.begin() + static_cast<std::ptrdiff_t>(end), r[end]);
        out.push_back(join(sequence, i, &r));
      }
      if (run >= 2 && runs[i][end] == runs[i][next] &&
          runs[i][end][1] + 1 < kEnvTpSlots) {
        TemplateActions r = runs[i];
        r[end][1] += 1;
        r.erase(r.begin() + static_cast<std::ptrdiff_t>(next));
        out.push_back(join(sequence, i, &r));
      }
    }
  }
  if (depth < kEnvMaxDepth) {
    for (int slot : slots) {
      if (std::find(order.begin(), order.end(), slot) != order.end()) continue;
      for (int tp = 0; tp < kEnvTpSlots; ++tp) {
        TemplateActions front = grouped, back = grouped;
        front.insert(front.begin(), StageActions{slot, tp});
        back.push_back(StageActions{slot, tp});
        out.push_back(std::move(front));
        out.push_back(std::move(back));
      }
    }
  }
  return out;
}

}  // namespace arachne
