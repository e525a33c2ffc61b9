// The learned planner's episodes as template structures, and the
// structural moves of its local refinement (learned_planner.h,
// LearnedPlannerConfig::refinement_passes): changes of several decisions at
// once that a one-decision scan cannot reach through worse plans.
//
// An episode of the construction environment is a sequence of actions: per
// template a depth action d, then d pairs (device slot, TP action); STOP
// (0) ends it. A neighbour here is a sequence of templates that may not be
// legal on the cluster: the planner replays its actions while they are
// legal and hands the rest to the policy, so every neighbour still prices
// into a plan.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_LEARNED_EPISODE_MOVES_H_
#define ARACHNE_PLANNER_SERVICE_CORE_LEARNED_EPISODE_MOVES_H_

#include <array>
#include <vector>

#include "absl/types/span.h"

namespace arachne {

using StageActions = std::array<int, 2>;  // {device slot, TP action}
using TemplateActions = std::vector<StageActions>;

// An episode's actions read as templates. The trailing STOP, and a
// template cut short by the end of the actions, are not part of it.
std::vector<TemplateActions> ReadTemplates(absl::Span<const int> actions);

// The actions that build `templates` and then STOP.
std::vector<int> WriteTemplates(const std::vector<TemplateActions>& templates);

// Every structural neighbour of `templates`, for the type slots `slots`
// present on the cluster. Per template k of depth d:
//  - every slot on all stages, at each TP action (|slots| x 4), and keeping
//    each stage's TP on every prefix [0, i] and suffix [i, d), i > 0;
//  - every stage at each TP action (4);
//  - depth d/2, d-1, d+1 and 2d (within 1..16), stages resampled evenly;
//  - two stages of different choices swapped; a stage removed (d > 1); the
//    stage order reversed and rotated by 1..d-1;
//  - two neighbouring equal stages as one of twice the TP, a stage of TP
//    >= 2 as two of half the TP;
//  - a stage of every slot and TP inserted first and last (d < 16);
//  - the template removed (when there are others), merged with the next
//    (their stages in one template of depth <= 16) and swapped with it.
// A neighbour may equal `templates` (e.g. a type set on stages that have
// it); the caller skips those.
std::vector<std::vector<TemplateActions>> StructuralNeighbours(
    const std::vector<TemplateActions>& templates,
    absl::Span<const int> slots);

// The neighbours of one template among the regular structures: one
// contiguous run of stages per GPU type. The template's stages are grouped
// by type, the runs in the order of each type's first stage, each run's
// stages in their order; then: the grouping itself; two neighbouring runs
// swapped; one run at each TP action; one run with one stage fewer or
// more, half or twice as many (stages resampled evenly; a run of 0 drops
// the type unless it is the only one), within 1..16 stages in all; one
// run's first or last stage split into two of half the TP, or its first or
// last two equal stages merged into one of twice the TP; and for each slot
// of `slots` the template does not use, a one-stage run of it at each TP
// action first and last. The result may hold `t` itself and duplicates.
// With `pairs`, instead: from the grouping, every two runs changed together,
// each to any TP action with one stage fewer, as many or one more (a run
// of 0 drops its type), within 1..16 stages in all.
std::vector<TemplateActions> RunNeighbours(const TemplateActions& t,
                                           absl::Span<const int> slots,
                                           bool pairs = false);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_LEARNED_EPISODE_MOVES_H_
