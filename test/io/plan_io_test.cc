#include "planner_service/io/plan_io.h"
#include "planner_service/io/message_json.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/model_io.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

void ExpectSamePlan(const Plan& a, const Plan& b) {
  ASSERT_EQ(a.templates.size(), b.templates.size());
  for (size_t t = 0; t < a.templates.size(); ++t) {
    SCOPED_TRACE(t);
    const Template& x = a.templates[t];
    const Template& y = b.templates[t];
    EXPECT_EQ(x.replicas, y.replicas);
    EXPECT_EQ(x.micro_batch_size, y.micro_batch_size);
    EXPECT_EQ(x.total_micro_batches, y.total_micro_batches);
    ASSERT_EQ(x.stages.size(), y.stages.size());
    for (size_t s = 0; s < x.stages.size(); ++s) {
      EXPECT_EQ(x.stages[s].gpu_type, y.stages[s].gpu_type);
      EXPECT_EQ(x.stages[s].tp, y.stages[s].tp);
      EXPECT_EQ(x.stages[s].layer_begin, y.stages[s].layer_begin);
      EXPECT_EQ(x.stages[s].layer_end, y.stages[s].layer_end);
      EXPECT_EQ(x.stages[s].tiling, y.stages[s].tiling);
    }
    ASSERT_EQ(x.placement.size(), y.placement.size());
    for (size_t p = 0; p < x.placement.size(); ++p) {
      EXPECT_EQ(x.placement[p].node, y.placement[p].node);
      EXPECT_EQ(x.placement[p].gpus, y.placement[p].gpus);
    }
  }
}

class PlanIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    catalog_ = *LoadGpuCatalog();
    absl::StatusOr<Cluster> c = ParseCluster(R"(
nodes:
  - {name: a100-0, gpu: A100-40GB, gpus: 4}
  - {name: a6000-0, gpu: A6000, gpus: 4}
  - {name: a6000-1, gpu: A6000, gpus: 4}
)",
                                             "c.yaml", catalog_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    model_ = *ResolveModel("llama3-8b");
    a100_ = *catalog_.IndexOf("A100-40GB");
    a6000_ = *catalog_.IndexOf("A6000");

    // Template 0: 2 stages (A6000 TP2 -> A100 TP2), 2 replicas.
    Template t0;
    t0.stages = {Stage{a6000_, 2, 0, 12, {}}, Stage{a100_, 2, 12, 32, {}}};
    t0.replicas = 2;
    t0.micro_batch_size = 1;
    t0.total_micro_batches = 13;  // replica 0 runs 7, replica 1 runs 6
    t0.placement = {{1, {0, 1}}, {0, {0, 1}}, {1, {2, 3}}, {0, {2, 3}}};
    // Template 1: one A6000 TP4 stage with all layers.
    Template t1;
    t1.stages = {Stage{a6000_, 4, 0, 32, {}}};
    t1.replicas = 1;
    t1.micro_batch_size = 2;
    t1.total_micro_batches = 3;
    t1.placement = {{2, {0, 1, 2, 3}}};
    plan_.templates = {t0, t1};

    prediction_.iteration_time_s = 5.5;
    prediction_.throughput_iters_per_s = 1 / 5.5;
    prediction_.tokens_per_s = 12345;
    prediction_.mfu = 0.41;
    prediction_.usd_per_hour = 12.5;
    prediction_.max_memory_gib = 33.5;
    prediction_.breakdown.compute_s = 4;
    prediction_.breakdown.bubble_s = 1;
    prediction_.breakdown.dp_sync_s = 0.5;
    prediction_.stage_memory = {{{20, 10, 3.5}, {15, 5, 1}}, {{30, 2, 1.5}}};
  }

  Json ToJson() {
    return PlanToJson(plan_, prediction_, cluster_, catalog_, model_,
                      training_);
  }
  std::string ErrorOf(const Json& j) {
    absl::StatusOr<Plan> p = PlanFromJson(j, cluster_, catalog_, "plan.json");
    EXPECT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(p.status().message());
  }

  GpuCatalog catalog_;
  Cluster cluster_;
  ModelSpec model_;
  TrainingConfig training_;
  Plan plan_;
  Prediction prediction_;
  int a100_ = -1, a6000_ = -1;
};

TEST_F(PlanIoTest, WritesTheDocumentedShape) {
  Json j = ToJson();
  EXPECT_EQ(j["model"], "llama3-8b");
  EXPECT_EQ(j["training"]["seq_len"], 2048);
  EXPECT_EQ(j["training"]["precision"], "bf16");
  EXPECT_DOUBLE_EQ(j["iteration_time_s"].get<double>(), 5.5);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 12345);
  EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.41);
  EXPECT_DOUBLE_EQ(j["usd_per_hour"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j["max_memory_gib"].get<double>(), 33.5);
  EXPECT_EQ(j["unused_gpus"], 12 - 12);
  for (const char* k : {"compute_s", "tp_comm_s", "p2p_s", "bubble_s",
                        "dp_sync_s", "all_to_all_s", "optimizer_s"}) {
    EXPECT_TRUE(j["breakdown"].contains(k)) << k;
  }
  EXPECT_DOUBLE_EQ(j["breakdown"]["bubble_s"].get<double>(), 1);
  const Json& t0 = j["templates"][0];
  EXPECT_EQ(t0["replicas"], 2);
  EXPECT_EQ(t0["micro_batches"], 7);
  EXPECT_EQ(t0["total_micro_batches"], 13);
  EXPECT_EQ(t0["stages"][0]["gpu_type"], "A6000");
  EXPECT_EQ(t0["stages"][0]["layers"], Json::parse("[0, 12]"));
  EXPECT_DOUBLE_EQ(t0["stages"][0]["memory_gib"].get<double>(), 33.5);
  EXPECT_FALSE(t0["stages"][0].contains("expert_tiling"));  // dense model
  EXPECT_EQ(t0["placement"][1]["stages"][0],
            Json::parse(R"({"node": "a6000-0", "gpus": [2, 3]})"));
  EXPECT_EQ(t0["placement"][1]["stages"][1],
            Json::parse(R"({"node": "a100-0", "gpus": [2, 3]})"));
}

TEST_F(PlanIoTest, RoundTrips) {
  Json j = ToJson();
  absl::StatusOr<Plan> p = PlanFromJson(j, cluster_, catalog_);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectSamePlan(*p, plan_);
  // Through text too, and with the caller's extra fields.
  j["planner"] = "arachne";
  j["planning_time_s"] = 0.2;
  absl::StatusOr<Json> reparsed = ParseJsonOrYaml(j.dump(2), "plan.json");
  ASSERT_TRUE(reparsed.ok());
  p = PlanFromJson(*reparsed, cluster_, catalog_);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectSamePlan(*p, plan_);
}

TEST_F(PlanIoTest, MoeStagesCarryExpertTiling) {
  model_ = *ResolveModel("mixtral-8x7b");
  plan_.templates[0].stages[1].tiling = ExpertTiling{2, 1, 2};
  Json j = ToJson();
  EXPECT_EQ(j["templates"][0]["stages"][1]["expert_tiling"],
            Json::parse(R"({"ep": 2, "etp": 1, "edp": 2})"));
  EXPECT_EQ(j["templates"][0]["stages"][0]["expert_tiling"],
            Json::parse(R"({"ep": 1, "etp": 1, "edp": 1})"));
  absl::StatusOr<Plan> p = PlanFromJson(j, cluster_, catalog_);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectSamePlan(*p, plan_);
}

TEST_F(PlanIoTest, UnusedGpusCountsTheRest) {
  plan_.templates.pop_back();
  EXPECT_EQ(ToJson()["unused_gpus"], 4);
}

TEST_F(PlanIoTest, MicroBatchesMayStandInForTotal) {
  Json j = ToJson();
  j["templates"][1].erase("total_micro_batches");
  j["templates"][0].erase("total_micro_batches");
  absl::StatusOr<Plan> p = PlanFromJson(j, cluster_, catalog_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->templates[0].total_micro_batches, 14);  // 7 * 2 replicas
  EXPECT_EQ(p->templates[1].total_micro_batches, 3);

  j["templates"][0]["total_micro_batches"] = 13;
  j["templates"][0]["micro_batches"] = 6;
  EXPECT_EQ(ErrorOf(j),
            "plan.json: templates[0].micro_batches: 6 does not match "
            "total_micro_batches 13 over 2 replicas (busiest replica runs 7)");
  j["templates"][0].erase("total_micro_batches");
  j["templates"][0].erase("micro_batches");
  EXPECT_EQ(ErrorOf(j),
            "plan.json: templates[0]: missing required field "
            "\"total_micro_batches\"");
}

TEST_F(PlanIoTest, ReadsThePreV1PlacementRows) {
  // Plan files written before the schema gave a replica as the bare list
  // of its stages; they still read, to the same plan.
  Json j = ToJson();
  for (Json& t : j["templates"]) {
    for (Json& row : t["placement"]) row = Json(row["stages"]);
  }
  ASSERT_TRUE(j["templates"][0]["placement"][1].is_array());
  absl::StatusOr<Plan> p = PlanFromJson(j, cluster_, catalog_, "plan.json");
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectSamePlan(*p, plan_);
  j["templates"][0]["placement"][1][0]["node"] = "a6000-9";
  EXPECT_EQ(ErrorOf(j),
            "plan.json: templates[0].placement[1].stages[0].node: unknown "
            "node \"a6000-9\" (not in the cluster)");
}

TEST_F(PlanIoTest, WrittenFilesAreThePlanDocumentMessage) {
  v1::PlanDocument document;
  ASSERT_TRUE(MessageFromJson(ToJson(), "plan.json", "", &document).ok());
  EXPECT_EQ(document.model(), model_.name);
  ASSERT_EQ(document.templates_size(), 2);
  EXPECT_EQ(document.templates(0).placement(1).stages(0).node(), "a6000-0");
  EXPECT_EQ(document.templates(0).total_micro_batches(), 13);
  EXPECT_FALSE(document.has_planner());  // the caller's to add
}

TEST_F(PlanIoTest, UnknownNodeNamesThePath) {
  Json j = ToJson();
  j["templates"][0]["placement"][1]["stages"][0]["node"] = "a6000-9";
  EXPECT_EQ(ErrorOf(j),
            "plan.json: templates[0].placement[1].stages[0].node: unknown node "
            "\"a6000-9\" (not in the cluster)");
}

TEST_F(PlanIoTest, StructuralErrors) {
  Json j = ToJson();
  j["templates"][0]["stages"][1]["gpu_typ"] = "A100";
  EXPECT_THAT(ErrorOf(j), HasSubstr("plan.json: templates[0].stages[1]: "
                                    "unknown field \"gpu_typ\""));

  j = ToJson();
  j["templates"][1]["stages"][0]["gpu_type"] = "Z80";
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("plan.json: templates[1].stages[0].gpu_type: "
                        "unknown GPU type \"Z80\""));

  j = ToJson();
  j["templates"][1]["stages"][0]["gpu_type"] = "rtx-a6000";  // alias is fine
  ASSERT_TRUE(PlanFromJson(j, cluster_, catalog_).ok());

  j = ToJson();
  j["templates"][0]["stages"][0]["layers"] = {12, 12};
  EXPECT_EQ(ErrorOf(j),
            "plan.json: templates[0].stages[0].layers: must be [begin, end] "
            "with 0 <= begin < end, got [12,12]");

  j = ToJson();
  j["templates"][0]["stages"][0]["tp"] = 0;
  EXPECT_EQ(
      ErrorOf(j),
      "plan.json: templates[0].stages[0].tp: must be an integer > 0, got 0");

  j = ToJson();
  j["templates"][0]["placement"].erase(1);
  EXPECT_EQ(ErrorOf(j),
            "plan.json: templates[0].placement: must have one row per replica "
            "(2), got 1");

  j = ToJson();
  j["templates"][0]["placement"][0]["stages"][1]["gpus"] = {0};
  EXPECT_EQ(ErrorOf(j),
            "plan.json: templates[0].placement[0].stages[1].gpus: must list tp = 2 "
            "GPUs, got 1");

  j = ToJson();
  j["templates"][0]["placement"][0]["stages"][1]["gpus"] = {0, -1};
  EXPECT_EQ(ErrorOf(j),
            "plan.json: templates[0].placement[0].stages[1].gpus[1]: must be a GPU "
            "index >= 0, got -1");

  j = ToJson();
  j["templates"][0]["placement"][0]["stages"][0]["rank"] = 3;
  EXPECT_THAT(ErrorOf(j), HasSubstr("plan.json: templates[0].placement[0].stages[0]: "
                                    "unknown field \"rank\""));

  j = ToJson();
  j["templates"][0]["replica"] = 3;
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("plan.json: templates[0]: unknown field \"replica\""));

  EXPECT_EQ(ErrorOf(Json::parse(R"({"templates": []})")),
            "plan.json: templates: must not be empty");
  EXPECT_EQ(ErrorOf(Json::parse(R"({"model": "x"})")),
            "plan.json: missing required field \"templates\"");
}

}  // namespace
}  // namespace arachne
