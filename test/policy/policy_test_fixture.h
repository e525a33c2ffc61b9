// Shared inputs of the policy tests: the toy catalog, model and profiles of
// test/core/toy_fixture.h on a small two-type cluster, and a loaded shipped
// catalog for the tests that need real profiles.
#ifndef ARACHNE_TEST_POLICY_POLICY_TEST_FIXTURE_H_
#define ARACHNE_TEST_POLICY_POLICY_TEST_FIXTURE_H_

#include <memory>
#include <vector>

#include "glog/logging.h"
#include "planner_service/core/learned/construction_env.h"
#include "planner_service/core/cost/cost_model.h"
#include "test/core/toy_fixture.h"

namespace arachne::testing {

// Owns a toy cost model: 4 FAST + 2x4 SLOW GPUs unless told otherwise.
class ToyComposition {
 public:
  explicit ToyComposition(std::vector<std::pair<int, int>> nodes = {
                              {kFast, 4}, {kSlow, 4}, {kSlow, 4}})
      : cluster_(MakeCluster(catalog_, nodes)) {
    auto cm = CostModel::Create(catalog_, ToyModel(), ToyTraining(), cluster_,
                                profiles_);
    CHECK(cm.ok()) << cm.status();
    cm_ = std::make_unique<CostModel>(*std::move(cm));
  }
  const CostModel& cost_model() const { return *cm_; }
  ConstructionEnv Env(ConstructionEnvConfig config = {}) const {
    auto env = ConstructionEnv::Create(*cm_, config);
    CHECK(env.ok()) << env.status();
    return *std::move(env);
  }

 private:
  GpuCatalog catalog_ = ToyCatalog();
  ProfileStore profiles_ = ToyProfiles();
  Cluster cluster_;
  std::unique_ptr<CostModel> cm_;
};

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_POLICY_POLICY_TEST_FIXTURE_H_
