#include "planner_service/core/learned/episode_moves.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Not;

// Depth 2: (slot 0, TP 2), (slot 1, TP 1); depth 1: (slot 1, TP 4); STOP.
const std::vector<int> kEpisode = {2, 0, 1, 1, 0, 1, 1, 2, 0};

TEST(EpisodeMovesTest, ReadsAndWritesTemplates) {
  const std::vector<TemplateActions> t = ReadTemplates(kEpisode);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_THAT(t[0], ElementsAre(StageActions{0, 1}, StageActions{1, 0}));
  EXPECT_THAT(t[1], ElementsAre(StageActions{1, 2}));
  EXPECT_EQ(WriteTemplates(t), kEpisode);
}

TEST(EpisodeMovesTest, ReadStopsAtATruncatedTemplateAndAtStop) {
  // The second template announces depth 3 but has one stage.
  EXPECT_EQ(ReadTemplates(std::vector<int>{1, 0, 0, 3, 1, 0}).size(), 1u);
  // An episode ended by the template limit has no STOP.
  EXPECT_EQ(ReadTemplates(std::vector<int>{1, 0, 0}).size(), 1u);
  EXPECT_TRUE(ReadTemplates(std::vector<int>{0}).empty());
  EXPECT_EQ(WriteTemplates({}), std::vector<int>{0});
}

TEST(EpisodeMovesTest, NeighboursHoldTheDocumentedMoves) {
  const std::vector<TemplateActions> t = ReadTemplates(kEpisode);
  const std::vector<int> slots = {0, 1};
  const std::vector<std::vector<TemplateActions>> n =
      StructuralNeighbours(t, slots);
  auto with_first = [&](TemplateActions first) {
    std::vector<TemplateActions> x = t;
    x[0] = std::move(first);
    return x;
  };
  // Uniform type and TP on the first template.
  EXPECT_THAT(n, Contains(with_first({{1, 3}, {1, 3}})));
  // Slot 1 on the prefix [0, 0], TPs kept.
  EXPECT_THAT(n, Contains(with_first({{1, 1}, {1, 0}})));
  // Swapped / reversed stages.
  EXPECT_THAT(n, Contains(with_first({{1, 0}, {0, 1}})));
  // A stage of TP 2 split into two of TP 1.
  EXPECT_THAT(n, Contains(with_first({{0, 0}, {0, 0}, {1, 0}})));
  // Depth doubled: each stage repeated.
  EXPECT_THAT(n, Contains(with_first({{0, 1}, {0, 1}, {1, 0}, {1, 0}})));
  // A stage inserted first.
  EXPECT_THAT(n, Contains(with_first({{1, 2}, {0, 1}, {1, 0}})));
  // Templates removed, merged, swapped.
  EXPECT_THAT(n, Contains(std::vector<TemplateActions>{t[1]}));
  EXPECT_THAT(n, Contains(std::vector<TemplateActions>{t[0]}));
  EXPECT_THAT(n, Contains(std::vector<TemplateActions>{
                     {{0, 1}, {1, 0}, {1, 2}}}));
  EXPECT_THAT(n, Contains(std::vector<TemplateActions>{t[1], t[0]}));
  // No slot the cluster lacks, no depth above 16, no empty template.
  for (const std::vector<TemplateActions>& x : n) {
    ASSERT_FALSE(x.empty());
    for (const TemplateActions& tt : x) {
      ASSERT_GE(tt.size(), 1u);
      ASSERT_LE(tt.size(), 16u);
      for (const StageActions& s : tt) {
        EXPECT_TRUE(s[0] == 0 || s[0] == 1) << s[0];
        EXPECT_GE(s[1], 0);
        EXPECT_LT(s[1], 4);
      }
    }
  }
}

TEST(EpisodeMovesTest, NeighbourCountOfOneStage) {
  // One template of one stage, one slot: 4 uniform TPs + 1 prefix + 4 TPs
  // + depth 2 + (TP 2: a split) + 8 insertions; no removal, merge or swap.
  const std::vector<TemplateActions> t = {{{0, 1}}};
  const std::vector<int> slots = {0};
  const std::vector<std::vector<TemplateActions>> n =
      StructuralNeighbours(t, slots);
  EXPECT_EQ(n.size(), 4u + 1 + 4 + 1 + 1 + 8);
  EXPECT_THAT(n, Not(Contains(std::vector<TemplateActions>{})));
  // Depth 16 is the limit: no doubling, insertion or split.
  const std::vector<TemplateActions> deep = {TemplateActions(16, {0, 1})};
  for (const auto& x : StructuralNeighbours(deep, slots))
    EXPECT_LE(x[0].size(), 16u);
}


// Figure 9(b)'s case in slots: the policy's [A100 tp4 x2, H100 tp4, A100
// tp4] (slot 1 = A100, slot 0 = H100, TP action 2 = TP 4).
const TemplateActions kMixed = {{1, 2}, {1, 2}, {0, 2}, {1, 2}};

TEST(EpisodeMovesTest, RunNeighboursGroupAndChangeOneRun) {
  const std::vector<int> slots = {0, 1, 2};
  const std::vector<TemplateActions> n = RunNeighbours(kMixed, slots);
  // The grouping: runs in the order of first use (A100, then H100).
  EXPECT_THAT(n, Contains(TemplateActions{{1, 2}, {1, 2}, {1, 2}, {0, 2}}));
  // The two runs swapped.
  EXPECT_THAT(n, Contains(TemplateActions{{0, 2}, {1, 2}, {1, 2}, {1, 2}}));
  // The A100 run at TP 2 (action 1), the H100 stage kept.
  EXPECT_THAT(n, Contains(TemplateActions{{1, 1}, {1, 1}, {1, 1}, {0, 2}}));
  // The A100 run one stage shorter, and the H100 run twice as long.
  EXPECT_THAT(n, Contains(TemplateActions{{1, 2}, {1, 2}, {0, 2}}));
  EXPECT_THAT(n, Contains(TemplateActions{{1, 2}, {1, 2}, {1, 2}, {0, 2},
                                          {0, 2}}));
  // The H100 run dropped (half of one stage is none).
  EXPECT_THAT(n, Contains(TemplateActions{{1, 2}, {1, 2}, {1, 2}}));
  // The H100 stage split into two of TP 2; the A100 run's last two stages
  // merged into one of TP 8 and its first split into two of TP 2.
  EXPECT_THAT(n, Contains(TemplateActions{{1, 2}, {1, 2}, {1, 2}, {0, 1},
                                          {0, 1}}));
  EXPECT_THAT(n, Contains(TemplateActions{{1, 2}, {1, 3}, {0, 2}}));
  EXPECT_THAT(n, Contains(TemplateActions{{1, 1}, {1, 1}, {1, 2}, {1, 2},
                                          {0, 2}}));
  // Slot 2, unused, as a one-stage run first or last, at any TP.
  EXPECT_THAT(n, Contains(TemplateActions{{2, 0}, {1, 2}, {1, 2}, {1, 2},
                                          {0, 2}}));
  EXPECT_THAT(n, Contains(TemplateActions{{1, 2}, {1, 2}, {1, 2}, {0, 2},
                                          {2, 3}}));
  // Only regular structures: each slot's stages contiguous.
  for (const TemplateActions& x : n) {
    ASSERT_GE(x.size(), 1u);
    ASSERT_LE(x.size(), 16u);
    for (size_t i = 0; i + 1 < x.size(); ++i) {
      for (size_t j = i + 2; j < x.size(); ++j) {
        if (x[i][0] == x[j][0]) {
          EXPECT_EQ(x[i + 1][0], x[i][0]);
        }
      }
    }
  }
}

TEST(EpisodeMovesTest, RunPairNeighboursChangeTwoRunsTogether) {
  const std::vector<int> slots = {0, 1};
  const std::vector<TemplateActions> n = RunNeighbours(kMixed, slots, true);
  // A100 run at TP 2 and one stage shorter, H100 run one stage longer: two
  // runs changed, which no single-run move reaches.
  const TemplateActions both = {{1, 1}, {1, 1}, {0, 2}, {0, 2}};
  EXPECT_THAT(n, Contains(both));
  EXPECT_THAT(RunNeighbours(kMixed, slots), Not(Contains(both)));
  // Each run: 4 TPs x 3 lengths (one stage fewer, as many, one more) less
  // itself (11 for the A100 run; 8 for the H100 run, whose 0 stages come
  // once whatever the TP), and nothing else: 11 x 8.
  EXPECT_EQ(n.size(), 11u * 8u);
  // One run only: no pairs.
  EXPECT_TRUE(RunNeighbours(TemplateActions{{0, 1}, {0, 1}}, slots, true)
                  .empty());
}

TEST(EpisodeMovesTest, RunNeighboursStayWithinSixteenStages) {
  TemplateActions deep(15, StageActions{0, 1});
  deep.push_back({1, 1});
  const std::vector<int> slots = {0, 1, 2};
  for (bool pairs : {false, true}) {
    for (const TemplateActions& x : RunNeighbours(deep, slots, pairs)) {
      EXPECT_GE(x.size(), 1u);
      EXPECT_LE(x.size(), 16u);
    }
  }
}

}  // namespace
}  // namespace arachne
