// The training framework through every way a training config is given: the
// `training` mapping of files (string and mapping forms, exact errors), the
// arachne.v1 messages (typed fields, the service's and job file's path),
// plan files (preset and overrides read back), and the CLI's --framework /
// --framework-set down to the cost model's prediction.
#include "planner_service/io/framework_io.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/api/proto_convert.h"
#include "planner_service/io/message_json.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/io/scenario_io.h"
#include "test/cli/cli_runner.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using testing::Cli;
using testing::CliRun;

const char kPresets[] =
    "megatron-core, megatron-deepspeed, deepspeed-zero1, fsdp, "
    "arachne-reference";

// The `training` mapping of a file whose text is `yaml`.
absl::StatusOr<TrainingConfig> ReadYaml(const std::string& yaml) {
  absl::StatusOr<nlohmann::json> json = ParseJsonOrYaml(yaml, "t.yaml");
  if (!json.ok()) return json.status();
  absl::StatusOr<ObjectReader> r = ObjectReader::Create(*json, "t.yaml", "");
  if (!r.ok()) return r.status();
  return ReadTrainingConfig(*r);
}

std::string YamlError(const std::string& yaml) {
  absl::StatusOr<TrainingConfig> t = ReadYaml(yaml);
  EXPECT_FALSE(t.ok()) << yaml;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(t.status().message());
}

FrameworkConfig DeepSpeedWithFlash() {
  FrameworkConfig f = FrameworkPresetConfig(FrameworkPreset::kMegatronDeepSpeed);
  f.attention = AttentionKernel::kFlash;
  f.micro_batch_fixed_s = 0.002;
  return f;
}

TEST(FrameworkYamlTest, AbsentIsMegatronCore) {
  absl::StatusOr<TrainingConfig> t = ReadYaml("training: {seq_len: 4096}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->framework, FrameworkConfig{});
  EXPECT_EQ(t->framework.preset, FrameworkPreset::kMegatronCore);
}

TEST(FrameworkYamlTest, StringFormIsThePreset) {
  absl::StatusOr<TrainingConfig> t =
      ReadYaml("training: {framework: megatron-deepspeed}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->framework,
            FrameworkPresetConfig(FrameworkPreset::kMegatronDeepSpeed));
  EXPECT_EQ(t->framework.attention, AttentionKernel::kMaterialized);
}

TEST(FrameworkYamlTest, MappingFormAppliesThePresetThenTheOverrides) {
  absl::StatusOr<TrainingConfig> t = ReadYaml(
      "training:\n"
      "  framework: {preset: megatron-deepspeed, attention: flash,\n"
      "              micro_batch_fixed_ms: 2}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->framework, DeepSpeedWithFlash());

  // No preset: megatron-core's; YAML booleans and floats as their fields.
  t = ReadYaml(
      "training: {framework: {sequence_parallel: false, fragmentation: 0.25,"
      " sharding: parameters, pipeline_scatter_gather: false}}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  FrameworkConfig want;
  want.sequence_parallel = false;
  want.pipeline_scatter_gather = false;
  want.fragmentation = 0.25;
  want.sharding = StateSharding::kParameters;
  EXPECT_EQ(t->framework, want);
}

TEST(FrameworkYamlTest, ErrorsNameTheFieldAndTheValue) {
  EXPECT_EQ(YamlError("training: {framework: megatron}\n"),
            absl::StrCat("t.yaml: training.framework: must be one of ",
                         kPresets, ", got \"megatron\""));
  EXPECT_EQ(YamlError("training: {framework: {preset: fsdp2}}\n"),
            absl::StrCat("t.yaml: training.framework.preset: must be one of ",
                         kPresets, ", got \"fsdp2\""));
  EXPECT_EQ(YamlError("training: {framework: {atention: flash}}\n"),
            absl::StrCat("t.yaml: training.framework: unknown field "
                         "\"atention\" (fields: ",
                         absl::StrJoin(FrameworkFieldNames(), ", "), ")"));
  EXPECT_EQ(YamlError("training: {framework: {attention: fast}}\n"),
            "t.yaml: training.framework.attention: must be flash, flash2 "
            "or materialized, got \"fast\"");
  EXPECT_EQ(YamlError("training: {framework: {fragmentation: 2}}\n"),
            "t.yaml: training.framework.fragmentation: must be a number in "
            "[0, 1], got \"2\"");
  EXPECT_EQ(YamlError("training: {framework: {overlap_grad_reduce: 1}}\n"),
            "t.yaml: training.framework.overlap_grad_reduce: must be true or "
            "false, got \"1\"");
  EXPECT_EQ(YamlError("training: {framework: {attention: [flash]}}\n"),
            "t.yaml: training.framework.attention: must be a string, number "
            "or boolean, got [\"flash\"]");
  EXPECT_EQ(YamlError("training: {framework: 3}\n"),
            "t.yaml: training.framework: must be a preset name or a mapping "
            "{preset: ..., <field>: <value>, ...}, got 3");
}

TEST(FrameworkProtoTest, EveryFieldHasATypedOptionalMessageField) {
  const google::protobuf::Descriptor* d = v1::Framework::descriptor();
  EXPECT_EQ(d->field_count(),
            static_cast<int>(FrameworkFieldNames().size()) + 1);
  for (const std::string& name : FrameworkFieldNames()) {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_TRUE(f->has_presence()) << name;
  }
}

TEST(FrameworkProtoTest, WritesThePresetAndTheOverridesAndReadsThemBack) {
  FrameworkConfig f = DeepSpeedWithFlash();
  f.fragmentation = 0.1;
  const v1::Framework m = FrameworkToMessage(f);
  EXPECT_EQ(m.preset(), "megatron-deepspeed");
  ASSERT_TRUE(m.has_attention());
  EXPECT_EQ(m.attention(), "flash");
  ASSERT_TRUE(m.has_micro_batch_fixed_ms());
  EXPECT_DOUBLE_EQ(m.micro_batch_fixed_ms(), 2);
  EXPECT_DOUBLE_EQ(m.fragmentation(), 0.1);
  EXPECT_FALSE(m.has_sharding());  // the preset's own value
  EXPECT_FALSE(m.has_attention_dropout());
  absl::StatusOr<FrameworkConfig> back = FrameworkFromMessage(m, "", "f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, f);

  // The service's path: TrainingConfig message -> TrainingSpec -> config.
  TrainingConfig t;
  t.seq_len = 4096;
  t.recompute = Recompute::kSelective;
  t.framework = f;
  absl::StatusOr<TrainingConfig> resolved =
      ResolveTraining(TrainingFromProto(TrainingToMessage(t)));
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->framework, f);
  EXPECT_EQ(resolved->seq_len, 4096);
  // And a client's: TrainingSpec -> message keeps the framework.
  EXPECT_EQ(TrainingToProto(TrainingFromProto(TrainingToMessage(t)))
                .framework()
                .attention(),
            "flash");
}

TEST(FrameworkProtoTest, RequestErrorsNameTheField) {
  const auto error = [](const v1::Framework& f) {
    v1::TrainingConfig t;
    *t.mutable_framework() = f;
    absl::StatusOr<TrainingConfig> r = ResolveTraining(TrainingFromProto(t));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  v1::Framework f;
  f.set_preset("nope");
  EXPECT_EQ(error(f), absl::StrCat("training.framework.preset: must be one "
                                   "of ",
                                   kPresets, ", got \"nope\""));
  f.Clear();
  f.set_attention("fast");
  EXPECT_EQ(error(f),
            "training.framework.attention: must be flash, flash2 or "
            "materialized, got \"fast\"");
  f.Clear();
  f.set_micro_batch_fixed_ms(-1);
  EXPECT_EQ(error(f),
            "training.framework.micro_batch_fixed_ms: must be a number in "
            "[0, 10000], got \"-1\"");
}

// A job file's `training` is the message, read through its JSON mapping:
// the mapping form with typed values.
TEST(FrameworkProtoTest, JobFileTrainingReadsTheMappingForm) {
  v1::TrainingConfig m;
  ASSERT_TRUE(ParseMessageText("framework: {preset: megatron-deepspeed, "
                               "attention: flash, micro_batch_fixed_ms: 2}\n",
                               "job.yaml", &m)
                  .ok());
  absl::StatusOr<TrainingConfig> t = TrainingFromMessage(m, "job.yaml", "training");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->framework, DeepSpeedWithFlash());
  absl::Status bad =
      ParseMessageText("framework: {atention: flash}\n", "job.yaml", &m);
  EXPECT_THAT(bad.message(),
              HasSubstr("job.yaml: framework: unknown field \"atention\""));
}

std::string Example(const std::string& name) {
  return std::string(ARACHNE_SOURCE_DIR) + "/examples/" + name;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       (std::to_string(::getpid()) + "-framework-" + name))
          .string();
  std::ofstream(path) << text;
  return path;
}

std::vector<std::string> PlanArgs(const std::string& command,
                                  std::vector<std::string> extra) {
  std::vector<std::string> args = {command, "--model", "gpt-neo-2.7b",
                                   "--cluster", Example("small-8.yaml"),
                                   "--format", "json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(FrameworkCliTest, PlanNamesTheFrameworkAndThePlanFileKeepsIt) {
  CliRun r = Cli(PlanArgs("plan", {"--planner", "template-search",
                                   "--framework", "megatron-deepspeed",
                                   "--framework-set", "attention=flash",
                                   "--framework-set",
                                   "micro_batch_fixed_ms=2"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["training"]["framework"],
            nlohmann::json({{"preset", "megatron-deepspeed"},
                            {"attention", "flash"},
                            {"micro_batch_fixed_ms", 2.0}}));
  absl::StatusOr<TrainingConfig> back = PlanTrainingFromJson(j, "plan.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->framework, DeepSpeedWithFlash());

  CliRun text = Cli({"plan", "--model", "gpt-neo-2.7b", "--cluster",
                     Example("small-8.yaml"), "--planner", "template-search",
                     "--framework", "megatron-deepspeed", "--framework-set",
                     "attention=flash"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out,
              HasSubstr("\nframework: megatron-deepspeed (attention=flash)\n"));
}

// The same plan priced with the preset's materialized attention and with
// flash: the flag reaches the cost model, and the s x s tensors cost time.
TEST(FrameworkCliTest, MaterializedAttentionPricesSlowerThanFlash) {
  CliRun planned = Cli(PlanArgs(
      "plan", {"--planner", "template-search", "--framework",
               "megatron-deepspeed"}));
  ASSERT_EQ(planned.code, 0) << planned.err;
  const std::string plan = WriteTemp("plan.json", planned.out);
  CliRun materialized = Cli(PlanArgs(
      "evaluate", {"--plan", plan, "--framework", "megatron-deepspeed"}));
  CliRun flash = Cli(PlanArgs("evaluate",
                              {"--plan", plan, "--framework",
                               "megatron-deepspeed", "--framework-set",
                               "attention=flash"}));
  ASSERT_EQ(materialized.code, 0) << materialized.err;
  ASSERT_EQ(flash.code, 0) << flash.err;
  const double t_materialized =
      nlohmann::json::parse(materialized.out)["iteration_time_s"];
  const double t_flash = nlohmann::json::parse(flash.out)["iteration_time_s"];
  EXPECT_DOUBLE_EQ(
      t_materialized,
      nlohmann::json::parse(planned.out)["iteration_time_s"].get<double>());
  EXPECT_GT(t_materialized, t_flash * 1.01)
      << "materialized " << t_materialized << " s, flash " << t_flash << " s";
  std::filesystem::remove(plan);
}

TEST(FrameworkCliTest, BadFlagsNameTheFlagAndTheValue) {
  CliRun r = Cli(PlanArgs("plan", {"--framework", "megatron"}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err, absl::StrCat("error: --framework: must be one of ",
                                kPresets, ", got \"megatron\"\n"));
  r = Cli(PlanArgs("evaluate", {"--plan", "unused.json", "--framework-set",
                                "attention"}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err,
            "error: --framework-set: expected FIELD=VALUE, got "
            "\"attention\"\n");
  r = Cli(PlanArgs("plan", {"--framework-set", "attention=fast"}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err,
            "error: --framework-set: framework.attention: must be flash, "
            "flash2 or materialized, got \"fast\"\n");
}

}  // namespace
}  // namespace arachne
