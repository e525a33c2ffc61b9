// The default --gpu of `arachne profile measure` on CUDA: nvidia-smi's
// device name mapped to the shipped GPU catalog.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/profiler/profile_measure.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

TEST(CatalogIdForDeviceTest, MapsDriverNamesToCatalogIds) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  struct Case {
    const char* device;
    const char* id;
  };
  for (const Case& c : {
           Case{"NVIDIA A100-SXM4-80GB", "A100-80GB"},  // a product_name
           Case{"NVIDIA A100-SXM4-40GB", "A100-40GB"},
           Case{"NVIDIA H100 80GB HBM3", "H100-80GB"},  // words -> H100-80GB
           Case{"NVIDIA H200", "H200-141GB"},           // an alias
           Case{"NVIDIA RTX A6000", "A6000"},
           Case{"h100-80gb", "H100-80GB"},              // an id, any case
       }) {
    absl::StatusOr<std::string> id = CatalogIdForDevice(*catalog, c.device);
    ASSERT_TRUE(id.ok()) << c.device << ": " << id.status();
    EXPECT_EQ(*id, c.id) << c.device;
  }
}

TEST(CatalogIdForDeviceTest, AnUnknownDeviceAsksForGpu) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  absl::StatusOr<std::string> id =
      CatalogIdForDevice(*catalog, "NVIDIA Z9000 Ultra");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(id.status().message(),
              HasSubstr("--gpu: the device \"NVIDIA Z9000 Ultra\" matches no "
                        "id, alias or product_name"));
}

}  // namespace
}  // namespace arachne
