// `arachne profile measure` on a CUDA device (labelled gpu; skips without a
// GPU, without arachne-profile, or with a CPU-only LibTorch): LLaMA-3-8B's
// dense layer at tp 8, recorded under the catalog id the device's name maps
// to, lands within a factor of the calibrated synthesizer.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/cost/profile_synthesizer.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/profile_io.h"
#include "test/cli/cli_runner.h"

namespace arachne {
namespace {

const std::string kBin = std::string(ARACHNE_BINARY_DIR);
const std::string kArachne = kBin + "/planner_service/cli/arachne";

using ::arachne::testing::Shell;
using Result = ::arachne::testing::ShellRun;

TEST(ProfileMeasureGpuTest, Llama3DenseLayerOnThisGpu) {
  if (!std::filesystem::exists(kBin + "/planner_service/cli/arachne-profile"))
    GTEST_SKIP() << "a build without LibTorch";
  if (Shell("nvidia-smi -L").code != 0) GTEST_SKIP() << "no GPU";
  const std::string csv =
      (std::filesystem::path(::testing::TempDir()) / "llama3-8b-gpu.csv")
          .string();
  Result r = Shell(kArachne +
                   " profile measure --model llama3-8b --device cuda --tp 8 "
                   "--micro-batch 1 --seq 2048 --layers dense,lm_head "
                   "--warmup 3 --iters 10 --out " + csv);
  if (r.code == 2 && r.out.find("sees no CUDA device") != std::string::npos)
    GTEST_SKIP() << "LibTorch without CUDA: " << r.out;
  ASSERT_EQ(r.code, 0) << r.out;
  std::cout << r.out;
  std::ifstream in(csv);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<ProfileEntry>> entries =
      ParseProfileCsv(text.str(), csv);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);

  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok());
  absl::StatusOr<ModelSpec> model = ResolveModel("llama3-8b");
  ASSERT_TRUE(model.ok());
  absl::StatusOr<CalibrationSet> calibration = LoadCalibration();
  ASSERT_TRUE(calibration.ok());
  for (const ProfileEntry& e : *entries) {
    SCOPED_TRACE(LayerKindName(e.key.kind));
    absl::StatusOr<int> gpu = catalog->IndexOf(e.key.gpu);
    ASSERT_TRUE(gpu.ok()) << e.key.gpu;
    const GpuType& type = catalog->type(*gpu);
    absl::StatusOr<ProfileEntry> s =
        ProfileSynthesizer(calibration->For(type))
            .Synthesize(*model, e.key.kind, type, 8, 1, 2048);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(e.source, ProfileSource::kMeasured);
    EXPECT_EQ(e.param_count, s->param_count);
    EXPECT_EQ(e.tp_comm_ms, s->tp_comm_ms);
    // The roofline is calibrated to within tens of percent on the GPUs it
    // was fitted on; a factor of 4 either way means the layer built or the
    // timing is wrong.
    EXPECT_GT(e.fwd_ms, s->fwd_ms / 4);
    EXPECT_LT(e.fwd_ms, s->fwd_ms * 4);
    EXPECT_GT(e.bwd_ms, s->bwd_ms / 4);
    EXPECT_LT(e.bwd_ms, s->bwd_ms * 4);
    EXPECT_GT(e.activation_bytes, s->activation_bytes / 2);
    EXPECT_LT(e.activation_bytes, s->activation_bytes * 4);
  }
}

}  // namespace
}  // namespace arachne
