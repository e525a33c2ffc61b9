#include "planner_service/profiler/profile_measure.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner_service/core/cost/profile_synthesizer.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/profile_io.h"
#include "planner_service/profiler/layer_timer.h"

namespace arachne {
namespace {

// What one run measures, validated.
struct MeasurePlan {
  ModelSpec model;
  GpuType gpu;
  std::vector<LayerKind> kinds;
  std::vector<int> tps, mbss;
  std::vector<std::string> notes;  // defaults skipped, and why
  ProfileDevice device = ProfileDevice::kCpu;
  ProfileDtype dtype = ProfileDtype::kFp32;
};

// Why `tp` cannot slice `kind` of `m` ("" when it can): the shapes Megatron
// splits must divide (the vocabulary is padded instead).
std::string TpProblem(const ModelSpec& m, LayerKind kind, int tp) {
  if (kind != LayerKind::kDense) return "";
  if (m.num_heads % tp != 0)
    return absl::StrCat("does not divide num_heads (", m.num_heads, ")");
  if (m.num_kv_heads % tp != 0)
    return absl::StrCat("does not divide num_kv_heads (", m.num_kv_heads, ")");
  if (m.ffn % tp != 0) return absl::StrCat("does not divide ffn (", m.ffn, ")");
  return "";
}

// The device's name from nvidia-smi (LibTorch's C++ API has no portable
// device-name query without its CUDA headers): the first device of
// CUDA_VISIBLE_DEVICES, or device 0.
absl::StatusOr<std::string> CudaDeviceName() {
  std::string index = "0";
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) {
    std::string first(v);
    first = first.substr(0, first.find(','));
    if (!first.empty()) index = first;
  }
  const std::string cmd = "nvidia-smi --query-gpu=name --format=csv,noheader "
                          "--id=" + index + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr)
    return absl::NotFoundError("--gpu: cannot run nvidia-smi to name the "
                               "device; pass --gpu CATALOG_ID");
  std::string text;
  char buf[256];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  const int rc = pclose(p);
  text = std::string(absl::StripAsciiWhitespace(text));
  if (rc != 0 || text.empty())
    return absl::NotFoundError("--gpu: nvidia-smi did not name the device; "
                               "pass --gpu CATALOG_ID");
  return text;
}

absl::StatusOr<MeasurePlan> Plan(const ProfileMeasureOptions& o,
                                 const GpuCatalog& catalog) {
  MeasurePlan plan;
  if (o.out.empty())
    return absl::InvalidArgumentError("--out: required (the CSV to write)");
  if (o.warmup < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup: must be >= 0, got ", o.warmup));
  if (o.iters < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--iters: must be >= 1, got ", o.iters));
  absl::StatusOr<ModelSpec> model = ResolveModel(o.model, o.profiles_dir);
  if (!model.ok()) return model.status();
  plan.model = *std::move(model);
  const ModelSpec& m = plan.model;

  if (o.device.empty()) {
    plan.device = CudaAvailable() ? ProfileDevice::kCuda : ProfileDevice::kCpu;
  } else if (o.device == "cpu") {
    plan.device = ProfileDevice::kCpu;
  } else if (o.device == "cuda") {
    plan.device = ProfileDevice::kCuda;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: expected cpu or cuda, got \"", o.device, "\""));
  }
  const bool cuda = plan.device == ProfileDevice::kCuda;
  if (o.dtype.empty()) {
    // CPU runs only test the pipeline; fp32 is what CPU kernels do well.
    plan.dtype = cuda ? ProfileDtype::kBf16 : ProfileDtype::kFp32;
  } else if (o.dtype == "bf16") {
    plan.dtype = ProfileDtype::kBf16;
  } else if (o.dtype == "fp16") {
    plan.dtype = ProfileDtype::kFp16;
  } else if (o.dtype == "fp32") {
    plan.dtype = ProfileDtype::kFp32;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype: expected bf16, fp16 or fp32, got \"", o.dtype, "\""));
  }

  // The GPU type the entries are recorded under.
  std::string gpu_name = o.gpu;
  if (gpu_name.empty()) {
    if (!cuda)
      return absl::InvalidArgumentError(
          "--gpu: required with --device cpu: name the catalog id the "
          "entries are recorded under (`arachne gpus`); CPU timings only "
          "test the pipeline");
    if (!CudaAvailable())
      return absl::FailedPreconditionError(absl::StrCat(
          "--device cuda: ", TorchDescription(), " sees no CUDA device"));
    absl::StatusOr<std::string> name = CudaDeviceName();
    if (!name.ok()) return name.status();
    absl::StatusOr<std::string> id = CatalogIdForDevice(catalog, *name);
    if (!id.ok()) return id.status();
    gpu_name = *id;
  }
  absl::StatusOr<int> gpu = catalog.IndexOf(gpu_name);
  if (!gpu.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu: ", gpu.status().message()));
  plan.gpu = catalog.type(*gpu);

  // Layer kinds.
  if (o.layers.empty()) {
    if (m.is_moe())
      return absl::UnimplementedError(absl::StrCat(
          "--layers: model ", m.name,
          " is a MoE model: moe_attention and moe_experts are not supported "
          "yet; pass --layers embedding,lm_head",
          m.moe.dense_first_layers > 0 ? ",dense" : "",
          " to measure the others"));
    plan.kinds = {LayerKind::kDense, LayerKind::kEmbedding, LayerKind::kLmHead};
  } else {
    for (const std::string& name : o.layers) {
      absl::StatusOr<LayerKind> kind = ParseLayerKind(name);
      if (!kind.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("--layers: ", kind.status().message()));
      if (*kind == LayerKind::kMoeAttention || *kind == LayerKind::kMoeExperts)
        return absl::UnimplementedError(absl::StrCat(
            "--layers: ", name,
            " is not supported yet (the profiler measures dense, embedding "
            "and lm_head)"));
      if (*kind == LayerKind::kDense && m.is_moe() &&
          m.moe.dense_first_layers <= 0)
        return absl::InvalidArgumentError(absl::StrCat(
            "--layers: dense: model ", m.name, " has no dense layers"));
      if (*kind == LayerKind::kDense && m.attention == AttentionKind::kMla)
        return absl::UnimplementedError(absl::StrCat(
            "--layers: dense: model ", m.name,
            " uses multi-head latent attention, which is not supported yet"));
      if (std::find(plan.kinds.begin(), plan.kinds.end(), *kind) ==
          plan.kinds.end())
        plan.kinds.push_back(*kind);
    }
  }

  // TP degrees (powers of two) and micro-batch sizes in the ranges plans use
  // (those of `arachne profile show`).
  if (o.seq < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--seq: must be >= 1, got ", o.seq));
  const bool tp_given = !o.tp.empty();
  const std::vector<int> tps =
      tp_given ? o.tp
               : std::vector<int>(std::begin(kDefaultMeasureTps),
                                  std::end(kDefaultMeasureTps));
  for (int tp : tps) {
    if (tp < 1 || tp > 16 || (tp & (tp - 1)) != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "--tp: must be powers of two in 1..16, got ", tp));
    std::string why;
    for (LayerKind k : plan.kinds) {
      why = TpProblem(m, k, tp);
      if (!why.empty()) break;
    }
    // Sequence parallelism splits each sequence over the TP group.
    if (why.empty() && o.seq % tp != 0)
      why = absl::StrCat("does not divide --seq (", o.seq,
                         "; sequence parallelism splits it)");
    if (!why.empty()) {
      if (tp_given)
        return absl::InvalidArgumentError(
            absl::StrCat("--tp: ", tp, " ", why, " of model ", m.name));
      plan.notes.push_back(absl::StrCat("tp ", tp, " skipped: ", why));
      continue;
    }
    if (std::find(plan.tps.begin(), plan.tps.end(), tp) == plan.tps.end())
      plan.tps.push_back(tp);
  }
  const std::vector<int> mbss =
      o.mbs.empty() ? std::vector<int>(std::begin(kDefaultMeasureMbs),
                                       std::end(kDefaultMeasureMbs))
                    : o.mbs;
  for (int b : mbss) {
    if (b < 1 || b > 128)
      return absl::InvalidArgumentError(
          absl::StrCat("--micro-batch: must be in 1..128, got ", b));
    if (std::find(plan.mbss.begin(), plan.mbss.end(), b) == plan.mbss.end())
      plan.mbss.push_back(b);
  }
  return plan;
}

absl::string_view DtypeName(ProfileDtype d) {
  switch (d) {
    case ProfileDtype::kBf16: return "bf16";
    case ProfileDtype::kFp16: return "fp16";
    case ProfileDtype::kFp32: return "fp32";
  }
  return "?";
}

int ExitCode(const absl::Status& s, std::ostream& err) {
  err << "error: " << s.message() << "\n";
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:
      return 2;
    default:
      return 1;
  }
}

std::string Ratio(double measured, double synthesized) {
  if (synthesized <= 0) return "-";
  return absl::StrFormat("%.2f", measured / synthesized);
}

}  // namespace

absl::StatusOr<std::string> CatalogIdForDevice(const GpuCatalog& catalog,
                                               const std::string& device_name) {
  const std::string name(absl::StripAsciiWhitespace(device_name));
  const std::string bare(absl::StripPrefix(name, "NVIDIA "));
  for (const std::string& n : {name, bare}) {
    if (absl::StatusOr<int> i = catalog.IndexOf(n); i.ok())
      return catalog.type(*i).id;
  }
  for (const GpuType& t : catalog.types()) {
    const std::string product(absl::StripPrefix(t.product_name, "NVIDIA "));
    if (absl::EqualsIgnoreCase(t.product_name, name) ||
        absl::EqualsIgnoreCase(product, bare))
      return t.id;
  }
  // Driver names split what catalog ids join with '-' ("H100 80GB HBM3",
  // "RTX A6000"): the longest run of consecutive words that, joined by '-',
  // is an id or alias ("H100-80GB", "A6000"); leftmost on a tie.
  const std::vector<std::string> words =
      absl::StrSplit(bare, ' ', absl::SkipEmpty());
  for (size_t len = words.size(); len >= 1; --len) {
    for (size_t first = 0; first + len <= words.size(); ++first) {
      const std::string joined = absl::StrJoin(
          words.begin() + first, words.begin() + first + len, "-");
      if (absl::StatusOr<int> i = catalog.IndexOf(joined); i.ok())
        return catalog.type(*i).id;
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "--gpu: the device \"", name,
      "\" matches no id, alias or product_name of the GPU catalog; pass --gpu "
      "with the catalog id to record the entries under (`arachne gpus`)"));
}

void AddProfileMeasureFlags(CLI::App* app, ProfileMeasureOptions* o) {
  app->add_option("--model", o->model, "catalog id or Hugging Face config.json")
      ->required();
  app->add_option("--gpu", o->gpu,
                  "catalog id the entries are recorded under (default on "
                  "CUDA: the device's name mapped to the catalog; required "
                  "on CPU)");
  app->add_option("--tp", o->tp,
                  "TP degrees, comma-separated (default 1,2,4,8, skipping "
                  "those the model's heads / ffn / seq do not divide)")
      ->delimiter(',');
  app->add_option("--micro-batch", o->mbs,
                  "micro-batch sizes, comma-separated (default 1,2,4)")
      ->delimiter(',');
  app->add_option("--seq", o->seq, "sequence length")->capture_default_str();
  app->add_option("--layers", o->layers,
                  "layer kinds, comma-separated: dense, embedding, lm_head "
                  "(default: all three; moe_attention / moe_experts are not "
                  "supported yet)")
      ->delimiter(',');
  app->add_option("--device", o->device,
                  "cpu or cuda (default: cuda when LibTorch sees one)");
  app->add_option("--dtype", o->dtype,
                  "bf16, fp16 or fp32 (default: bf16 on CUDA, fp32 on CPU)");
  app->add_option("--warmup", o->warmup, "untimed passes per configuration")
      ->capture_default_str();
  app->add_option("--iters", o->iters,
                  "timed passes per configuration (the median is recorded)")
      ->capture_default_str();
  app->add_option("--out", o->out, "the profile CSV to write")->required();
  app->add_option("--profiles-dir", o->profiles_dir,
                  "directory of the catalogs and calibration to use (default: built-in data)");
}

int RunProfileMeasure(const ProfileMeasureOptions& o, std::ostream& out,
                      std::ostream& err) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(o.profiles_dir);
  if (!catalog.ok()) return ExitCode(catalog.status(), err);
  absl::StatusOr<MeasurePlan> plan = Plan(o, *catalog);
  if (!plan.ok()) return ExitCode(plan.status(), err);
  absl::StatusOr<CalibrationSet> calibration = LoadCalibration(o.profiles_dir);
  if (!calibration.ok()) return ExitCode(calibration.status(), err);
  const ModelSpec& m = plan->model;
  const GpuType& gpu = plan->gpu;
  const ProfileSynthesizer synthesizer(calibration->For(gpu));
  const bool cuda = plan->device == ProfileDevice::kCuda;

  out << absl::StrFormat(
      "profile measure: %s on %s as %s, %s, seq %d, warmup %d, iters %d; %s\n",
      m.name, cuda ? "cuda" : "cpu", gpu.id, DtypeName(plan->dtype), o.seq,
      o.warmup, o.iters, TorchDescription());
  for (const std::string& note : plan->notes) out << "  note: " << note << "\n";
  if (!cuda)
    out << "  note: CPU timings only test the pipeline; do not plan with "
           "them\n";
  if (plan->dtype == ProfileDtype::kFp32)
    out << "  note: fp32 keeps 4-byte activations where the planner's "
           "entries assume 16-bit (2 bytes)\n";

  std::vector<ProfileEntry> entries;
  out << absl::StrFormat("%-9s %3s %4s %10s %10s %14s %12s  %s\n", "layer",
                         "tp", "mbs", "fwd_ms", "bwd_ms", "activation_B",
                         "params", "measured/synthesized fwd bwd act");
  for (LayerKind kind : plan->kinds) {
    for (int tp : plan->tps) {
      for (int mbs : plan->mbss) {
        LayerTimingRequest req;
        req.model = m;
        req.kind = kind;
        req.tp = tp;
        req.mbs = mbs;
        req.seq = o.seq;
        req.device = plan->device;
        req.dtype = plan->dtype;
        req.warmup = o.warmup;
        req.iters = o.iters;
        absl::StatusOr<LayerTiming> t = TimeLayer(req);
        if (!t.ok()) return ExitCode(t.status(), err);
        absl::StatusOr<ProfileEntry> synth =
            synthesizer.Synthesize(m, kind, gpu, tp, mbs, o.seq);
        ProfileEntry e;
        e.key.model = m.profile_name.empty() ? m.name : m.profile_name;
        e.key.kind = kind;
        e.key.gpu = gpu.id;
        e.key.tp = tp;
        e.key.mbs = mbs;
        e.key.seq = o.seq;
        e.fwd_ms = t->fwd_ms;
        e.bwd_ms = t->bwd_ms;
        // One device runs no collective: the TP communication is the
        // synthesizer's ring estimate for this key (RingCollectiveMs over
        // the GPU type's intra-node link, docs/calibration.md).
        e.tp_comm_ms = synth.ok() ? synth->tp_comm_ms : 0;
        e.activation_bytes = t->activation_bytes;
        // The entry semantics (docs/calibration.md "param_count"): the
        // layer's parameters / tp rounded up, as the synthesizer records
        // them, so that memory is priced alike for measured and synthesized
        // entries (the rank's module holds its norms, and GPT's row-parallel
        // biases, whole: t->module_params).
        const int64_t v_t = (m.vocab + tp - 1) / tp;  // padded vocab / tp
        switch (kind) {
          case LayerKind::kDense:
            e.param_count = (m.DenseLayerParams() + tp - 1) / tp;
            break;
          case LayerKind::kEmbedding:
            e.param_count = v_t * m.hidden;
            break;
          case LayerKind::kLmHead:
            e.param_count = (m.LmHeadParams() + tp - 1) / tp;
            break;
          default:
            break;
        }
        // At tp 1 nothing is sliced: the module built must be the model's
        // layer, or the timings are of something else.
        if (tp == 1 && kind == LayerKind::kDense &&
            t->module_params != e.param_count)
          return ExitCode(
              absl::InternalError(absl::StrCat(
                  "the dense layer built has ", t->module_params,
                  " parameters where model ", m.name, " has ", e.param_count)),
              err);
        e.source = ProfileSource::kMeasured;
        out << absl::StrFormat(
            "%-9s %3d %4d %10.4f %10.4f %14d %12d  %s %s %s\n",
            LayerKindName(kind), tp, mbs, e.fwd_ms, e.bwd_ms,
            e.activation_bytes, e.param_count,
            synth.ok() ? Ratio(e.fwd_ms, synth->fwd_ms) : "-",
            synth.ok() ? Ratio(e.bwd_ms, synth->bwd_ms) : "-",
            synth.ok() ? Ratio(double(e.activation_bytes),
                               double(synth->activation_bytes))
                       : "-");
        entries.push_back(std::move(e));
      }
    }
  }

  // Provenance as '#' comments (ParseProfileCsv skips them), then exactly
  // SerializeProfileCsv's rows.
  std::ostringstream text;
  text << "# arachne profile measure: model " << m.name << ", recorded as "
       << gpu.id << ", measured on " << (cuda ? "cuda" : "cpu") << " ("
       << TorchDescription() << "), " << DtypeName(plan->dtype) << ", warmup "
       << o.warmup << ", iters " << o.iters << "\n";
  if (!cuda) text << "# CPU timings: for testing the pipeline only\n";
  text << SerializeProfileCsv(entries);
  const std::string tmp = o.out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text.str();
    f.close();
    if (!f)
      return ExitCode(absl::PermissionDeniedError(absl::StrCat(
                          "--out: cannot write \"", o.out, "\"")),
                      err);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, o.out, ec);
  if (ec)
    return ExitCode(absl::PermissionDeniedError(absl::StrCat(
                        "--out: cannot write \"", o.out, "\": ", ec.message())),
                    err);
  out << "wrote " << entries.size() << " measured entries to " << o.out
      << " (use: copy it to PROFILES_DIR/measured/ and pass --profiles-dir "
         "PROFILES_DIR)\n";
  return 0;
}

}  // namespace arachne
