#include "planner_service/io/gpu_catalog_io.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "arachne/v1/planner.pb.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/message_json.h"

namespace arachne {
namespace {

absl::StatusOr<GpuType> GpuTypeFromMessage(const v1::GpuType& m,
                                           const MessageErrors& errors) {
  GpuType t;
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"id", &m.id()},
        {"product_name", &m.product_name()},
        {"intra_node_link", &m.intra_node_link()},
        {"source", &m.source()},
        {"architecture", &m.architecture()}}) {
    if (value->empty()) {
      return errors.At(field, "must be a non-empty string, got \"\"");
    }
  }
  for (int i = 0; i < m.aliases_size(); ++i) {
    if (m.aliases(i).empty()) {
      return errors.At(IndexFieldPath("aliases", i),
                       "must be a non-empty string, got \"\"");
    }
  }
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"peak_bf16_tflops",
                                       m.peak_bf16_tflops()},
        {"peak_fp32_tflops", m.peak_fp32_tflops()},
        {"memory_gib", m.memory_gib()},
        {"hbm_gbps", m.hbm_gbps()},
        {"intra_node_gbps", m.intra_node_gbps()}}) {
    if (!(value > 0)) {
      return errors.At(field, absl::StrCat("must be a number > 0, got ", value));
    }
  }
  // Free (0) is allowed: a cluster one already owns.
  if (!(m.usd_per_hour() >= 0)) {
    return errors.At("usd_per_hour", absl::StrCat("must be a number >= 0, got ",
                                                  m.usd_per_hour()));
  }
  ARACHNE_IO_RETURN_IF_ERROR(errors.IntAtLeast(
      "default_gpus_per_node", m.default_gpus_per_node(), 1));
  if (absl::c_find(GpuArchitectures(), m.architecture()) ==
      GpuArchitectures().end()) {
    return errors.At("architecture",
                     absl::StrCat("must be one of ",
                                  absl::StrJoin(GpuArchitectures(), ", "),
                                  ", got \"", m.architecture(), "\""));
  }
  t.id = m.id();
  t.aliases.assign(m.aliases().begin(), m.aliases().end());
  t.product_name = m.product_name();
  t.peak_bf16_tflops = m.peak_bf16_tflops();
  t.peak_fp32_tflops = m.peak_fp32_tflops();
  t.memory_gib = m.memory_gib();
  t.hbm_gbps = m.hbm_gbps();
  t.intra_node_gbps = m.intra_node_gbps();
  t.intra_node_link = m.intra_node_link();
  t.default_gpus_per_node = m.default_gpus_per_node();
  t.usd_per_hour = m.usd_per_hour();
  t.source = m.source();
  t.architecture = m.architecture();
  return t;
}

}  // namespace

absl::StatusOr<GpuCatalog> ParseGpuCatalog(absl::string_view text,
                                           absl::string_view source) {
  v1::GpuCatalogFile file;
  ARACHNE_IO_RETURN_IF_ERROR(ParseMessageText(text, source, &file));
  const MessageErrors errors(source, "");
  if (file.gpus().empty()) return errors.At("gpus", "must not be empty");
  std::vector<GpuType> types;
  for (int i = 0; i < file.gpus_size(); ++i) {
    ARACHNE_IO_ASSIGN_OR_RETURN(
        GpuType t,
        GpuTypeFromMessage(file.gpus(i),
                           errors.Under(IndexFieldPath("gpus", i))));
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
      {"architecture", t.architecture},
  };
}

}  // namespace arachne
