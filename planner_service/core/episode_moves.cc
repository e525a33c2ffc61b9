#include "planner_service/core/episode_moves.h"

#include <algorithm>
#include <utility>

#include "planner_service/core/construction_env.h"

namespace arachne {

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
      TemplateActions n(d);
      for (int i = 0; i < d; ++i) n[i] = t[static_cast<size_t>(i) * depth / d];
      with(std::move(n));
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

}  // namespace arachne
