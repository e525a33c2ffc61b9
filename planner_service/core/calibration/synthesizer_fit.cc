#include "planner_service/core/calibration/synthesizer_fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner_service/core/cost/csv.h"

namespace arachne {
namespace {

bool ContainsNoCase(absl::string_view hay, absl::string_view needle) {
  return absl::AsciiStrToLower(hay).find(absl::AsciiStrToLower(needle)) !=
         std::string::npos;
}

// ---------------------------------------------------------------------------
// Model of one Cephalo layer (see profiles/reference/cephalo/README.md).
// Element accesses (reads + writes) per token of the unfused Hugging Face
// element-wise kernels, forward; the backward is bwd_elementwise_ratio x.

// HF LlamaRMSNorm: to fp32, pow, mean, rsqrt-mul, to dtype, weight-mul.
constexpr double kHfRmsNormAccesses = 8;
// HF RoPE: rotate_half (slices, neg, cat), x*cos, rot*sin, add; per element
// of q and k.
constexpr double kHfRopeAccesses = 10;
// SiLU(gate) then * up: per ffn element.
constexpr double kSwiGluAccesses = 5;
// OpenAI-GPT gelu_new: pow, 2 scalar muls, add, tanh, add 1, 2 muls.
constexpr double kGeluNewAccesses = 18;
// Exact (erf) GELU, one kernel.
constexpr double kGeluAccesses = 2;
// Dropout (read, write, write mask), residual add (2 reads, 1 write),
// fused LayerNorm (read, write).
constexpr double kDropoutAccesses = 3;
constexpr double kResidualAccesses = 3;
constexpr double kLayerNormAccesses = 2;
// Eager attention, accesses per element of the b x heads x s x s scores,
// forward: QK^T output write 1, scale 2, softmax 2, AV read 1, plus the
// GPT causal mask multiply/add 4 and dropout 3 (GPT, BERT), or the fp32
// softmax upcast 2 (Mistral).
constexpr double kEagerScoresGpt = 1 + 2 + 4 + 2 + 3 + 1;
constexpr double kEagerScoresBert = 1 + 2 + 2 + 3 + 1;
constexpr double kEagerScoresMistral = 1 + 2 + 2 + 2 + 1;
// Gradient accumulation into fp32 .grad after each backward: fp16 rows cast
// the 16-bit weight gradient up (read 2, write 4) and add (read 4 + 4,
// write 4); fp32 rows only add.
constexpr double kGradAccumBytesFp16 = 18;
constexpr double kGradAccumBytesFp32 = 12;

enum class Family { kLlama, kMistral, kGpt, kBert };

Family FamilyOf(const MeasuredLayer& r) {
  if (r.family == "gpt") return Family::kGpt;
  if (r.family == "bert") return Family::kBert;
  if (r.family == "mistral") return Family::kMistral;
  return Family::kLlama;
}

int64_t LayerParams(const MeasuredLayer& r) {
  const int64_t h = r.hidden, d = r.hidden / r.heads;
  const int64_t kv = int64_t{r.kv_heads} * d;
  int64_t p = h * h * 2 + h * kv * 2;  // q, o, k, v
  if (r.swiglu) {
    p += 3 * h * r.ffn + 2 * h;  // MLP + two RMSNorm weights
  } else {
    p += 2 * h * r.ffn + r.ffn + h;  // MLP with biases
    p += 3 * h + h;                  // qkv and out biases
    p += 4 * h;                      // two LayerNorms
  }
  return p;
}

struct RowWork {
  LayerWork work;
  bool fp32 = false;
};

RowWork BuildRowWork(const MeasuredLayer& r) {
  RowWork rw;
  rw.fp32 = r.fp32;
  LayerWork& w = rw.work;
  const Family fam = FamilyOf(r);
  const double b = r.batch, s = r.seq, T = b * s;
  const double h = r.hidden, a = r.heads, d = h / a;
  const double kvd = r.kv_heads * d, f = r.ffn;
  const double eb = r.fp32 ? 4.0 : 2.0;
  // Projections.
  if (fam == Family::kGpt) {
    w.gemms.push_back({T, 3 * h, h});
  } else {
    w.gemms.push_back({T, h, h});
    w.gemms.push_back({T, kvd, h});
    w.gemms.push_back({T, kvd, h});
  }
  w.gemms.push_back({T, h, h});
  if (r.swiglu) {
    w.gemms.push_back({T, f, h});
    w.gemms.push_back({T, f, h});
    w.gemms.push_back({T, h, f});
  } else {
    w.gemms.push_back({T, f, h});
    w.gemms.push_back({T, h, f});
  }
  // Attention core and element-wise traffic.
  double acc = 0;  // element accesses per token
  double scores_acc = 0;
  if (fam == Family::kLlama || fam == Family::kMistral) {
    acc += 2 * kHfRmsNormAccesses * h + kHfRopeAccesses * (h + kvd) +
           2 * h /* output transpose */ + 2 * kResidualAccesses * h +
           kSwiGluAccesses * f;
  }
  if (fam == Family::kLlama) {
    // SDPA / flash, causal: half of the s x s work.
    const double fwd = 2.0 * s * s * b * a * (2 * d) * 0.5;
    w.fused_attn_fwd_flops = fwd;
    w.fused_attn_bwd_flops = 2.5 * fwd;
  } else {
    // Eager: full s x s batched matmuls (the GPT mask skips nothing).
    w.gemms.push_back({s, s, d * b * a});
    w.gemms.push_back({s, d, s * b * a});
    if (fam == Family::kMistral) {
      acc += 2 * (h + kvd);  // repeat_kv copies of k and v
      scores_acc = kEagerScoresMistral;
    } else if (fam == Family::kGpt) {
      acc += 2 * kLayerNormAccesses * h + 2 * h /* merge heads */ +
             2 * 3 * h /* q,k,v head split copies */ +
             2 * kDropoutAccesses * h + 2 * kResidualAccesses * h +
             kGeluNewAccesses * f;
      scores_acc = kEagerScoresGpt;
    } else {
      acc += 2 * kLayerNormAccesses * h + 2 * h /* context permute */ +
             2 * kDropoutAccesses * h + 2 * kResidualAccesses * h +
             kGeluAccesses * f;
      scores_acc = kEagerScoresBert;
    }
  }
  w.fwd_bytes = eb * (T * acc + scores_acc * b * a * s * s);
  return rw;
}

LayerTime PredictWork(const RowWork& rw, const GpuType& gpu,
                      const CalibrationParams& p, double params) {
  LayerWork w = rw.work;
  w.bwd_bytes = p.bwd_elementwise_ratio * w.fwd_bytes +
                params * (rw.fp32 ? kGradAccumBytesFp32 : kGradAccumBytesFp16);
  const double peak = rw.fp32 ? gpu.peak_fp32_tflops : gpu.peak_bf16_tflops;
  const double eff = rw.fp32 ? p.fp32_gemm_eff_max : p.gemm_eff_max;
  return EstimateLayerTime(w, p, peak, eff, gpu.hbm_gbps, 1);
}

// ---------------------------------------------------------------------------
// Fitting.

struct FitRow {
  RowWork rw;
  double params = 0;
  double fwd = 0, bwd = 0;
  bool fp32 = false, llama = false;
};

constexpr int kNumFit = 7;
constexpr int kFitRounds = 6;
constexpr int kFitEvalsPerRound = 3000;
// Relative increase of the mean fwd+bwd error within which the small-GEMM
// half-point counts as not determined by the rows (see Fit).
constexpr double kHalfPointSlack = 0.02;
using Vec = std::array<double, kNumFit>;

double Logistic(double u) { return 1.0 / (1.0 + std::exp(-u)); }

// Physically plausible range of each fitted parameter; the search runs in
// unbounded coordinates u with x = lo + (hi - lo) * logistic(u).
struct Bound {
  double lo, hi;
};
constexpr std::array<Bound, kNumFit> kBounds = {{
    {0.20, 0.95},   // gemm_eff_max
    {0.01, 50.0},   // gemm_half_gflop
    {0.20, 0.98},   // fp32_gemm_eff_max
    {0.10, 1.50},   // attn_eff_rel
    {0.30, 0.90},   // mem_eff
    {0.50, 1.50},   // bwd_eff_rel
    {1.00, 400.0},  // layer_overhead_us
}};

double ToX(int i, double u) {
  return kBounds[i].lo + (kBounds[i].hi - kBounds[i].lo) * Logistic(u);
}
double ToU(int i, double x) {
  const double y = (x - kBounds[i].lo) / (kBounds[i].hi - kBounds[i].lo);
  return std::log(y / (1.0 - y));
}

// Transformed coordinates (unbounded) <-> parameters.
CalibrationParams FromVec(const Vec& u, const CalibrationParams& base) {
  CalibrationParams p = base;
  p.gemm_eff_max = ToX(0, u[0]);
  p.gemm_half_gflop = ToX(1, u[1]);
  p.fp32_gemm_eff_max = ToX(2, u[2]);
  p.attn_eff_rel = ToX(3, u[3]);
  p.mem_eff = ToX(4, u[4]);
  p.bwd_eff_rel = ToX(5, u[5]);
  p.layer_overhead_us = ToX(6, u[6]);
  return p;
}
Vec ToVec(const CalibrationParams& p) {
  return {ToU(0, p.gemm_eff_max),      ToU(1, p.gemm_half_gflop),
          ToU(2, p.fp32_gemm_eff_max), ToU(3, p.attn_eff_rel),
          ToU(4, p.mem_eff),           ToU(5, p.bwd_eff_rel),
          ToU(6, p.layer_overhead_us)};
}

double Objective(const std::vector<const FitRow*>& rows, const GpuType& gpu,
                 const CalibrationParams& p) {
  double sum = 0;
  for (const FitRow* r : rows) {
    const LayerTime t = PredictWork(r->rw, gpu, p, r->params);
    const double ef = t.fwd_ms / r->fwd - 1, eb = t.bwd_ms / r->bwd - 1;
    sum += ef * ef + eb * eb;
  }
  return rows.empty() ? 0 : sum / rows.size();
}

// Nelder-Mead over the `active` coordinates; deterministic.
Vec NelderMead(const std::function<double(const Vec&)>& f, Vec x0,
               const std::array<bool, kNumFit>& active, int max_evals) {
  std::vector<int> dims;
  for (int i = 0; i < kNumFit; ++i)
    if (active[i]) dims.push_back(i);
  const int n = static_cast<int>(dims.size());
  std::vector<Vec> simplex(n + 1, x0);
  std::vector<double> val(n + 1);
  for (int i = 0; i < n; ++i) simplex[i + 1][dims[i]] += 0.5;
  int evals = 0;
  for (int i = 0; i <= n; ++i) val[i] = f(simplex[i]), ++evals;
  std::vector<int> order(n + 1);
  while (evals < max_evals) {
    for (int i = 0; i <= n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return val[a] < val[b]; });
    const int best = order[0], worst = order[n], second = order[n - 1];
    if (std::abs(val[worst] - val[best]) <= 1e-12 * (1 + std::abs(val[best])))
      break;
    Vec c{};
    for (int i = 0; i <= n; ++i) {
      if (i == worst) continue;
      for (int d : dims) c[d] += simplex[i][d] / n;
    }
    auto along = [&](double t) {
      Vec x = simplex[worst];
      for (int d : dims) x[d] = c[d] + t * (simplex[worst][d] - c[d]);
      return x;
    };
    Vec xr = along(-1.0);
    double fr = f(xr);
    ++evals;
    if (fr < val[best]) {
      Vec xe = along(-2.0);
      double fe = f(xe);
      ++evals;
      if (fe < fr) {
        simplex[worst] = xe, val[worst] = fe;
      } else {
        simplex[worst] = xr, val[worst] = fr;
      }
    } else if (fr < val[second]) {
      simplex[worst] = xr, val[worst] = fr;
    } else {
      const bool outside = fr < val[worst];
      Vec xc = along(outside ? -0.5 : 0.5);
      double fc = f(xc);
      ++evals;
      if (fc < (outside ? fr : val[worst])) {
        simplex[worst] = xc, val[worst] = fc;
      } else {
        for (int i = 0; i <= n; ++i) {
          if (i == best) continue;
          for (int d : dims)
            simplex[i][d] = simplex[best][d] + 0.5 * (simplex[i][d] - simplex[best][d]);
          val[i] = f(simplex[i]);
          ++evals;
        }
      }
    }
  }
  int best = 0;
  for (int i = 1; i <= n; ++i)
    if (val[i] < val[best]) best = i;
  return simplex[best];
}

struct Acc {
  int n = 0;
  double f = 0, b = 0, t = 0, mx = 0;
  void Add(const LayerTime& p, const FitRow& r) {
    const double ef = std::abs(p.fwd_ms / r.fwd - 1);
    const double eb = std::abs(p.bwd_ms / r.bwd - 1);
    const double et = std::abs((p.fwd_ms + p.bwd_ms) / (r.fwd + r.bwd) - 1);
    ++n;
    f += ef, b += eb, t += et;
    mx = std::max({mx, ef, eb, et});
  }
  void Merge(const Acc& o) {
    n += o.n, f += o.f, b += o.b, t += o.t, mx = std::max(mx, o.mx);
  }
  ErrorStats Stats() const {
    ErrorStats s;
    s.rows = n;
    if (n == 0) return s;
    s.mape_fwd = 100 * f / n;
    s.mape_bwd = 100 * b / n;
    s.mape_total = 100 * t / n;
    s.max_ape = 100 * mx;
    return s;
  }
};

CalibrationParams Fit(const std::vector<const FitRow*>& rows,
                      const GpuType& gpu, const CalibrationParams& start) {
  std::array<bool, kNumFit> active;
  active.fill(true);
  bool any_fp32 = false, any_fused = false;
  for (const FitRow* r : rows) {
    any_fp32 |= r->fp32;
    any_fused |= r->rw.work.fused_attn_fwd_flops > 0;
  }
  active[2] = any_fp32;
  active[3] = any_fused;
  auto f = [&](const Vec& u) { return Objective(rows, gpu, FromVec(u, start)); };
  auto fit = [&](const std::array<bool, kNumFit>& act) {
    Vec x = ToVec(start);
    // Fixed restarts from the best point so far shake the simplex loose.
    for (int round = 0; round < kFitRounds; ++round)
      x = NelderMead(f, x, act, kFitEvalsPerRound);
    return x;
  };
  const Vec free = fit(active);
  // Per layer the small-GEMM half-point adds the same time to every GEMM
  // call, like the per-layer overhead; only rows that tell the two apart
  // determine it: layers with different numbers of GEMM calls (SwiGLU and
  // flash attention against GeLU and eager attention), or FP32 rows (another
  // peak). Otherwise it is free to follow a few outliers (A100-80GB's LLaMA
  // rows fitted 24.8 GFLOP, a 98 us GEMM at half efficiency, which prices a
  // TP-8 slice of a GPT layer ~40% too slowly). When holding it at the start
  // value leaves the fwd+bwd error that users see within kHalfPointSlack of
  // the free fit's, the start value is kept.
  std::array<bool, kNumFit> held = active;
  held[1] = false;
  const Vec fixed = fit(held);
  auto mean_error = [&](const Vec& u) {
    const CalibrationParams p = FromVec(u, start);
    Acc acc;
    for (const FitRow* r : rows)
      acc.Add(PredictWork(r->rw, gpu, p, r->params), *r);
    return acc.Stats().mape_total;
  };
  return FromVec(
      mean_error(fixed) <= (1 + kHalfPointSlack) * mean_error(free) ? fixed
                                                                     : free,
      start);
}

uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool ContainsAny(const GpuType& g, std::initializer_list<absl::string_view> ws) {
  std::string hay = absl::StrCat(g.id, " ", g.product_name, " ",
                                 absl::StrJoin(g.aliases, " "));
  for (absl::string_view w : ws)
    if (ContainsNoCase(hay, w)) return true;
  return false;
}

}  // namespace

std::string MeasuredLayer::SeriesKey() const {
  return absl::StrCat(model, "|", gpu, "|", seq, "|",
                      fp32 ? "float32" : "float16");
}

bool IsHeldOutSeries(absl::string_view series_key) {
  return Fnv1a64(series_key) % 5 == 0;
}

absl::StatusOr<std::vector<MeasuredLayer>> ParseMeasuredLayerCsv(
    absl::string_view csv_text) {
  std::vector<absl::string_view> lines = absl::StrSplit(csv_text, '\n');
  if (lines.empty() || absl::StripAsciiWhitespace(lines[0]).empty())
    return absl::InvalidArgumentError("line 1: missing CSV header");
  const std::vector<std::string> header =
      SplitCsvLine(absl::StripSuffix(lines[0], "\r"));
  absl::flat_hash_map<std::string, int> col;
  for (int i = 0; i < static_cast<int>(header.size()); ++i)
    col[std::string(absl::StripAsciiWhitespace(header[i]))] = i;
  static const char* kRequired[] = {
      "model",  "family", "hidden", "heads",      "kv_heads", "ffn",   "mlp_type",
      "seq_len", "dtype", "gpu",    "batch_size", "fwd_ms",   "bwd_ms"};
  for (const char* name : kRequired) {
    if (!col.contains(name))
      return absl::InvalidArgumentError(
          absl::StrCat("line 1: header lacks column \"", name, "\""));
  }
  std::vector<MeasuredLayer> rows;
  for (size_t li = 1; li < lines.size(); ++li) {
    absl::string_view line = absl::StripSuffix(lines[li], "\r");
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const int line_no = static_cast<int>(li) + 1;
    const std::vector<std::string> f = SplitCsvLine(line);
    if (f.size() < header.size())
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_no, ": expected ", header.size(), " columns, got ",
          f.size()));
    auto err = [&](const char* name, absl::string_view why) {
      const int c = col.at(name);
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ", column ", c + 1, " (", name,
                       "): ", why, " \"", f[c], "\""));
    };
    auto get_int = [&](const char* name, int* out) -> absl::Status {
      if (!absl::SimpleAtoi(f[col.at(name)], out) || *out <= 0)
        return err(name, "expected a positive integer, got");
      return absl::OkStatus();
    };
    auto get_ms = [&](const char* name, double* out) -> absl::Status {
      if (!absl::SimpleAtod(f[col.at(name)], out) || !std::isfinite(*out) ||
          *out <= 0)
        return err(name, "expected a positive number, got");
      return absl::OkStatus();
    };
    MeasuredLayer r;
    r.line = line_no;
    r.model = f[col.at("model")];
    if (r.model.empty()) return err("model", "empty value");
    r.family = f[col.at("family")];
    if (r.family != "gpt" && r.family != "llama" && r.family != "mistral" &&
        r.family != "bert")
      return err("family", "expected gpt, llama, mistral or bert, got");
    if (absl::Status s = get_int("hidden", &r.hidden); !s.ok()) return s;
    if (absl::Status s = get_int("heads", &r.heads); !s.ok()) return s;
    if (absl::Status s = get_int("kv_heads", &r.kv_heads); !s.ok()) return s;
    if (absl::Status s = get_int("ffn", &r.ffn); !s.ok()) return s;
    if (r.hidden % r.heads != 0)
      return err("heads", "does not divide hidden: got");
    if (r.heads % r.kv_heads != 0)
      return err("kv_heads", "does not divide heads: got");
    const std::string& mlp = f[col.at("mlp_type")];
    if (mlp == "swiglu_3mat") {
      r.swiglu = true;
    } else if (mlp != "gelu_2mat") {
      return err("mlp_type", "expected gelu_2mat or swiglu_3mat, got");
    }
    if (absl::Status s = get_int("seq_len", &r.seq); !s.ok()) return s;
    const std::string& dtype = f[col.at("dtype")];
    if (dtype == "float32") {
      r.fp32 = true;
    } else if (dtype != "float16") {
      return err("dtype", "expected float16 or float32, got");
    }
    r.gpu = f[col.at("gpu")];
    if (r.gpu.empty()) return err("gpu", "empty value");
    if (absl::Status s = get_int("batch_size", &r.batch); !s.ok()) return s;
    if (absl::Status s = get_ms("fwd_ms", &r.fwd_ms); !s.ok()) return s;
    if (absl::Status s = get_ms("bwd_ms", &r.bwd_ms); !s.ok()) return s;
    if (col.contains("source_note")) r.note = f[col.at("source_note")];
    rows.push_back(std::move(r));
  }
  return rows;
}

absl::StatusOr<std::string> CephaloGpuToCatalogId(absl::string_view key) {
  static const auto* kMap = new std::map<std::string, std::string, std::less<>>{
      {"a100x40", "A100-40GB"},   {"a100x80", "A100-80GB"},
      {"a6000", "A6000"},         {"v100x16", "V100-16GB"},
      {"v100-pciex16", "V100-16GB"}, {"p100", "P100"}};
  auto it = kMap->find(key);
  if (it == kMap->end())
    return absl::NotFoundError(
        absl::StrCat("Cephalo GPU \"", key, "\" has no catalog id"));
  return it->second;
}

const std::map<std::string, std::string>& DefaultGpuMapping() {
  static const auto* kMap = new std::map<std::string, std::string>{
      {"H100-80GB", "A100-80GB"},   {"H200-141GB", "A100-80GB"},
      {"B200", "A100-80GB"},        {"MI300X", "A100-80GB"},
      {"A5000", "A6000"},           {"RTX-6000-ADA", "A6000"},
      {"RTX-PRO-6000", "A6000"},    {"RTX-3090", "A6000"},
      {"L40S", "A6000"},            {"L4", "A6000"},
      {"A10", "A6000"},             {"A10G", "A6000"},
      {"V100-32GB", "V100-16GB"},   {"T4", "V100-16GB"},
      {"P40", "P100"}};
  return *kMap;
}

std::string MapUnmeasuredGpu(const GpuType& gpu) {
  const auto& table = DefaultGpuMapping();
  if (auto it = table.find(gpu.id); it != table.end()) return it->second;
  if (ContainsAny(gpu, {"V100", "T4", "TITAN V"})) return "V100-16GB";
  if (ContainsAny(gpu, {"P100", "P40"})) return "P100";
  if (ContainsAny(gpu, {"A100"}))
    return gpu.memory_gib > 45 ? "A100-80GB" : "A100-40GB";
  if (gpu.hbm_gbps >= 1500) return "A100-80GB";
  return "A6000";
}

// ---------------------------------------------------------------------------
// Published matmul throughput and board power (the new unmeasured-GPU rule).
//
// Matmul figures are torch.mm of square matrices 1024..10240 (6 warm-up + 30
// timed iterations per size) from zzc0721/torch-performance-test-data
// (database.md, or the issue that posted the per-size figures), the best
// size unless the source shows the part throttling over the longer runs;
// there the sustained figure is used (T4, L4). bf16 where the part has it,
// else fp16; FP32 with TF32 off.
const std::map<std::string, GpuThroughput>& PublishedGpuThroughput() {
  static const auto* kTable = new std::map<std::string, GpuThroughput>{
      {"A100-40GB",
       {246.33, 18.11, 400,
        "torch-performance-test-data database.md \"NVIDIA A100 40GB\" (bf16 "
        "246.33, fp32 18.11); TDP 400 W A100 SXM (technolynx.com, power-"
        "thermals-and-the-hidden-governors-of-performance)"}},
      {"A100-80GB",
       {264.53, 19.18, 400,
        "torch-performance-test-data database.md \"NVIDIA A100 SXM4 80GB\" "
        "(bf16 264.53, fp32 19.18); TDP 400 W (technolynx.com)"}},
      {"A6000",
       {123.34, 23.92, 0,
        "torch-performance-test-data database.md \"NVIDIA RTX A6000\" (bf16 "
        "123.34, fp32 23.92)"}},
      {"V100-16GB",
       {97.36, 14.51, 0,
        "torch-performance-test-data issue #140 Tesla V100-SXM2-16GB (fp16 "
        "97.36 at 8192, fp32 14.51)"}},
      {"V100-32GB",
       {97.36, 14.51, 0,
        "as V100-16GB: the SXM2-16GB measurement (issue #140), same GV100 "
        "SXM2 part; no 32 GB SXM2 figure found"}},
      {"P100",
       {8.39, 8.63, 0,
        "torch-performance-test-data issues #174/#175/#177 Tesla "
        "P100-PCIE-16GB (fp16 8.39 at 4096, fp32 8.63): no tensor cores, "
        "16-bit runs at about the FP32 rate"}},
      {"P40",
       {10.02, 10.07, 0,
        "torch-performance-test-data database.md \"NVIDIA Tesla P40 24GB\" "
        "(fp16 10.02, fp32 10.07)"}},
      {"T4",
       {24, 4.17, 70,
        "forums.developer.nvidia.com/t/about-gpu-peak-performance/264462: "
        "cuBLAS fp16 4096^3, 100-iteration mean ~24 TFLOPS, 'arising due to "
        "power capping' at ~70 W (the 30-iteration database.md rows, 41.9 / "
        "42.7, are bursts before the cap); fp32 4.17 database.md (Colab)"}},
      {"L4",
       {56.90, 11.11, 72,
        "torch-performance-test-data issue #120 NVIDIA L4: bf16 56.90 at "
        "10240 (the longest run; 70.89 at 2048 is a burst above the 72 W "
        "cap), fp32 11.11 at 10240; TDP 72 W pcpartdb.com/gpus/view/nvidia-l4"}},
      {"A10G",
       {69.47, 23.37, 0,
        "torch-performance-test-data issue #126 NVIDIA A10G (bf16 69.47 at "
        "10240, fp32 23.37)"}},
      {"L40S",
       {269.15, 46.88, 350,
        "torch-performance-test-data database.md \"NVIDIA L40S\" (bf16 "
        "269.15, fp32 46.88); TDP 350 W grokipedia.com/page/NVIDIA_L4_vs_L40S"}},
      {"H100-80GB",
       {783.66, 52.11, 700,
        "torch-performance-test-data database.md \"NVIDIA H100 80GB HBM3\" "
        "(clow1710 row: bf16 783.66, fp32 52.11; the other row's fp32 403.74 "
        "is TF32); TDP 700 W H100 SXM (technolynx.com)"}},
      {"H200-141GB",
       {790.29, 51.34, 0,
        "torch-performance-test-data database.md \"NVIDIA H200\" (bf16 "
        "790.29, fp32 51.34)"}},
      {"B200",
       {1696.03, 66.24, 0,
        "torch-performance-test-data database.md \"NVIDIA B200 180GB\" (bf16 "
        "1696.03, fp32 66.24)"}},
      {"RTX-PRO-6000",
       {417.98, 77.24, 0,
        "torch-performance-test-data database.md \"NVIDIA RTX PRO 6000 "
        "Workstation 96G\" (bf16 417.98, fp32 77.24)"}},
      {"RTX-3090",
       {76.34, 24.46, 0,
        "torch-performance-test-data database.md \"NVIDIA RTX 3090 24GB\" "
        "(zzc0208 row: bf16 76.34, fp32 24.46)"}},
      {"MI300X",
       {668.4, 0, 0,
        "stas00/ml-engineering compute/accelerator/README.md MAMF table: "
        "AMD MI300X bf16 668.4 (mean of 100 iterations, best shape)"}},
  };
  return *kTable;
}

GpuThroughput ThroughputOf(const GpuType& gpu) {
  const auto& table = PublishedGpuThroughput();
  auto it = table.find(gpu.id);
  return it == table.end() ? GpuThroughput{} : it->second;
}

namespace {

// Median; the mean of the middle two for an even count. 0 when empty.
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Same bounds as the fit, so a derived type never leaves the range a
// fitted one could take.
constexpr double kGemmEffLo = 0.20, kGemmEffHi = 0.95;
constexpr double kFp32EffLo = 0.20, kFp32EffHi = 0.98;
constexpr double kHalfLo = 0.01, kHalfHi = 50.0;

// A matmul figure above this multiple of the datasheet peak is a unit or
// row mix-up, not a faster chip (boost above the datasheet clock reaches a
// few percent: RTX 3090 76.34 of 71).
constexpr double kMaxMatmulOverPeak = 1.5;

absl::Status CheckThroughput(const std::string& id, const GpuThroughput& t,
                             double peak16, double peak32) {
  for (auto [v, field, peak] :
       {std::tuple<double, const char*, double>{t.matmul_tflops,
                                                "matmul_tflops", peak16},
        {t.matmul_fp32_tflops, "matmul_fp32_tflops", peak32},
        {t.tdp_w, "tdp_w", 0}}) {
    if (!(v >= 0) || !std::isfinite(v))
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu ", id, ": ", field, " must be a number >= 0, got ", v));
    if (peak > 0 && v > kMaxMatmulOverPeak * peak)
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu ", id, ": ", field, " ", v, " exceeds ", kMaxMatmulOverPeak,
          "x the datasheet peak ", peak));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::pair<const char*, double UnmeasuredGpuRule::*>>&
UnmeasuredGpuRuleFields() {
  using R = UnmeasuredGpuRule;
  static const auto* kFields =
      new std::vector<std::pair<const char*, double R::*>>{
          {"gemm_eff_per_matmul", &R::gemm_eff_per_matmul},
          {"fp32_eff_per_matmul", &R::fp32_eff_per_matmul},
          {"matmul_fraction", &R::matmul_fraction},
          {"matmul_fraction_low_power", &R::matmul_fraction_low_power},
          {"fp32_matmul_fraction", &R::fp32_matmul_fraction},
          {"gemm_half_us", &R::gemm_half_us},
          {"attn_eff_rel", &R::attn_eff_rel},
          {"mem_eff", &R::mem_eff},
          {"bwd_eff_rel", &R::bwd_eff_rel},
          {"layer_overhead_us", &R::layer_overhead_us}};
  return *kFields;
}

absl::StatusOr<UnmeasuredGpuRule> DeriveUnmeasuredGpuRule(
    absl::Span<const CalibrationDonor> donors,
    absl::Span<const GpuType> reference) {
  if (donors.empty())
    return absl::FailedPreconditionError(
        "unmeasured-GPU rule: no fitted GPU type to derive it from");
  UnmeasuredGpuRule rule;
  std::vector<double> k16, k32, half, attn, mem, bwd, ovh;
  for (const CalibrationDonor& d : donors) {
    const GpuType& g = d.gpu;
    if (absl::Status s = CheckThroughput(g.id, d.throughput,
                                         g.peak_bf16_tflops,
                                         g.peak_fp32_tflops);
        !s.ok())
      return s;
    rule.donors.push_back(g.id);
    const CalibrationParams& p = d.params;
    if (d.throughput.matmul_tflops > 0)
      k16.push_back(p.gemm_eff_max /
                    (d.throughput.matmul_tflops / g.peak_bf16_tflops));
    if (d.fp32_fitted && d.throughput.matmul_fp32_tflops > 0)
      k32.push_back(p.fp32_gemm_eff_max /
                    (d.throughput.matmul_fp32_tflops / g.peak_fp32_tflops));
    // GFLOP / TFLOPS = ms; the half-point as the time of a GEMM at it.
    half.push_back(1e3 * p.gemm_half_gflop /
                   (p.gemm_eff_max * g.peak_bf16_tflops));
    if (d.attn_fitted) attn.push_back(p.attn_eff_rel);
    mem.push_back(p.mem_eff);
    bwd.push_back(p.bwd_eff_rel);
    ovh.push_back(p.layer_overhead_us);
  }
  if (k16.empty())
    return absl::FailedPreconditionError(absl::StrCat(
        "unmeasured-GPU rule: none of the fitted types (",
        absl::StrJoin(rule.donors, ", "),
        ") has a published 16-bit matmul_tflops"));
  rule.gemm_eff_per_matmul = Median(k16);
  const CalibrationParams defaults;
  // Without an FP32 donor the measured FP32 fraction is taken as is.
  rule.fp32_eff_per_matmul = k32.empty() ? 1.0 : Median(k32);
  rule.gemm_half_us = Median(half);
  rule.attn_eff_rel = attn.empty() ? defaults.attn_eff_rel : Median(attn);
  rule.mem_eff = Median(mem);
  rule.bwd_eff_rel = Median(bwd);
  rule.layer_overhead_us = Median(ovh);
  std::vector<double> f_hi, f_lo, f32;
  for (const GpuType& g : reference) {
    const GpuThroughput t = ThroughputOf(g);
    if (absl::Status s = CheckThroughput(g.id, t, g.peak_bf16_tflops,
                                         g.peak_fp32_tflops);
        !s.ok())
      return s;
    if (t.matmul_tflops > 0) {
      const bool low = t.tdp_w > 0 && t.tdp_w <= kLowPowerTdpW;
      (low ? f_lo : f_hi).push_back(t.matmul_tflops / g.peak_bf16_tflops);
    }
    if (t.matmul_fp32_tflops > 0)
      f32.push_back(t.matmul_fp32_tflops / g.peak_fp32_tflops);
  }
  // Donors stand in when the reference set has no figure (tests, custom
  // catalogs).
  for (const CalibrationDonor& d : donors) {
    if (f_hi.empty() && f_lo.empty() && d.throughput.matmul_tflops > 0)
      f_hi.push_back(d.throughput.matmul_tflops / d.gpu.peak_bf16_tflops);
  }
  rule.matmul_fraction = Median(f_hi.empty() ? f_lo : f_hi);
  rule.matmul_fraction_low_power = f_lo.empty() ? rule.matmul_fraction
                                                : Median(f_lo);
  rule.fp32_matmul_fraction =
      f32.empty() ? defaults.fp32_gemm_eff_max : Median(f32);
  return rule;
}

CalibrationParams ApplyUnmeasuredGpuRule(const UnmeasuredGpuRule& rule,
                                         const GpuType& gpu,
                                         const GpuThroughput& t,
                                         const CalibrationParams& base) {
  CalibrationParams p = base;
  double f16 = rule.matmul_fraction;
  if (t.matmul_tflops > 0 && gpu.peak_bf16_tflops > 0) {
    f16 = t.matmul_tflops / gpu.peak_bf16_tflops;
  } else if (t.tdp_w > 0 && t.tdp_w <= kLowPowerTdpW) {
    f16 = rule.matmul_fraction_low_power;
  }
  const double f32 = t.matmul_fp32_tflops > 0 && gpu.peak_fp32_tflops > 0
                         ? t.matmul_fp32_tflops / gpu.peak_fp32_tflops
                         : rule.fp32_matmul_fraction;
  p.gemm_eff_max =
      std::clamp(rule.gemm_eff_per_matmul * f16, kGemmEffLo, kGemmEffHi);
  p.fp32_gemm_eff_max =
      std::clamp(rule.fp32_eff_per_matmul * f32, kFp32EffLo, kFp32EffHi);
  p.gemm_half_gflop =
      std::clamp(1e-3 * rule.gemm_half_us * p.gemm_eff_max *
                     gpu.peak_bf16_tflops,
                 kHalfLo, kHalfHi);
  p.attn_eff_rel = rule.attn_eff_rel;
  p.mem_eff = rule.mem_eff;
  p.bwd_eff_rel = rule.bwd_eff_rel;
  p.layer_overhead_us = rule.layer_overhead_us;
  return p;
}

const CalibrationParams& CalibrationSet::For(absl::string_view gpu_id) const {
  auto it = by_gpu.find(std::string(gpu_id));
  return it == by_gpu.end() ? defaults : it->second;
}

CalibrationParams CalibrationSet::For(const GpuType& gpu) const {
  auto it = by_gpu.find(gpu.id);
  if (it != by_gpu.end()) return it->second;
  if (rule.has_value())
    return ApplyUnmeasuredGpuRule(*rule, gpu, ThroughputOf(gpu), defaults);
  return For(MapUnmeasuredGpu(gpu));
}

CalibrationReport CalibrationReport::MappingRuleForm() const {
  CalibrationReport r = *this;
  r.rule.reset();
  r.derived.clear();
  r.logo.clear();
  r.logo_all = LogoResult{};
  r.mapping = old_mapping;
  r.notes = old_notes;
  return r;
}

CalibrationSet CalibrationReport::ToSet() const {
  CalibrationSet set;
  set.defaults = defaults;
  set.rule = rule;
  for (const GpuFit& g : gpus) {
    set.by_gpu[g.gpu_id] = g.params;
    set.fitted.push_back(g.gpu_id);
  }
  for (const DerivedGpu& d : derived) {
    set.by_gpu[d.gpu_id] = d.params;
    set.derived.push_back(d.gpu_id);
  }
  // Explicit overrides win over the derived parameters.
  for (const auto& [id, target] : mapping) {
    auto it = set.by_gpu.find(target);
    if (it == set.by_gpu.end()) continue;
    set.mapping[id] = target;
    set.by_gpu[id] = it->second;
  }
  return set;
}

LayerTime PredictMeasuredLayer(const MeasuredLayer& row, const GpuType& gpu,
                               const CalibrationParams& p) {
  return PredictWork(BuildRowWork(row), gpu, p,
                     static_cast<double>(LayerParams(row)));
}

namespace {

// The rule's constants fitted jointly to the donors' rows: each donor's
// parameters are the rule applied to it, and the squared relative fwd/bwd
// error over all their rows is minimised (Nelder-Mead as in Fit, from the
// medians). The fallback fractions come from the catalog and stay.
struct DonorRows {
  const CalibrationDonor* donor;
  std::vector<const FitRow*> rows;
};

constexpr std::array<Bound, kNumFit> kRuleBounds = {{
    {0.50, 1.20},   // gemm_eff_per_matmul
    {0.50, 1.20},   // fp32_eff_per_matmul (not fitted, see below)
    {0.01, 200.0},  // gemm_half_us
    {0.10, 1.50},   // attn_eff_rel
    {0.30, 0.90},   // mem_eff
    {0.50, 1.50},   // bwd_eff_rel
    {1.00, 400.0},  // layer_overhead_us
}};
constexpr std::array<double UnmeasuredGpuRule::*, kNumFit> kRuleMembers = {
    &UnmeasuredGpuRule::gemm_eff_per_matmul,
    &UnmeasuredGpuRule::fp32_eff_per_matmul,
    &UnmeasuredGpuRule::gemm_half_us,
    &UnmeasuredGpuRule::attn_eff_rel,
    &UnmeasuredGpuRule::mem_eff,
    &UnmeasuredGpuRule::bwd_eff_rel,
    &UnmeasuredGpuRule::layer_overhead_us};

UnmeasuredGpuRule FitUnmeasuredGpuRule(const UnmeasuredGpuRule& start,
                                       const std::vector<DonorRows>& donors,
                                       const CalibrationParams& base) {
  auto to_rule = [&](const Vec& u) {
    UnmeasuredGpuRule r = start;
    for (int i = 0; i < kNumFit; ++i)
      r.*kRuleMembers[i] =
          kRuleBounds[i].lo +
          (kRuleBounds[i].hi - kRuleBounds[i].lo) * Logistic(u[i]);
    return r;
  };
  Vec u0;
  for (int i = 0; i < kNumFit; ++i) {
    const Bound& b = kRuleBounds[i];
    // Keep the start strictly inside the range (the logit is infinite on
    // the bounds).
    const double margin = 1e-3 * (b.hi - b.lo);
    const double x =
        std::clamp(start.*kRuleMembers[i], b.lo + margin, b.hi - margin);
    const double y = (x - b.lo) / (b.hi - b.lo);
    u0[i] = std::log(y / (1 - y));
  }
  std::array<bool, kNumFit> active;
  active.fill(true);
  bool any_fused = false;
  size_t n = 0;
  for (const DonorRows& d : donors) {
    for (const FitRow* r : d.rows) {
      any_fused |= r->rw.work.fused_attn_fwd_flops > 0;
    }
    n += d.rows.size();
  }
  // fp32_eff_per_matmul stays at the donors' median: the FP32 matmul
  // fraction is measured directly, only some donors have FP32 rows, and
  // fitted jointly it runs to its bound (1.2 when A6000 is held out, FP32
  // 0.74 against its fitted 0.55) to buy a little on the others.
  active[1] = false;
  active[3] = any_fused;
  auto f = [&](const Vec& u) {
    const UnmeasuredGpuRule r = to_rule(u);
    double sum = 0;
    for (const DonorRows& d : donors) {
      const CalibrationParams p = ApplyUnmeasuredGpuRule(
          r, d.donor->gpu, d.donor->throughput, base);
      for (const FitRow* row : d.rows) {
        const LayerTime t = PredictWork(row->rw, d.donor->gpu, p, row->params);
        const double ef = t.fwd_ms / row->fwd - 1, eb = t.bwd_ms / row->bwd - 1;
        sum += ef * ef + eb * eb;
      }
    }
    return n == 0 ? 0 : sum / n;
  };
  Vec u = u0;
  for (int round = 0; round < kFitRounds; ++round)
    u = NelderMead(f, u, active, kFitEvalsPerRound);
  return to_rule(u);
}

}  // namespace

absl::StatusOr<CalibrationReport> Calibrate(
    absl::Span<const MeasuredLayer> rows, const GpuCatalog& catalog,
    const std::map<std::string, std::string>& overrides) {
  CalibrationReport report;
  // Group rows by catalog id.
  std::map<std::string, std::vector<FitRow>> by_gpu;
  std::map<std::string, std::set<std::string>> sources;
  std::map<std::string, int> skipped;
  for (const MeasuredLayer& r : rows) {
    absl::StatusOr<std::string> id = CephaloGpuToCatalogId(r.gpu);
    absl::StatusOr<int> idx =
        id.ok() ? catalog.IndexOf(*id) : absl::StatusOr<int>(id.status());
    if (!idx.ok()) {
      ++skipped[r.gpu];
      continue;
    }
    const std::string& cid = catalog.type(*idx).id;
    FitRow fr;
    fr.rw = BuildRowWork(r);
    fr.params = static_cast<double>(LayerParams(r));
    fr.fwd = r.fwd_ms;
    fr.bwd = r.bwd_ms;
    fr.fp32 = r.fp32;
    fr.llama = r.family == "llama";
    by_gpu[cid].push_back(std::move(fr));
    sources[cid].insert(r.gpu);
  }
  for (const auto& [gpu, n] : skipped)
    report.notes.push_back(absl::StrCat(
        n, " rows of Cephalo GPU ", gpu, " skipped: no catalog type"));
  report.old_notes = report.notes;
  if (by_gpu.empty())
    return absl::FailedPreconditionError(
        "calibrate: no measured row maps to a catalog GPU type");

  // Held-out flags, in row order per GPU.
  std::map<std::string, std::vector<bool>> held;
  std::map<std::string, std::set<std::string>> series, held_series;
  for (const MeasuredLayer& r : rows) {
    absl::StatusOr<std::string> id = CephaloGpuToCatalogId(r.gpu);
    if (!id.ok()) continue;
    absl::StatusOr<int> idx = catalog.IndexOf(*id);
    if (!idx.ok()) continue;
    const std::string& cid = catalog.type(*idx).id;
    const bool h = IsHeldOutSeries(r.SeriesKey());
    held[cid].push_back(h);
    series[cid].insert(r.SeriesKey());
    if (h) held_series[cid].insert(r.SeriesKey());
  }

  const CalibrationParams start;
  report.defaults = start;
  Acc all_acc, llama_acc, held_acc;
  for (auto& [cid, frs] : by_gpu) {
    const GpuType& gpu = catalog.type(*catalog.IndexOf(cid));
    GpuFit g;
    g.gpu_id = cid;
    g.source_gpus.assign(sources[cid].begin(), sources[cid].end());
    g.peak_bf16_tflops = gpu.peak_bf16_tflops;
    g.peak_fp32_tflops = gpu.peak_fp32_tflops;
    g.hbm_gbps = gpu.hbm_gbps;
    g.series = static_cast<int>(series[cid].size());
    g.heldout_series = static_cast<int>(held_series[cid].size());
    std::vector<const FitRow*> all, train, test;
    for (size_t i = 0; i < frs.size(); ++i) {
      all.push_back(&frs[i]);
      (held[cid][i] ? test : train).push_back(&frs[i]);
    }
    // Held-out estimate: fit on the training series only.
    if (!test.empty() && !train.empty()) {
      const CalibrationParams ptrain = Fit(train, gpu, start);
      Acc tr, te;
      for (const FitRow* r : train)
        tr.Add(PredictWork(r->rw, gpu, ptrain, r->params), *r);
      for (const FitRow* r : test)
        te.Add(PredictWork(r->rw, gpu, ptrain, r->params), *r);
      g.train = tr.Stats();
      g.heldout = te.Stats();
      held_acc.Merge(te);
    }
    // Shipped parameters: fit on every row.
    g.params = Fit(all, gpu, start);
    Acc a, a16, a16l, a32;
    for (const FitRow* r : all) {
      const LayerTime t = PredictWork(r->rw, gpu, g.params, r->params);
      a.Add(t, *r);
      (r->fp32 ? a32 : a16).Add(t, *r);
      if (!r->fp32 && r->llama) a16l.Add(t, *r);
    }
    g.all = a.Stats();
    g.fp16 = a16.Stats();
    g.fp16_llama = a16l.Stats();
    g.fp32 = a32.Stats();
    all_acc.Merge(a);
    llama_acc.Merge(a16l);
    report.gpus.push_back(std::move(g));
  }
  report.overall = all_acc.Stats();
  report.overall_fp16_llama = llama_acc.Stats();
  report.overall_heldout = held_acc.Stats();
  // Donors: every fitted type with its shipped parameters. Each was fitted
  // on its own rows only, so for leave-one-GPU-out the others' parameters
  // are already free of the held-out type's rows.
  std::vector<CalibrationDonor> donors;
  for (const GpuFit& g : report.gpus) {
    CalibrationDonor d;
    d.gpu = catalog.type(*catalog.IndexOf(g.gpu_id));
    d.params = g.params;
    d.throughput = ThroughputOf(d.gpu);
    d.fp32_fitted = g.fp32.rows > 0;
    for (const FitRow& r : by_gpu[g.gpu_id])
      d.attn_fitted |= r.rw.work.fused_attn_fwd_flops > 0;
    donors.push_back(std::move(d));
  }
  // The rule: medians of the donors, then fitted jointly to their rows.
  auto derive = [&](const std::vector<CalibrationDonor>& ds)
      -> absl::StatusOr<UnmeasuredGpuRule> {
    absl::StatusOr<UnmeasuredGpuRule> r =
        DeriveUnmeasuredGpuRule(ds, catalog.types());
    if (!r.ok()) return r;
    std::vector<DonorRows> dr;
    for (const CalibrationDonor& d : ds) {
      DonorRows x{&d, {}};
      for (const FitRow& row : by_gpu[d.gpu.id]) x.rows.push_back(&row);
      dr.push_back(std::move(x));
    }
    return FitUnmeasuredGpuRule(*r, dr, start);
  };
  absl::StatusOr<UnmeasuredGpuRule> rule = derive(donors);
  if (rule.ok()) {
    report.rule = *rule;
  } else {
    report.notes.push_back(absl::StrCat(
        "no unmeasured-GPU rule (", rule.status().message(),
        "): unmeasured types use the old mapping"));
  }
  for (const auto& [id, target] : overrides) {
    if (!catalog.IndexOf(id).ok() || !by_gpu.contains(target) ||
        by_gpu.contains(id))
      return absl::InvalidArgumentError(absl::StrCat(
          "calibrate: override ", id, " -> ", target,
          " must map an unfitted catalog type to a fitted one"));
    report.mapping[id] = target;
  }
  for (const GpuType& t : catalog.types()) {
    if (by_gpu.contains(t.id)) continue;
    // The old mapping rule (the shipped default form), overrides first.
    const std::string target = MapUnmeasuredGpu(t);
    if (auto o = report.mapping.find(t.id); o != report.mapping.end()) {
      report.old_mapping[t.id] = o->second;
      continue;
    }
    if (by_gpu.contains(target)) {
      report.old_mapping[t.id] = target;
    } else {
      report.old_notes.push_back(absl::StrCat(
          t.id, " maps to ", target,
          ", which has no measurements: it uses the defaults"));
    }
    if (report.rule.has_value()) {
      DerivedGpu d;
      d.gpu_id = t.id;
      d.throughput = ThroughputOf(t);
      d.params = ApplyUnmeasuredGpuRule(*report.rule, t, d.throughput, start);
      if (d.throughput.matmul_tflops > 0) {
        d.basis = "measured";
        d.matmul_fraction = d.throughput.matmul_tflops / t.peak_bf16_tflops;
      } else if (d.throughput.tdp_w > 0 &&
                 d.throughput.tdp_w <= kLowPowerTdpW) {
        d.basis = "fallback, low-power";
        d.matmul_fraction = report.rule->matmul_fraction_low_power;
      } else {
        d.basis = "fallback";
        d.matmul_fraction = report.rule->matmul_fraction;
      }
      d.old_source = by_gpu.contains(target) ? target : "defaults";
      report.derived.push_back(std::move(d));
    } else if (by_gpu.contains(target)) {
      report.mapping[t.id] = target;
    } else {
      report.notes.push_back(absl::StrCat(
          t.id, " maps to ", target,
          ", which has no measurements: it uses the defaults"));
    }
  }

  // Leave-one-GPU-out.
  if (donors.size() >= 2) {
    std::vector<double> pooled_old, pooled_new, pooled_best;
    for (size_t h = 0; h < donors.size(); ++h) {
      const GpuType& gpu = donors[h].gpu;
      const std::vector<FitRow>& frs = by_gpu[gpu.id];
      std::vector<CalibrationDonor> rest;
      for (size_t i = 0; i < donors.size(); ++i)
        if (i != h) rest.push_back(donors[i]);
      auto errors = [&](const CalibrationParams& p) {
        std::vector<double> e;
        for (const FitRow& r : frs) {
          const LayerTime t = PredictWork(r.rw, gpu, p, r.params);
          e.push_back(100 * std::abs((t.fwd_ms + t.bwd_ms) / (r.fwd + r.bwd) -
                                     1));
        }
        return e;
      };
      auto mean = [](const std::vector<double>& v) {
        double s = 0;
        for (double x : v) s += x;
        return v.empty() ? 0 : s / v.size();
      };
      LogoResult lr;
      lr.gpu_id = gpu.id;
      lr.rows = static_cast<int>(frs.size());
      // Old rule: what MapUnmeasuredGpu picks; where that is the held-out
      // type itself, its bandwidth rule with the name rules off; where that
      // is missing too, the defaults (as Calibrate did for a mapping target
      // without measurements).
      auto fitted_other = [&](const std::string& id) {
        return id != gpu.id && by_gpu.contains(id);
      };
      GpuType anonymous = gpu;
      anonymous.id = anonymous.product_name = "";
      anonymous.aliases.clear();
      std::string old_id = MapUnmeasuredGpu(gpu);
      if (!fitted_other(old_id)) old_id = MapUnmeasuredGpu(anonymous);
      CalibrationParams old_p = start;
      lr.old_source = "defaults";
      for (const CalibrationDonor& d : rest)
        if (d.gpu.id == old_id) old_p = d.params, lr.old_source = old_id;
      const std::vector<double> e_old = errors(old_p);
      lr.old_median = Median(e_old);
      lr.old_mean = mean(e_old);
      // Best single copy.
      std::vector<double> e_best;
      for (const CalibrationDonor& d : rest) {
        std::vector<double> e = errors(d.params);
        if (e_best.empty() || mean(e) < mean(e_best))
          e_best = std::move(e), lr.best_source = d.gpu.id;
      }
      lr.best_median = Median(e_best);
      lr.best_mean = mean(e_best);
      // New rule from the others.
      absl::StatusOr<UnmeasuredGpuRule> r = derive(rest);
      if (!r.ok()) {
        report.notes.push_back(absl::StrCat("leave-one-GPU-out ", gpu.id,
                                            ": ", r.status().message()));
        continue;
      }
      lr.new_params = ApplyUnmeasuredGpuRule(*r, gpu, ThroughputOf(gpu), start);
      const std::vector<double> e_new = errors(lr.new_params);
      lr.new_median = Median(e_new);
      lr.new_mean = mean(e_new);
      pooled_old.insert(pooled_old.end(), e_old.begin(), e_old.end());
      pooled_new.insert(pooled_new.end(), e_new.begin(), e_new.end());
      pooled_best.insert(pooled_best.end(), e_best.begin(), e_best.end());
      report.logo.push_back(std::move(lr));
    }
    auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return v.empty() ? 0 : s / v.size();
    };
    report.logo_all.gpu_id = "all";
    report.logo_all.rows = static_cast<int>(pooled_new.size());
    report.logo_all.old_median = Median(pooled_old);
    report.logo_all.old_mean = mean(pooled_old);
    report.logo_all.new_median = Median(pooled_new);
    report.logo_all.new_mean = mean(pooled_new);
    report.logo_all.best_median = Median(pooled_best);
    report.logo_all.best_mean = mean(pooled_best);
  }
  return report;
}

namespace {
std::string Pct(double v) { return absl::StrFormat("%.6f", v); }
std::string StatsCells(const ErrorStats& s) {
  if (s.rows == 0) return "– | – | – | –";
  return absl::StrCat(Pct(s.mape_fwd), " | ", Pct(s.mape_bwd), " | ",
                      Pct(s.mape_total), " | ", Pct(s.max_ape));
}
}  // namespace

namespace {

// The fitted parameters as table cells, in the docs' column order.
std::string ParamCells(const CalibrationParams& p) {
  return absl::StrFormat("%.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.2f",
                         p.gemm_eff_max, p.gemm_half_gflop,
                         p.fp32_gemm_eff_max, p.attn_eff_rel, p.mem_eff,
                         p.bwd_eff_rel, p.layer_overhead_us);
}

}  // namespace

std::string RenderCalibrationMarkdown(const CalibrationReport& r,
                                      const UnmeasuredGpuExamples& examples) {
  std::string md;
  absl::StrAppend(&md, R"(# Calibration of the profile synthesizer

<!-- Generated by RenderCalibrationMarkdown (planner_service/core/calibration/synthesizer_fit.cc);
     regenerate with the command below, do not edit by hand. -->

Arachne fills missing per-layer profiles with an analytical roofline
(`planner_service/core/cost/profile_synthesizer.h`). Its efficiency constants are
fitted per GPU type to 1,276 published per-layer measurements from Cephalo
(`profiles/reference/cephalo/layer-latency.csv`, see the README there) and
shipped in `profiles/calibration.json`. GPU types without measurements get
theirs by the derived rule; the old mapping rule is kept for comparison in
`profiles/reference/calibration-mapping.json`
([GPUs without measurements](#gpus-without-measurements)).

## Reproduce

```
ARACHNE_UPDATE_CALIBRATION=1 build/test/synthesizer_fit_test --gtest_filter='ShippedCalibration.*'
```

rewrites `profiles/calibration.json` (derived rule),
`profiles/reference/calibration-mapping.json` (old mapping rule) and this file
from the CSV, the GPU catalog and the model catalog (`CalibrateFiles` in
`planner_service/io/profile_io.h`; `arachne profile calibrate --measured
CSV --out FILE --report FILE` runs the same code and writes the default
form and the report). Without the variable the test recomputes the fit and
checks the three files against it: calibration.json byte for byte, the
derived file and this file's figures to 1e-6. It is deterministic and
takes a few seconds on one core.

## Model

For one layer, one micro-batch, on one GPU of a TP group of size t:

    time = sum_GEMMs (flops_i + gemm_half_gflop*1e9) * (1 + tp_loss_per_degree*(t-1))
                     / (peak * gemm_eff_max)
         + attention_flops / (peak * gemm_eff_max * attn_eff_rel)
         + memory_bytes / (hbm_gbps * mem_eff)
         + layer_overhead_us

The GEMM term is the efficiency curve eff(w) = gemm_eff_max * w / (w + w_half)
(w = FLOPs of that GEMM on this GPU) written as a time: small GEMMs (small
micro-batches, TP slices, MoE experts with few tokens each) are slower per
FLOP. Attention is causal flash attention (half the s x s work; backward 2.5x
the forward FLOPs). The backward runs two GEMMs per forward GEMM at
efficiency x bwd_eff_rel, moves bwd_elementwise_ratio x the forward
element-wise bytes plus grad_accum_bytes_per_param per parameter, and pays
the fixed overhead twice. Peak is `peak_bf16_tflops` of the catalog
(`peak_fp32_tflops` for the FP32 calibration rows, with fp32_gemm_eff_max),
so the fitted efficiencies are relative to the catalog figures and reproduce
the measurements on those types exactly as fitted.

Synthesized profiles assume Megatron-style fused kernels: element-wise
traffic per token (16-bit) is two norms (2h each), two residual adds (3h
each), RoPE on q and k, and the MLP activation (3·ffn for SwiGLU, 2·ffn for
GeLU), all divided by t (sequence parallel).

For the calibration rows the measured layer is modelled as Cephalo ran it
(unfused Hugging Face kernels: RMSNorm 8 accesses/element, RoPE 10, SwiGLU
5, gelu_new 18; GPT/BERT/Mistral eager attention with the full b·heads·s²
score tensor written and re-read 13 / 9 / 8 times and its matmuls at full
s² FLOPs; LLaMA as causal SDPA/flash; gradient accumulation into fp32 .grad
18 B/param under fp16 autocast, 12 in FP32). Element-wise bytes are 2 per
element for float16 rows and 4 for float32 rows.

### Fit

Per catalog GPU type, Nelder-Mead (6 rounds of 3,000 evaluations, fixed
start = the defaults, each parameter searched inside a plausible range
through a logistic transform: gemm_eff_max 0.2–0.95, gemm_half_gflop
0.01–50, fp32_gemm_eff_max 0.2–0.98, attn_eff_rel 0.1–1.5, mem_eff
0.3–0.9, bwd_eff_rel 0.5–1.5, layer_overhead_us 1–400) minimises the mean of
(pred_fwd/meas_fwd − 1)² + (pred_bwd/meas_bwd − 1)² over its rows.
fp32_gemm_eff_max is only fitted where FP32 rows exist. Cephalo keys map to
catalog ids: a100x40 → A100-40GB, a100x80 → A100-80GB, a6000 → A6000,
v100x16 and v100-pciex16 → V100-16GB (the PCIe rows are fitted against the
SXM2 figures), p100 → P100 (the data is a P100-PCIE-12GB).

Held-out check: series (model × GPU × seq × dtype) whose FNV-1a-64 hash of
`model|gpu|seq|dtype` is 0 mod 5 are held out, the parameters refitted on the
rest, and the held-out rows predicted. The shipped parameters are then fitted
on all rows.

### Not fitted

The data has no tensor parallelism and no communication, so
`tp_loss_per_degree` (0.03 per degree), `comm_bw_eff` (0.75),
`collective_base_us` (8.4), `nvlink_step_us` (3.4), `pcie_step_us` (5.7),
`bwd_elementwise_ratio` (2) and `grad_accum_bytes_per_param` (8) keep their
defaults ([cost model](cost-model.md) gives each one's source).

## Errors (percent, absolute relative error)

MAPE = mean |pred/meas − 1|; max = largest error of fwd, bwd or fwd+bwd of
any row. Held-out: parameters fitted without the held-out series.

| GPU | Cephalo keys | rows | series (held out) | fwd MAPE | bwd MAPE | fwd+bwd MAPE | max | fp16 LLaMA rows | fp16 LLaMA fwd+bwd MAPE | held-out rows | held-out fwd+bwd MAPE |
|---|---|---|---|---|---|---|---|---|---|---|---|
)");
  for (const GpuFit& g : r.gpus) {
    absl::StrAppend(
        &md, "| ", g.gpu_id, " | ", absl::StrJoin(g.source_gpus, ", "), " | ",
        g.all.rows, " | ", g.series, " (", g.heldout_series, ") | ",
        StatsCells(g.all), " | ", g.fp16_llama.rows, " | ",
        g.fp16_llama.rows ? Pct(g.fp16_llama.mape_total) : "–", " | ",
        g.heldout.rows, " | ", g.heldout.rows ? Pct(g.heldout.mape_total) : "–",
        " |\n");
  }
  absl::StrAppend(&md, "| **all** | | ", r.overall.rows, " | | ",
                  StatsCells(r.overall), " | ", r.overall_fp16_llama.rows,
                  " | ", Pct(r.overall_fp16_llama.mape_total), " | ",
                  r.overall_heldout.rows, " | ",
                  Pct(r.overall_heldout.mape_total), " |\n\n");

  absl::StrAppend(&md,
                  "By precision (fwd, bwd, fwd+bwd MAPE, max):\n\n"
                  "| GPU | fp16 rows | fp16 | fp32 rows | fp32 |\n"
                  "|---|---|---|---|---|\n");
  for (const GpuFit& g : r.gpus) {
    absl::StrAppend(&md, "| ", g.gpu_id, " | ", g.fp16.rows, " | ",
                    g.fp16.rows ? StatsCells(g.fp16) : "–", " | ", g.fp32.rows,
                    " | ", g.fp32.rows ? StatsCells(g.fp32) : "–", " |\n");
  }

  absl::StrAppend(&md,
                  "\n## Fitted parameters\n\n"
                  "| GPU | peak 16-bit TFLOPS | peak FP32 | HBM GB/s | "
                  "gemm_eff_max | gemm_half_gflop | fp32_gemm_eff_max | "
                  "attn_eff_rel | mem_eff | bwd_eff_rel | layer_overhead_us |\n"
                  "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const GpuFit& g : r.gpus) {
    absl::StrAppend(
        &md, absl::StrFormat("| %s | %g | %g | %g | ", g.gpu_id,
                             g.peak_bf16_tflops, g.peak_fp32_tflops,
                             g.hbm_gbps),
        ParamCells(g.params), " |\n");
  }
  absl::StrAppend(&md, R"(
## GPUs without measurements

Two rules give a catalog type without measurements its parameters.

**The shipped default, `profiles/calibration.json`, uses the derived
rule**: it predicts held-out measured types better than the old mapping
(leave-one-GPU-out below: pooled, and on each type's mean error but
A6000's). The shipped
learned policies (`profiles/policies/`) were trained on it: their profile
fingerprint (`ProfileSetFingerprint`, [learned-policy.md](learned-policy.md))
covers the exact text of calibration.json, so with any other file the
learned planner refuses every shipped policy and planning falls back to
template-search (the local `arachne plan` is an exception, below). The old
mapping rule is kept for comparison as
`profiles/reference/calibration-mapping.json` (profiles/reference/ is not
built into the binaries).

### Old rule: the mapping

A type takes the efficiencies of a measured type (fractions of its own
peak and bandwidth, so nothing is scaled): the explicit table
`DefaultGpuMapping()`, else by product name (V100/T4 → V100-16GB,
P100/P40 → P100, A100 by memory), else HBM ≥ 1500 GB/s data-centre parts
(H100, H200, B200, MI300X) → A100-80GB, else (workstation and inference
Ampere/Ada/Blackwell cards) → A6000. Mapping written to
calibration-mapping.json:

| GPU | takes parameters of |
|---|---|
)");
  for (const auto& [id, target] : r.old_mapping)
    absl::StrAppend(&md, "| ", id, " | ", target, " |\n");
  absl::StrAppend(&md, R"(
### Shipped default: the derived rule

Rule (`DeriveUnmeasuredGpuRule` / `ApplyUnmeasuredGpuRule`): a type's GEMM
efficiency follows its own published matmul throughput instead of a
neighbour's fitted value,

    gemm_eff_max      = gemm_eff_per_matmul × matmul_tflops / peak_bf16_tflops
    fp32_gemm_eff_max = fp32_eff_per_matmul × matmul_fp32_tflops / peak_fp32_tflops

where matmul_tflops is the part's published sustained matmul throughput
and gemm_eff_per_matmul says how much of that square-matmul benchmark the
measured layers' GEMMs reach. A part that cannot hold its boost clock
under dense GEMMs at its power limit shows it in the benchmark (T4 24 of
65 TFLOPS at ~70 W, L4 56.9 of 121 at 72 W) and so gets a lower
efficiency than a full-power part with the same datasheet peak; the
datasheet peak alone cannot say this. Without a published figure the
matmul fraction is the median of the catalog parts that have one, in the
part's power class (board power ≤ 75 W: the T4/L4 class; else the rest).
The small-GEMM half-point is carried as a time (gemm_half_us =
gemm_half_gflop / effective TFLOPS). The rule's constants are derived
from the fitted types: first medians (gemm_eff_per_matmul = median of
fitted gemm_eff_max / own matmul fraction, likewise for FP32; medians of
the other efficiencies), then gemm_eff_per_matmul, gemm_half_us,
attn_eff_rel, mem_eff, bwd_eff_rel and layer_overhead_us are fitted
jointly to all the fitted types' rows, each type's parameters being the
rule applied to it (Nelder-Mead as above, ranges 0.5–1.2, 0.01–200 µs,
then as the per-type fit). fp32_eff_per_matmul stays at its median: the
FP32 fraction is measured directly, and fitted jointly it ran to its bound
when A6000 was held out. The jointly fitted constants trade against each
other (mem_eff and gemm_half_us end on their range limits, the overhead
near 300 µs per layer, the unfused Hugging Face kernels' launch cost):
individually they are not physical, together they predict the held-out
types below.
Matmul figures (sources in `PublishedGpuThroughput()`,
planner_service/core/calibration/synthesizer_fit.cc): torch.mm of square matrices
1024–10240 from zzc0721/torch-performance-test-data (database.md and its
issues), the best size, except where the part throttles over the longer
runs (T4: NVIDIA developer forum thread 264462, 100-iteration cuBLAS mean;
L4: the 10240 run); MI300X from the stas00/ml-engineering MAMF table.
bf16 where the part has it, else fp16.

)");
  if (r.rule.has_value()) {
    const UnmeasuredGpuRule& u = *r.rule;
    absl::StrAppend(
        &md,
        absl::StrFormat(
            "Derived rule (from %s): gemm_eff_per_matmul %.4f, "
            "fp32_eff_per_matmul %.4f, fallback matmul fraction %.4f "
            "(low-power class %.4f, FP32 %.4f), gemm_half_us %.4f, "
            "attn_eff_rel %.4f, mem_eff %.4f, bwd_eff_rel %.4f, "
            "layer_overhead_us %.2f.\n\n",
            absl::StrJoin(u.donors, ", "), u.gemm_eff_per_matmul,
            u.fp32_eff_per_matmul, u.matmul_fraction,
            u.matmul_fraction_low_power, u.fp32_matmul_fraction,
            u.gemm_half_us, u.attn_eff_rel, u.mem_eff, u.bwd_eff_rel,
            u.layer_overhead_us));
  }
  absl::StrAppend(&md, R"(#### Planning with another calibration

Use a profiles directory whose calibration.json is the other file
(`--profiles-dir` overrides the built-in data file by file), e.g. the old
mapping rule:

```
cp -r profiles /tmp/p
cp profiles/reference/calibration-mapping.json /tmp/p/calibration.json
arachne plan --profiles-dir /tmp/p --model llama3-8b --cluster examples/a100-h100-64.yaml
arachne-planner --profiles-dir /tmp/p      # the planning service
```

The learned planner then refuses the shipped policies until they are
retrained on that directory: their fingerprint is of the default
calibration.json, and planning falls back to template-search
(`planner: template-search (no learned policy serves model "llama3-8b":
... checkpoint was trained on another profile set ...; retrain it)`). One
exception: the local `arachne plan` checks the fingerprint against the
built-in calibration.json whatever `--profiles-dir` says
(planner_service/cli/main.cc registers the policy factory without it), so
it still prints `planner: learned` and steers the search over the other
costs with policies trained on the default's; give it `--planner
template-search` to plan without them, and serve retrained policies with
`arachne-planner`. Retrain each shipped policy on the directory, starting
from the shipped weights (`--init` accepts a checkpoint of another profile
set; the new one gets this set's fingerprint), with the settings in
[learned-policy.md](learned-policy.md#training), e.g.

```
arachne train --model llama3-8b --compositions 32 --episodes 48960 --seed 3 \
    --init profiles/policies/llama3-8b.pt \
    --profiles-dir /tmp/p --out /tmp/p/policies/llama3-8b.pt
arachne-planner --profiles-dir /tmp/p --policies-dir /tmp/p/policies
```

(likewise general, gpt-neo-2.7b, mixtral-8x7b, qwen3-30b-a3b and
qwen3-32b).

)");
  if (!examples.rows.empty()) {
    absl::StrAppend(
        &md, "What it changes, for example a ", examples.what,
        ",\nfwd+bwd ms (`arachne profile show` on /tmp/p above and on the "
        "default profiles):\n\n"
        "| GPU | old rule copies | old (mapping) ms | derived (default) ms | "
        "derived / old |\n|---|---|---|---|---|\n");
    for (const UnmeasuredGpuExample& e : examples.rows)
      absl::StrAppend(
          &md, absl::StrFormat("| %s | %s | %.2f | %.2f | %.2f |\n", e.gpu_id,
                               e.mapping_source, e.mapping_ms, e.derived_ms,
                               e.mapping_ms > 0 ? e.derived_ms / e.mapping_ms
                                                : 0.0));
    absl::StrAppend(&md, "\n");
  }
  absl::StrAppend(&md, R"(### Leave-one-GPU-out

Each fitted type in turn is treated as unmeasured: its parameters come
from the other four by the rule, and its rows are predicted. Old rule: the
type `MapUnmeasuredGpu` copies (where that is the held-out type itself, its
bandwidth rule without the name rules; where that is held out too, the
defaults, as the old code did for a target without measurements). Best
copy: the single other type whose parameters predict the rows best, chosen
in hindsight, i.e. the best any copy-a-neighbour rule could do. |error| of
fwd+bwd per row, percent.

| GPU | rows | old rule copies | old median | old mean | new median | new mean | best copy | best-copy median | best-copy mean |
|---|---|---|---|---|---|---|---|---|---|
)");
  auto logo_row = [&](const LogoResult& l, absl::string_view name,
                      absl::string_view old_src, absl::string_view best_src) {
    absl::StrAppend(&md, "| ", name, " | ", l.rows, " | ", old_src, " | ",
                    Pct(l.old_median), " | ", Pct(l.old_mean), " | ",
                    Pct(l.new_median), " | ", Pct(l.new_mean), " | ",
                    best_src, " | ", Pct(l.best_median), " | ",
                    Pct(l.best_mean), " |\n");
  };
  for (const LogoResult& l : r.logo)
    logo_row(l, l.gpu_id, l.old_source, l.best_source);
  if (!r.logo.empty()) logo_row(r.logo_all, "**all**", "", "");
  absl::StrAppend(&md,
                  "\nParameters the rule gives each held-out type:\n\n"
                  "| GPU | gemm_eff_max | gemm_half_gflop | "
                  "fp32_gemm_eff_max | attn_eff_rel | mem_eff | bwd_eff_rel "
                  "| layer_overhead_us |\n|---|---|---|---|---|---|---|---|\n");
  for (const LogoResult& l : r.logo)
    absl::StrAppend(&md, "| ", l.gpu_id, " | ", ParamCells(l.new_params),
                    " |\n");
  absl::StrAppend(&md, R"(
### Catalog types without measurements

Written to calibration.json (`derived`). An entry in its `mapping`
(unfitted id → fitted id; `Calibrate`'s overrides) copies a fitted type
instead and wins over the derived parameters.

| GPU | matmul TFLOPS | FP32 matmul | TDP W | basis | matmul fraction | gemm_eff_max | fp32_gemm_eff_max | gemm_half_gflop | old rule copied | its gemm_eff_max |
|---|---|---|---|---|---|---|---|---|---|---|
)");
  for (const DerivedGpu& d : r.derived) {
    double old_eff = r.defaults.gemm_eff_max;
    for (const GpuFit& g : r.gpus)
      if (g.gpu_id == d.old_source) old_eff = g.params.gemm_eff_max;
    auto fig = [](double v) {
      return v > 0 ? absl::StrFormat("%g", v) : std::string("–");
    };
    absl::StrAppend(
        &md, absl::StrFormat(
                 "| %s | %s | %s | %s | %s | %.4f | %.4f | %.4f | %.4f | %s | "
                 "%.4f |\n",
                 d.gpu_id, fig(d.throughput.matmul_tflops),
                 fig(d.throughput.matmul_fp32_tflops), fig(d.throughput.tdp_w),
                 d.basis, d.matmul_fraction, d.params.gemm_eff_max,
                 d.params.fp32_gemm_eff_max, d.params.gemm_half_gflop,
                 d.old_source, old_eff));
  }
  if (!r.mapping.empty()) {
    absl::StrAppend(&md,
                    "\nExplicit overrides:\n\n| GPU | takes parameters of "
                    "|\n|---|---|\n");
    for (const auto& [id, target] : r.mapping)
      absl::StrAppend(&md, "| ", id, " | ", target, " |\n");
  }
  if (!r.notes.empty()) {
    absl::StrAppend(&md, "\nNotes:\n\n");
    for (const std::string& n : r.notes) absl::StrAppend(&md, "- ", n, "\n");
  }
  absl::StrAppend(&md, R"(
## Profile entry semantics and activation memory

A ProfileEntry is one layer on one GPU of a TP group for one micro-batch
(mbs sequences of seq tokens), 16-bit, no recomputation; T = mbs·seq,
h = hidden, q = heads·head_dim, k = v = kv_heads·head_dim, f = ffn,
a = heads, t = tp (ETP for moe_experts), V' = vocab padded to a multiple
of t.

- **tp_comm_ms**: ring all-gather / reduce-scatter of T·h·2 bytes,
  `base + (t−1)·(step + S/(t·B·comm_bw_eff))`, B = intra_node_gbps; 0 at t = 1.
  dense: 8 (2 AG + 2 RS forward, the same backward); moe_attention: 4, or 8
  with shared experts; moe_experts: 4 of T·top_k·h·2 bytes (ETP AG/RS);
  embedding: 2; lm_head: 2, plus 6 small all-reduces of the loss.
- **activation_bytes** (Korthikanti et al. 2022 with TP + sequence parallel
  and flash attention, generalised), per GPU = T/t × per-token bytes:
  - attention + both norms: 2·2h (norm inputs) + 2h (QKV input) +
    2(q + k + v) (Q, K, V) + 2q (output-projection input) + 4a (flash
    softmax statistics, fp32) [+ h dropout mask for GeLU/GPT-style models;
    + 2·(q_lora + kv_lora + rope) latents for MLA];
  - dense MLP: 2h (input) + SwiGLU 6f (gate, up, product) or GeLU
    4f + h (GeLU input, down input, dropout mask).
  For a standard GPT block (q = k = v = h, f = 4h, GeLU) this is
  34h + 4a, Korthikanti's 34·s·b·h/t plus the softmax statistics; for
  LLaMA-3-8B it is 34h + 4a as well (139,392 B/token).
  - moe_attention: attention part + 2h (router / shared-expert input) + 8E
    (fp32 router logits and probabilities) + 6·shared·f_shared.
  - moe_experts: per token-expert pair (T·top_k, not divided by ETP):
    2h (permuted input) + 2h (expert output kept for the combine) + 4
    (routing weight) + 6·f_expert/ETP.
  - embedding: 8 B per token (int64 ids).
  - lm_head: T·(2·2h/t) (norm and projection inputs) + T·V'/t·(4 + 2)
    (fp32 logits and their 16-bit copy).
- **param_count**: dense DenseLayerParams/t; moe_attention
  (AttentionParams + RouterAndSharedParams)/t; moe_experts
  num_experts·ExpertParams/ETP; embedding V'·h/t; lm_head LmHeadParams/t
  (rounded up).
)");
  return md;
}

}  // namespace arachne
