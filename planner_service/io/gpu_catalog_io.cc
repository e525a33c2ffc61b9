#include "planner_service/io/gpu_catalog_io.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {
namespace {

absl::StatusOr<GpuType> ParseGpuType(const ObjectReader& r) {
  ARACHNE_IO_RETURN_IF_ERROR(r.AllowOnly(
      {"id", "aliases", "product_name", "peak_bf16_tflops", "peak_fp32_tflops",
       "memory_gib", "hbm_gbps", "intra_node_gbps", "intra_node_link",
       "default_gpus_per_node", "usd_per_hour", "source"}));
  GpuType t;
  ARACHNE_IO_ASSIGN_OR_RETURN(t.id, r.String("id"));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.aliases, r.StringListOr("aliases"));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.product_name, r.String("product_name"));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.peak_bf16_tflops,
                              r.Number("peak_bf16_tflops", 0, true));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.peak_fp32_tflops,
                              r.Number("peak_fp32_tflops", 0, true));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.memory_gib, r.Number("memory_gib", 0, true));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.hbm_gbps, r.Number("hbm_gbps", 0, true));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.intra_node_gbps,
                              r.Number("intra_node_gbps", 0, true));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.intra_node_link, r.String("intra_node_link"));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.default_gpus_per_node,
                              r.Int("default_gpus_per_node", 1));
  // Free (0) is allowed: a cluster one already owns.
  ARACHNE_IO_ASSIGN_OR_RETURN(t.usd_per_hour,
                              r.Number("usd_per_hour", 0, false));
  ARACHNE_IO_ASSIGN_OR_RETURN(t.source, r.String("source"));
  return t;
}

}  // namespace

absl::StatusOr<GpuCatalog> ParseGpuCatalog(absl::string_view text,
                                           absl::string_view source) {
  ARACHNE_IO_ASSIGN_OR_RETURN(nlohmann::json root,
                              ParseJsonOrYaml(text, source));
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader top,
                              ObjectReader::Create(root, source, ""));
  ARACHNE_IO_RETURN_IF_ERROR(top.AllowOnly({"gpus"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(const nlohmann::json* rows, top.Array("gpus"));
  if (rows->empty()) return FieldError(source, "gpus", "must not be empty");
  std::vector<GpuType> types;
  for (int i = 0; i < static_cast<int>(rows->size()); ++i) {
    ARACHNE_IO_ASSIGN_OR_RETURN(
        ObjectReader r,
        ObjectReader::Create((*rows)[i], source, IndexFieldPath("gpus", i)));
    ARACHNE_IO_ASSIGN_OR_RETURN(GpuType t, ParseGpuType(r));
    types.push_back(std::move(t));
  }
  absl::StatusOr<GpuCatalog> catalog = GpuCatalog::Create(std::move(types));
  if (!catalog.ok()) {
    return absl::Status(catalog.status().code(),
                        absl::StrCat(source, ": ", catalog.status().message()));
  }
  return catalog;
}

absl::StatusOr<GpuCatalog> LoadGpuCatalog(const std::string& profiles_dir) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text,
                              ReadDataFile("gpus.yaml", profiles_dir));
  return ParseGpuCatalog(text, "gpus.yaml");
}

nlohmann::json GpuTypeToJson(const GpuType& t) {
  return nlohmann::json{
      {"id", t.id},
      {"aliases", t.aliases},
      {"product_name", t.product_name},
      {"peak_bf16_tflops", t.peak_bf16_tflops},
      {"peak_fp32_tflops", t.peak_fp32_tflops},
      {"memory_gib", t.memory_gib},
      {"hbm_gbps", t.hbm_gbps},
      {"intra_node_gbps", t.intra_node_gbps},
      {"intra_node_link", t.intra_node_link},
      {"default_gpus_per_node", t.default_gpus_per_node},
      {"usd_per_hour", t.usd_per_hour},
      {"source", t.source},
  };
}

}  // namespace arachne
