// `arachne profile measure` end to end on CPU: the arachne binary execs the
// arachne-profile beside it (LibTorch builds; skipped otherwise), which
// times a tiny model's layers and writes measured entries that
// ParseProfileCsv reads back and `arachne profile show --profiles-dir`
// reports as measured.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/profile_io.h"
#include "test/cli/cli_runner.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

const std::string kBin = std::string(ARACHNE_BINARY_DIR);
const std::string kArachne = kBin + "/planner_service/cli/arachne";
const std::string kData = std::string(ARACHNE_SOURCE_DIR) + "/test/data/profiler";

using ::arachne::testing::Shell;
using Result = ::arachne::testing::ShellRun;
using ::arachne::testing::FreshDir;

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool HaveProfiler() {
  return std::filesystem::exists(kBin +
                                 "/planner_service/cli/arachne-profile");
}

// A CPU run of `model_file` (tiny, so the run takes seconds).
Result Measure(const std::string& model_file, const std::string& extra,
               const std::string& out) {
  return Shell(kArachne + " profile measure --model " + kData + "/" +
               model_file +
               " --gpu A100-80GB --device cpu --seq 32 --warmup 1 --iters 3 "
               "--out " + out + " " + extra);
}

TEST(ProfileMeasureTest, TinyLlamaOnCpuWritesEveryMeasuredEntry) {
  if (!HaveProfiler()) GTEST_SKIP() << "a build without LibTorch";
  const auto dir = FreshDir("profile_measure_llama");
  const std::string csv = (dir / "tiny-llama.csv").string();
  Result r = Measure("tiny-llama.json", "--tp 1,2 --micro-batch 1,2", csv);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("wrote 12 measured entries to " + csv));
  EXPECT_THAT(r.out, HasSubstr("CPU timings only test the pipeline"));
  // The summary's measured/synthesized column.
  EXPECT_THAT(r.out, HasSubstr("measured/synthesized"));

  const std::string text = ReadAll(csv);
  absl::StatusOr<std::vector<ProfileEntry>> entries =
      ParseProfileCsv(text, csv);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 12u);
  // Past the '#' provenance lines, exactly SerializeProfileCsv's text.
  const size_t header = text.find(std::string(kProfileCsvHeader));
  ASSERT_NE(header, std::string::npos);
  EXPECT_EQ(text.substr(header), SerializeProfileCsv(*entries));

  absl::StatusOr<ModelSpec> model = ResolveModel(kData + "/tiny-llama.json");
  ASSERT_TRUE(model.ok()) << model.status();
  // h 64, 4 heads of 16, 2 KV heads, ffn 128: attention 64*(64+2*32) +
  // 64*64 + 2 norms of 64 = 12,416, SwiGLU 3*64*128 = 24,576.
  ASSERT_EQ(model->DenseLayerParams(), 36992);
  for (LayerKind kind :
       {LayerKind::kDense, LayerKind::kEmbedding, LayerKind::kLmHead}) {
    for (int tp : {1, 2}) {
      for (int mbs : {1, 2}) {
        SCOPED_TRACE(absl::StrCat(LayerKindName(kind), " tp ", tp, " mbs ",
                                  mbs));
        const ProfileEntry* found = nullptr;
        for (const ProfileEntry& e : *entries) {
          if (e.key == ProfileKey{"tiny-llama", kind, "A100-80GB", tp, mbs, 32})
            found = &e;
        }
        ASSERT_NE(found, nullptr);
        EXPECT_GT(found->fwd_ms, 0);
        EXPECT_GT(found->bwd_ms, 0);
        EXPECT_GT(found->activation_bytes, 0);
        EXPECT_EQ(found->source, ProfileSource::kMeasured);
        // No collective runs on one device: tp 1 has none, tp 2 the ring
        // estimate.
        if (tp == 1) {
          EXPECT_EQ(found->tp_comm_ms, 0);
        } else {
          EXPECT_GT(found->tp_comm_ms, 0);
        }
        const int64_t expected = kind == LayerKind::kDense ? 36992 / tp
                                 : kind == LayerKind::kEmbedding
                                     ? 256 * 64 / tp
                                     : (64 + 256 * 64) / tp;
        EXPECT_EQ(found->param_count, expected);
      }
    }
  }
  // The dense layer at tp 1 keeps, in fp32, at least its Q, K, V, the
  // attention output and the SwiGLU gate/up/product for T = 32 tokens:
  // 32 * 4 * (64 + 2*32 + 64 + 3*128) = 73,728 bytes.
  for (const ProfileEntry& e : *entries) {
    if (e.key.kind == LayerKind::kDense && e.key.tp == 1 && e.key.mbs == 1) {
      EXPECT_GE(e.activation_bytes, 73728);
    }
    // The embedding keeps its shard's int64 token ids and the bool mask of
    // the ids outside it, for all T tokens at every tp: 9 B per token.
    if (e.key.kind == LayerKind::kEmbedding) {
      EXPECT_EQ(e.activation_bytes, 9 * 32 * e.key.mbs) << e.key.tp;
    }
  }

  // Loaded as a profiles directory's measured/ file, `profile show` prices
  // with it.
  std::filesystem::create_directories(dir / "profiles" / "measured");
  std::filesystem::copy_file(csv, dir / "profiles" / "measured" /
                                      "tiny-llama.csv");
  Result show = Shell(kArachne + " profile show --model " + kData +
                      "/tiny-llama.json --gpu A100-80GB --tp 2 --mbs 2 "
                      "--seq 32 --kind dense --profiles-dir " +
                      (dir / "profiles").string() + " --format json");
  ASSERT_EQ(show.code, 0) << show.out;
  EXPECT_THAT(show.out, HasSubstr("\"source\": \"measured\""));
  EXPECT_THAT(show.out, HasSubstr("\"param_count\": 18496"));
  // Without the directory the same key is synthesized.
  Result synth = Shell(kArachne + " profile show --model " + kData +
                       "/tiny-llama.json --gpu A100-80GB --tp 2 --mbs 2 "
                       "--seq 32 --kind dense --format json");
  ASSERT_EQ(synth.code, 0) << synth.out;
  EXPECT_THAT(synth.out, HasSubstr("\"source\": \"synthesized\""));
}

TEST(ProfileMeasureTest, TinyGptLayerMatchesItsParameterCount) {
  if (!HaveProfiler()) GTEST_SKIP() << "a build without LibTorch";
  const auto dir = FreshDir("profile_measure_gpt");
  const std::string csv = (dir / "tiny-gpt2.csv").string();
  // GeLU, LayerNorm with biases, biased projections: at tp 1 the module
  // built must hold exactly DenseLayerParams (the profiler checks it).
  Result r = Measure("tiny-gpt2.json", "--tp 1,4 --micro-batch 1 --layers dense",
                     csv);
  ASSERT_EQ(r.code, 0) << r.out;
  absl::StatusOr<std::vector<ProfileEntry>> entries =
      ParseProfileCsv(ReadAll(csv), csv);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  // 64*192 + 64*64 + 256 biases + 4 norm vectors of 64 = 16,896; the MLP
  // 2*64*256 + 256 + 64 = 33,088.
  EXPECT_EQ((*entries)[0].param_count, 49984);
  EXPECT_EQ((*entries)[1].key.tp, 4);
  EXPECT_EQ((*entries)[1].param_count, 49984 / 4);
}

TEST(ProfileMeasureTest, BadInputIsNamed) {
  if (!HaveProfiler()) GTEST_SKIP() << "a build without LibTorch";
  const auto dir = FreshDir("profile_measure_bad");
  const std::string csv = (dir / "x.csv").string();
  Result tp = Measure("tiny-llama.json", "--tp 1,3", csv);
  EXPECT_EQ(tp.code, 2) << tp.out;
  EXPECT_THAT(tp.out, HasSubstr("--tp: must be powers of two in 1..16, got 3"));
  // 8 is a power of two but does not divide the 4 heads.
  Result heads = Measure("tiny-llama.json", "--tp 8", csv);
  EXPECT_EQ(heads.code, 2) << heads.out;
  EXPECT_THAT(heads.out, HasSubstr("--tp: 8 does not divide num_heads (4) of "
                                   "model tiny-llama"));
  Result kind = Measure("tiny-llama.json", "--layers dense,attention", csv);
  EXPECT_EQ(kind.code, 2) << kind.out;
  EXPECT_THAT(kind.out, HasSubstr("--layers: layer_kind: expected dense, "
                                  "moe_attention, moe_experts, embedding or "
                                  "lm_head, got \"attention\""));
  Result moe = Measure("tiny-llama.json", "--layers moe_experts", csv);
  EXPECT_EQ(moe.code, 2) << moe.out;
  EXPECT_THAT(moe.out, HasSubstr("--layers: moe_experts is not supported yet"));
  Result gpu = Shell(kArachne + " profile measure --model " + kData +
                     "/tiny-llama.json --device cpu --out " + csv);
  EXPECT_EQ(gpu.code, 2) << gpu.out;
  EXPECT_THAT(gpu.out, HasSubstr("--gpu: required with --device cpu"));
  Result unknown_gpu = Shell(kArachne + " profile measure --model " + kData +
                             "/tiny-llama.json --device cpu --gpu Z100 --out " +
                             csv);
  EXPECT_EQ(unknown_gpu.code, 2) << unknown_gpu.out;
  EXPECT_THAT(unknown_gpu.out, HasSubstr("--gpu: "));
  EXPECT_THAT(unknown_gpu.out, HasSubstr("Z100"));
  Result model = Measure("no-such-model", "", csv);
  EXPECT_EQ(model.code, 2) << model.out;
  EXPECT_THAT(model.out, HasSubstr("no-such-model"));
  // Nothing was written by the failed runs.
  EXPECT_FALSE(std::filesystem::exists(csv));
}

TEST(ProfileMeasureTest, AMissingArachneProfileIsNamed) {
  // A copy of arachne in a directory without arachne-profile.
  const auto dir = FreshDir("profile_measure_missing");
  std::filesystem::copy_file(kArachne, dir / "arachne");
  std::filesystem::permissions(dir / "arachne",
                               std::filesystem::perms::owner_all);
  Result r = Shell((dir / "arachne").string() + " profile measure --help");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("arachne profile measure runs " +
                               (dir / "arachne-profile").string() +
                               ", which does not exist (arachne-profile is "
                               "built only with LibTorch"));
}

TEST(ProfileMeasureTest, ArachneHelpListsMeasure) {
  Result r = Shell(kArachne + " profile --help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("measure"));
}

}  // namespace
}  // namespace arachne
