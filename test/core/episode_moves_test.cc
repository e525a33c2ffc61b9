#include "planner_service/core/episode_moves.h"

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

}  // namespace
}  // namespace arachne
