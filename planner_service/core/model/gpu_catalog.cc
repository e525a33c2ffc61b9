#include "planner_service/core/model/gpu_catalog.h"

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace arachne {

const std::vector<std::string>& GpuArchitectures() {
  static const std::vector<std::string>* names = new std::vector<std::string>{
      "pascal", "volta", "turing", "ampere",
      "ada",    "hopper", "blackwell", "cdna3"};
  return *names;
}

absl::StatusOr<GpuCatalog> GpuCatalog::Create(std::vector<GpuType> types) {
  GpuCatalog catalog;
  for (int i = 0; i < static_cast<int>(types.size()); ++i) {
    const GpuType& t = types[i];
    if (t.id.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpus[", i, "].id: must not be empty"));
    }
    auto positive = [&](double v, const char* field) -> absl::Status {
      if (!(v > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gpu ", t.id, ": ", field, " must be > 0, got ", v));
      }
      return absl::OkStatus();
    };
    for (auto [v, f] : {std::pair<double, const char*>{t.peak_bf16_tflops,
                                                       "peak_bf16_tflops"},
                        {t.peak_fp32_tflops, "peak_fp32_tflops"},
                        {t.memory_gib, "memory_gib"},
                        {t.hbm_gbps, "hbm_gbps"},
                        {t.intra_node_gbps, "intra_node_gbps"},
                        {static_cast<double>(t.default_gpus_per_node),
                         "default_gpus_per_node"}}) {
      if (absl::Status s = positive(v, f); !s.ok()) return s;
    }
    if (!t.architecture.empty() &&
        absl::c_find(GpuArchitectures(), t.architecture) ==
            GpuArchitectures().end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu ", t.id, ": architecture must be one of ",
          absl::StrJoin(GpuArchitectures(), ", "), ", got \"",
          t.architecture, "\""));
    }
    if (t.usd_per_hour < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu ", t.id, ": usd_per_hour must be >= 0, got ", t.usd_per_hour));
    }
    std::vector<std::string> names = t.aliases;
    names.push_back(t.id);
    for (const std::string& name : names) {
      auto [it, inserted] =
          catalog.by_lower_name_.emplace(absl::AsciiStrToLower(name), i);
      if (!inserted && it->second != i) {
        return absl::InvalidArgumentError(
            absl::StrCat("gpu ", t.id, ": name \"", name,
                         "\" is already used by ", types[it->second].id));
      }
    }
  }
  catalog.types_ = std::move(types);
  return catalog;
}

absl::StatusOr<int> GpuCatalog::IndexOf(absl::string_view name) const {
  auto it = by_lower_name_.find(absl::AsciiStrToLower(name));
  if (it != by_lower_name_.end()) return it->second;
  std::vector<std::string> ids;
  for (const GpuType& t : types_) ids.push_back(t.id);
  return absl::NotFoundError(absl::StrCat("unknown GPU type \"", name,
                                          "\"; known: ",
                                          absl::StrJoin(ids, ", ")));
}

}  // namespace arachne
