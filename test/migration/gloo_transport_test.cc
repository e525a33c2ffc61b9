// The transport conformance suite on Gloo over loopback TCP.
#include "gmock/gmock.h"
#include "test/migration/transport_conformance.h"

#ifdef ARACHNE_HAVE_GLOO
#include "migration/gloo/gloo_transport.h"

namespace arachne::migration::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Gloo, TransportConformanceTest,
                         ::testing::Values(&MakeGlooTransportFactory),
                         FactoryName);

TEST(GlooFactoryTest, IsViableAndNamed) {
  auto f = MakeGlooTransportFactory();
  EXPECT_EQ(f->name(), "gloo");
  EXPECT_TRUE(f->IsViable());
}

TEST(GlooFactoryTest, RejectsARankOutsideTheWorld) {
  FileRendezvousStore store(MakeTempDir());
  auto t = MakeGlooTransportFactory()->Create({.rank = 2, .world_size = 2},
                                              &store);
  EXPECT_EQ(t.status(),
            absl::InvalidArgumentError("gloo: rank 2 of world size 2"));
}

}  // namespace
}  // namespace arachne::migration::testing
#else
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportConformanceTest);
TEST(GlooFactoryTest, NotBuilt) { GTEST_SKIP() << "built without Gloo"; }
#endif

#include "migration/transports.h"

namespace arachne::migration {
namespace {

TEST(TransportRegistryTest, NamesTheBuiltInTransports) {
  const std::vector<std::string> names = TransportNames();
#ifdef ARACHNE_HAVE_GLOO
  EXPECT_EQ(names.back(), "gloo");
  auto gloo = MakeTransportFactory("gloo");
  ASSERT_TRUE(gloo.ok());
  EXPECT_EQ((*gloo)->name(), "gloo");
#endif
  auto bad = MakeTransportFactory("mpi");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::StartsWith("unknown transport 'mpi'; built in: ["));
}

}  // namespace
}  // namespace arachne::migration
