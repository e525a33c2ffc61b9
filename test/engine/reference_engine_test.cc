// The reference engine computes the same iterations under every plan: the
// same 8 iterations of tiny-gpt under one stage, PP 4, TP 2, a mixed
// PP x TP x DP plan and a heterogeneous two-template plan agree in loss
// (1e-4 relative) and parameters (1e-5), and the loss falls.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/engine/engine_harness.h"

namespace arachne::agent {
namespace {

using testing::MakeTemplate;
using testing::RunPlan;
using testing::RunResult;
using testing::TestCluster;
using testing::TinyJob;
using ::testing::HasSubstr;

constexpr int kIterations = 8;

Plan OneStage() {
  int gpu = 0;
  return Plan{{MakeTemplate({{1, 0, 4}}, 1, 4, 4, 0, &gpu)}};
}
Plan Pp4() {
  int gpu = 0;
  return Plan{{MakeTemplate({{1, 0, 1}, {1, 1, 2}, {1, 2, 3}, {1, 3, 4}}, 1,
                            2, 8, 0, &gpu)}};
}
Plan Tp2() {
  int gpu = 0;
  return Plan{{MakeTemplate({{2, 0, 4}}, 1, 4, 4, 0, &gpu)}};
}
// Two replicas of a pipeline whose TP 2 stage feeds a TP 1 stage; 8
// micro-batches of 2, 4 per replica.
Plan PpTpDp() {
  int gpu = 0;
  return Plan{{MakeTemplate({{2, 0, 3}, {1, 3, 4}}, 2, 2, 8, 0, &gpu)}};
}
// Two templates of different depth, TP, layer split and micro-batch size:
// 8 samples in 4 micro-batches of 2 on a PP 2 (TP 1 -> TP 2) pipeline, and
// 8 samples in 2 micro-batches of 4 over two one-stage replicas.
Plan Heterogeneous() {
  int gpu = 0;
  Template a = MakeTemplate({{1, 0, 1}, {2, 1, 4}}, 1, 2, 4, 0, &gpu);
  Template b = MakeTemplate({{1, 0, 4}}, 2, 4, 2, 0, &gpu);
  return Plan{{a, b}};
}

// Largest |a - b| over the fp32 master weights.
double MaxMasterDifference(const migration::ModelState& state,
                           const FullState& a, const FullState& b,
                           std::string* where) {
  double worst = 0;
  for (int id = 0; id < state.num_tensors(); ++id) {
    if (state.tensor(id).kind != migration::StateKind::kMasterWeight) continue;
    const auto& x = a.tensors[id];
    const auto& y = b.tensors[id];
    for (size_t o = 0; o + 4 <= x.size(); o += 4) {
      float u, v;
      std::memcpy(&u, x.data() + o, 4);
      std::memcpy(&v, y.data() + o, 4);
      if (std::abs(u - v) > worst) {
        worst = std::abs(u - v);
        *where = state.tensor(id).name;
      }
    }
  }
  return worst;
}

class ReferenceEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto r = RunPlan(TinyJob(), OneStage(), TestCluster(), kIterations);
    ASSERT_TRUE(r.ok()) << r.status();
    reference_ = new RunResult(*std::move(r));
  }
  static void TearDownTestSuite() { delete reference_; }
  static RunResult* reference_;

  void ExpectMatchesReference(const Plan& plan) {
    auto r = RunPlan(TinyJob(), plan, TestCluster(), kIterations);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->losses.size(), reference_->losses.size());
    for (size_t i = 0; i < r->losses.size(); ++i) {
      EXPECT_NEAR(r->losses[i], reference_->losses[i],
                  1e-4 * reference_->losses[i])
          << "iteration " << i + 1;
    }
    auto state = ReferenceModelState(TinyJob());
    std::string where;
    const double d =
        MaxMasterDifference(*state, r->state, reference_->state, &where);
    EXPECT_LE(d, 1e-5) << where;
    RecordProperty("max_master_difference", std::to_string(d));
    std::printf("max |master - one-stage master| = %.3g (%s); last loss %.6f vs %.6f\n",
                d, where.c_str(), r->losses.back(), reference_->losses.back());
  }
};
RunResult* ReferenceEngineTest::reference_ = nullptr;

TEST_F(ReferenceEngineTest, LossFallsOnTheSyntheticCorpus) {
  const std::vector<double>& l = reference_->losses;
  ASSERT_EQ(l.size(), kIterations);
  EXPECT_NEAR(l[0], std::log(512.0), 0.1);  // uniform over the vocabulary
  EXPECT_LT(l.back(), l[0] - 0.3);
}

TEST_F(ReferenceEngineTest, PipelineOfFourMatchesOneStage) {
  ExpectMatchesReference(Pp4());
}
TEST_F(ReferenceEngineTest, TensorParallelTwoMatchesOneStage) {
  ExpectMatchesReference(Tp2());
}
TEST_F(ReferenceEngineTest, PipelineTensorAndDataParallelMatchOneStage) {
  ExpectMatchesReference(PpTpDp());
}
TEST_F(ReferenceEngineTest, HeterogeneousTwoTemplatePlanMatchesOneStage) {
  ExpectMatchesReference(Heterogeneous());
}

TEST_F(ReferenceEngineTest, SameStructureOnOtherGpusIsBitIdentical) {
  int gpu = 4;  // GPUs 4..7 instead of 0..3
  Plan moved{{MakeTemplate({{1, 0, 1}, {1, 1, 2}, {1, 2, 3}, {1, 3, 4}}, 1, 2,
                           8, 0, &gpu)}};
  auto a = RunPlan(TinyJob(), Pp4(), TestCluster(), 3);
  auto b = RunPlan(TinyJob(), moved, TestCluster(), 3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->losses, b->losses);
  EXPECT_TRUE(a->state == b->state);
}

// MoE: tiny-moe (layer 0 dense, then 4 experts, top 2, one shared expert)
// under several expert tilings against one GPU, all with micro-batches of 4
// sequences. (With micro-batches of 2 the fp32 rounding differs enough that
// a near-tie in the router picked another expert for one token at iteration
// 3, and that expert's weights moved 9e-3 apart: top-k routing is not
// continuous, so only the micro-batch size is held fixed here.)
JobSpec MoeJob() {
  JobSpec job = TinyJob();
  job.model = *ResolveModel("tiny-moe");
  return job;
}
Plan WithTiling(Plan p, ExpertTiling x) {
  for (Template& t : p.templates) {
    for (Stage& s : t.stages) s.tiling = x;
  }
  return p;
}

TEST(ReferenceEngineMoe, ExpertTilingsMatchOneGpu) {
  const JobSpec job = MoeJob();
  int gpu = 0;
  auto one = RunPlan(job, Plan{{MakeTemplate({{1, 0, 4}}, 1, 4, 4, 0, &gpu)}},
                     TestCluster(), kIterations);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_LT(one->losses.back(), one->losses[0] - 0.3);
  auto state = ReferenceModelState(job);
  struct Case {
    const char* what;
    Plan plan;
  };
  std::vector<Case> cases;
  gpu = 0;
  cases.push_back({"EP 2 over 2 replicas",
                   WithTiling(Plan{{MakeTemplate({{1, 0, 4}}, 2, 4, 4, 0, &gpu)}},
                              {2, 1, 1})});
  gpu = 0;
  cases.push_back({"TP 2, ETP 2",
                   WithTiling(Plan{{MakeTemplate({{2, 0, 4}}, 1, 4, 4, 0, &gpu)}},
                              {1, 2, 1})});
  gpu = 0;
  cases.push_back(
      {"PP 2 x TP 2 x 2 replicas, EP 2 x EDP 2",
       WithTiling(Plan{{MakeTemplate({{2, 0, 2}, {2, 2, 4}}, 2, 4, 4, 0, &gpu)}},
                  {2, 1, 2})});
  gpu = 0;
  cases.push_back({"TP 2 x 2 replicas, EP 2 x EDP 2, mbs 4",
                   WithTiling(Plan{{MakeTemplate({{2, 0, 4}}, 2, 4, 4, 0, &gpu)}},
                              {2, 1, 2})});
  gpu = 0;
  cases.push_back({"TP 1 x 2 replicas, EDP 2",
                   WithTiling(Plan{{MakeTemplate({{1, 0, 4}}, 2, 4, 4, 0, &gpu)}},
                              {1, 1, 2})});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = RunPlan(job, c.plan, TestCluster(), kIterations);
    ASSERT_TRUE(r.ok()) << r.status();
    for (size_t i = 0; i < r->losses.size(); ++i) {
      EXPECT_NEAR(r->losses[i], one->losses[i], 1e-4 * one->losses[i])
          << "iteration " << i + 1;
    }
    std::string where;
    const double d = MaxMasterDifference(*state, r->state, one->state, &where);
    EXPECT_LE(d, 1e-5) << where;
    std::printf("%s: max |master - one GPU| = %.3g (%s); last loss %.6f vs %.6f\n",
                c.what, d, where.c_str(), r->losses.back(), one->losses.back());
  }
}

TEST(ReferenceEnginePlanCheck, RejectsWhatItCannotRunNamingTheField) {
  JobSpec job = TinyJob();
  int gpu = 0;
  Plan tp3{{MakeTemplate({{3, 0, 4}}, 1, 4, 4, 0, &gpu)}};
  EXPECT_THAT(CheckReferencePlan(job, tp3).message(),
              HasSubstr("plan.templates[0].stages[0].tp: 3 does not divide "
                        "the model's num_heads (8)"));
  gpu = 0;
  Plan short_batch{{MakeTemplate({{1, 0, 4}}, 1, 4, 3, 0, &gpu)}};
  EXPECT_EQ(CheckReferencePlan(job, short_batch).message(),
            "plan: its micro-batches hold 12 samples per iteration, the "
            "global batch is 16");
  job.engine.learning_rate = -1;
  EXPECT_EQ(CheckReferencePlan(job, OneStage()).message(),
            "engine.learning_rate: must be a finite number > 0, got -1");
  // Token files are arachne_torch's; this engine says so before training.
  job.engine.learning_rate = 1e-3;
  job.engine.token_file = EngineConfig::TokenFile{"/data/tokens.bin", 2};
  const absl::Status token = CheckReferencePlan(job, OneStage());
  EXPECT_EQ(token.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(token.message(),
            "engine.token_file (/data/tokens.bin): the reference engine "
            "trains on the synthetic corpus only; run the job on "
            "arachne_torch (docs/pytorch.md) to train on a token file");
}

}  // namespace
}  // namespace arachne::agent
