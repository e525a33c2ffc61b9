// The transport conformance suite on NCCL (label gpu). Skips where no GPU
// is present, or where the machine has fewer GPUs than a test has ranks.
#include "test/migration/transport_conformance.h"

#ifdef ARACHNE_HAVE_NCCL
#include "migration/nccl/nccl_transport.h"

namespace arachne::migration::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Nccl, TransportConformanceTest,
                         ::testing::Values(&MakeNcclTransportFactory),
                         FactoryName);

TEST(NcclFactoryTest, RejectsARankOutsideTheWorld) {
  FileRendezvousStore store(MakeTempDir());
  // Checked before any CUDA call, so safe in the parent process.
  auto t = MakeNcclTransportFactory()->Create({.rank = 3, .world_size = 2},
                                              &store);
  EXPECT_EQ(t.status(),
            absl::InvalidArgumentError("nccl: rank 3 of world size 2"));
}

}  // namespace
}  // namespace arachne::migration::testing
#else
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportConformanceTest);
TEST(NcclFactoryTest, NotBuilt) { GTEST_SKIP() << "built without NCCL"; }
#endif
