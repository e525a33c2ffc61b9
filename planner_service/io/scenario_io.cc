#include "planner_service/io/scenario_io.h"

#include <fnmatch.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/framework_io.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/model_io.h"

namespace arachne {
namespace {

using Json = nlohmann::json;

// Far above any figure of the paper (Figure 4 draws 200,000); catches a
// mistyped exponent before it runs for hours.
constexpr int kMaxSamples = 10'000'000;

absl::StatusOr<ScenarioKind> ReadKind(const ObjectReader& r) {
  ARACHNE_IO_ASSIGN_OR_RETURN(const std::string kind, r.String("kind"));
  for (ScenarioKind k : {ScenarioKind::kCompare, ScenarioKind::kSearchCurve,
                         ScenarioKind::kGrowth, ScenarioKind::kScatter}) {
    if (kind == ScenarioKindName(k)) return k;
  }
  return r.Error("kind",
                 absl::StrCat("must be compare, search_curve, growth or "
                              "scatter, got ",
                              QuoteForMessage(kind)));
}


absl::StatusOr<Composition> ReadComposition(const Json& value,
                                            absl::string_view source,
                                            const std::string& path,
                                            const GpuCatalog& catalog) {
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader r,
                              ObjectReader::Create(value, source, path));
  ARACHNE_IO_RETURN_IF_ERROR(r.AllowOnly({"label", "gpus", "cluster"}));
  Composition c;
  ARACHNE_IO_ASSIGN_OR_RETURN(c.label, r.String("label"));
  ARACHNE_IO_ASSIGN_OR_RETURN(c.gpus, r.Int("gpus", 1));
  const Json* cluster = r.Find("cluster");
  if (cluster == nullptr) return r.MissingError("cluster");
  if (!cluster->is_object()) {
    return r.Error("cluster", absl::StrCat("must be a mapping (object), got ",
                                           DescribeJsonValue(*cluster)));
  }
  // The cluster parser reads text; the subtree round-trips through JSON
  // exactly (integers stay integers), and the source names the field so its
  // errors read "<file>: compositions[1].cluster: nodes[0]: ...".
  ARACHNE_IO_ASSIGN_OR_RETURN(
      c.cluster,
      ParseCluster(cluster->dump(),
                   absl::StrCat(source, ": ", r.PathOf("cluster")), catalog));
  if (c.cluster.total_gpus() != c.gpus) {
    return r.Error("gpus",
                   absl::StrCat("must equal the cluster's GPU count ",
                                c.cluster.total_gpus(), ", got ", c.gpus));
  }
  return c;
}

}  // namespace

absl::StatusOr<TrainingConfig> ReadTrainingConfig(const ObjectReader& top) {
  TrainingConfig training;
  if (!top.Has("training")) return training;
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader r, top.Object("training"));
  ARACHNE_IO_RETURN_IF_ERROR(
      r.AllowOnly({"seq_len", "global_batch", "precision", "recompute",
                   "distributed_optimizer", "optimizer", "framework"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(training.seq_len,
                              r.IntOr("seq_len", training.seq_len, 1));
  ARACHNE_IO_ASSIGN_OR_RETURN(
      training.global_batch, r.IntOr("global_batch", training.global_batch, 1));
  ARACHNE_IO_ASSIGN_OR_RETURN(const std::string precision,
                              r.StringOr("precision", "bf16"));
  absl::StatusOr<Precision> p = ParsePrecision(precision);
  if (!p.ok()) {
    return r.Error("precision", absl::StrCat("must be bf16 or fp16, got ",
                                             QuoteForMessage(precision)));
  }
  training.precision = *p;
  ARACHNE_IO_ASSIGN_OR_RETURN(const std::string recompute,
                              r.StringOr("recompute", "none"));
  absl::StatusOr<Recompute> rc = ParseRecompute(recompute);
  if (!rc.ok()) {
    return r.Error("recompute",
                   absl::StrCat("must be none, selective or full, got ",
                                QuoteForMessage(recompute)));
  }
  training.recompute = *rc;
  ARACHNE_IO_ASSIGN_OR_RETURN(
      training.distributed_optimizer,
      r.BoolOr("distributed_optimizer", training.distributed_optimizer));
  // The cost model prices Adam (two fp32 moments per parameter) only; the
  // field exists so a scenario states it, and another optimizer is refused
  // rather than silently priced as Adam.
  ARACHNE_IO_ASSIGN_OR_RETURN(const std::string optimizer,
                              r.StringOr("optimizer", "adam"));
  if (optimizer != "adam") {
    return r.Error("optimizer",
                   absl::StrCat("must be adam (the only optimizer the cost "
                                "model prices), got ",
                                QuoteForMessage(optimizer)));
  }
  ARACHNE_IO_ASSIGN_OR_RETURN(training.framework, ReadFramework(r));
  if (absl::Status s = training.Validate(); !s.ok()) {
    return FieldError(r.source(), r.path(), s.message());
  }
  return training;
}

absl::string_view ScenarioKindName(ScenarioKind kind) {
  switch (kind) {
    case ScenarioKind::kCompare:
      return "compare";
    case ScenarioKind::kSearchCurve:
      return "search_curve";
    case ScenarioKind::kGrowth:
      return "growth";
    case ScenarioKind::kScatter:
      return "scatter";
  }
  return "compare";
}

absl::StatusOr<Scenario> ParseScenario(absl::string_view text,
                                       absl::string_view source,
                                       const GpuCatalog& catalog,
                                       const std::string& profiles_dir) {
  ARACHNE_IO_ASSIGN_OR_RETURN(Json root, ParseJsonOrYaml(text, source));
  if (root.is_null()) {
    return FieldError(source, "",
                      "is empty; expected a mapping with name, figure, kind, "
                      "model and compositions");
  }
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader top,
                              ObjectReader::Create(root, source, ""));
  ARACHNE_IO_RETURN_IF_ERROR(top.AllowOnly(
      {"name", "figure", "description", "kind", "model", "training",
       "max_evaluations", "samples", "compositions"}));
  Scenario s;
  s.source = std::string(source);
  ARACHNE_IO_ASSIGN_OR_RETURN(s.name, top.String("name"));
  ARACHNE_IO_ASSIGN_OR_RETURN(s.figure, top.String("figure"));
  ARACHNE_IO_ASSIGN_OR_RETURN(s.description, top.StringOr("description", ""));
  ARACHNE_IO_ASSIGN_OR_RETURN(s.kind, ReadKind(top));
  ARACHNE_IO_ASSIGN_OR_RETURN(s.model, top.String("model"));
  absl::StatusOr<ModelSpec> model = ResolveModel(s.model, profiles_dir);
  if (!model.ok()) {
    return top.Error("model",
                     AbbreviateQuoted(model.status().message(), s.model));
  }
  s.model_spec = *std::move(model);
  ARACHNE_IO_ASSIGN_OR_RETURN(s.training, ReadTrainingConfig(top));

  // Fields that only mean something for one kind are refused elsewhere, so a
  // scenario never carries a setting the bench ignores.
  if (top.Has("max_evaluations")) {
    if (s.kind != ScenarioKind::kSearchCurve) {
      return top.Error("max_evaluations",
                       absl::StrCat("only applies to kind search_curve, not ",
                                    ScenarioKindName(s.kind)));
    }
    ARACHNE_IO_ASSIGN_OR_RETURN(s.max_evaluations,
                                top.Int64("max_evaluations", 1));
  }
  if (s.kind == ScenarioKind::kScatter) {
    ARACHNE_IO_ASSIGN_OR_RETURN(s.samples, top.Int("samples", 1, kMaxSamples));
  } else if (top.Has("samples")) {
    return top.Error("samples",
                     absl::StrCat("only applies to kind scatter, not ",
                                  ScenarioKindName(s.kind)));
  }

  const Json* list = top.Find("compositions");
  if (list == nullptr) return top.MissingError("compositions");
  ARACHNE_IO_ASSIGN_OR_RETURN(list, top.Array("compositions"));
  if (list->empty()) return top.Error("compositions", "must not be empty");
  absl::flat_hash_map<std::string, int> index_by_label;
  for (int i = 0; i < static_cast<int>(list->size()); ++i) {
    const std::string path = IndexFieldPath("compositions", i);
    ARACHNE_IO_ASSIGN_OR_RETURN(
        Composition c, ReadComposition((*list)[i], source, path, catalog));
    auto [it, inserted] = index_by_label.emplace(c.label, i);
    if (!inserted) {
      return FieldError(
          source, JoinFieldPath(path, "label"),
          absl::StrCat("duplicate label ", QuoteForMessage(c.label),
                       " (also compositions[", it->second, "])"));
    }
    s.compositions.push_back(std::move(c));
  }
  return s;
}

absl::StatusOr<Scenario> LoadScenarioFile(const std::string& path,
                                          const GpuCatalog& catalog,
                                          const std::string& profiles_dir) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseScenario(text, path, catalog, profiles_dir);
}

absl::StatusOr<std::vector<Scenario>> LoadScenarioSuite(
    const std::string& dir, const std::vector<std::string>& patterns,
    const GpuCatalog& catalog, const std::string& profiles_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("--suite: ", dir, " is not a directory"));
  }
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() &&
        (ext == ".yaml" || ext == ".yml" || ext == ".json")) {
      files.push_back(e.path().string());
    }
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("--suite: cannot list ", dir, ": ", ec.message()));
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "--suite: ", dir, " holds no scenario file (*.yaml, *.yml, *.json)"));
  }
  std::sort(files.begin(), files.end());

  std::vector<Scenario> all;
  absl::flat_hash_map<std::string, std::string> file_by_name;
  for (const std::string& file : files) {
    ARACHNE_IO_ASSIGN_OR_RETURN(Scenario s,
                                LoadScenarioFile(file, catalog, profiles_dir));
    auto [it, inserted] = file_by_name.emplace(s.name, file);
    if (!inserted) {
      return FieldError(file, "name",
                        absl::StrCat("duplicate scenario name \"", s.name,
                                     "\" (also in ", it->second, ")"));
    }
    all.push_back(std::move(s));
  }
  if (patterns.empty()) return all;

  std::vector<bool> keep(all.size(), false);
  for (const std::string& pattern : patterns) {
    bool matched = false;
    for (size_t i = 0; i < all.size(); ++i) {
      if (fnmatch(pattern.c_str(), all[i].name.c_str(), 0) == 0) {
        keep[i] = true;
        matched = true;
      }
    }
    if (!matched) {
      std::vector<std::string> names;
      for (const Scenario& s : all) names.push_back(s.name);
      return absl::InvalidArgumentError(
          absl::StrCat("--scenarios: \"", pattern, "\" matches no scenario in ",
                       dir, "; scenarios: ", absl::StrJoin(names, ", ")));
    }
  }
  std::vector<Scenario> selected;
  for (size_t i = 0; i < all.size(); ++i) {
    if (keep[i]) selected.push_back(std::move(all[i]));
  }
  return selected;
}

}  // namespace arachne
