#include "planner_service/core/model/framework.h"

#include <cmath>
#include <functional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace arachne {
namespace {

// 2 buckets (DeepSpeed's reduce_bucket_size and allgather_bucket_size, 5e8
// elements each by default) of 16-bit elements.
constexpr double kDeepSpeedBucketsGib = 2 * 5e8 * 2 / (1024.0 * 1024 * 1024);

absl::Status BadValue(absl::string_view name, absl::string_view value,
                      absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "framework.", name, ": must be ", want, ", got \"", value, "\""));
}

// One overridable field: how to read it from text and write it back.
struct Field {
  std::string name;
  std::function<absl::Status(FrameworkConfig&, absl::string_view)> set;
  std::function<std::string(const FrameworkConfig&)> get;
};

// `v / scale` (a value in the unit it is written in) in the shortest of
// %.15g / %.17g that reads back, times `scale`, as `v`: "2.5" stays "2.5"
// and every value round-trips exactly.
std::string FormatNumber(double v, double scale = 1.0) {
  std::string s = absl::StrFormat("%.15g", v / scale);
  double back;
  if (absl::SimpleAtod(s, &back) && back * scale == v) return s;
  return absl::StrFormat("%.17g", v / scale);
}

Field BoolField(std::string name, bool FrameworkConfig::*member) {
  return {name,
          [name, member](FrameworkConfig& f, absl::string_view v) {
            const std::string s = absl::AsciiStrToLower(v);
            if (s == "true") {
              f.*member = true;
            } else if (s == "false") {
              f.*member = false;
            } else {
              return BadValue(name, v, "true or false");
            }
            return absl::OkStatus();
          },
          [member](const FrameworkConfig& f) {
            return std::string(f.*member ? "true" : "false");
          }};
}

// A number >= lo (and <= hi), stored as value * scale (ms -> s).
Field NumberField(std::string name, double FrameworkConfig::*member,
                  double lo, double hi, double scale = 1.0) {
  return {name,
          [name, member, lo, hi, scale](FrameworkConfig& f,
                                        absl::string_view v) {
            double x;
            if (!absl::SimpleAtod(v, &x) || !std::isfinite(x) || x < lo ||
                x > hi) {
              return BadValue(name, v,
                              absl::StrCat("a number in [", FormatNumber(lo),
                                           ", ", FormatNumber(hi), "]"));
            }
            f.*member = x * scale;
            return absl::OkStatus();
          },
          [member, scale](const FrameworkConfig& f) {
            return FormatNumber(f.*member, scale);
          }};
}

const std::vector<Field>& Fields() {
  static const std::vector<Field>* fields = [] {
    auto* v = new std::vector<Field>;
    v->push_back(
        {"attention",
         [](FrameworkConfig& f, absl::string_view s) {
           if (s == "flash") {
             f.attention = AttentionKernel::kFlash;
           } else if (s == "flash2") {
             f.attention = AttentionKernel::kFlash2;
           } else if (s == "materialized") {
             f.attention = AttentionKernel::kMaterialized;
           } else {
             return BadValue("attention", s, "flash, flash2 or materialized");
           }
           return absl::OkStatus();
         },
         [](const FrameworkConfig& f) {
           return std::string(AttentionKernelName(f.attention));
         }});
    v->push_back(BoolField("attention_dropout",
                           &FrameworkConfig::attention_dropout));
    v->push_back(BoolField("sequence_parallel",
                           &FrameworkConfig::sequence_parallel));
    v->push_back(NumberField("weight_bytes_per_param",
                             &FrameworkConfig::weight_bytes_per_param, 1, 8));
    v->push_back(NumberField("grad_bytes_per_param",
                             &FrameworkConfig::grad_bytes_per_param, 0, 8));
    v->push_back(NumberField("optimizer_bytes_per_param",
                             &FrameworkConfig::optimizer_bytes_per_param, 0,
                             32));
    v->push_back(NumberField("optimizer_grad_bytes_per_param",
                             &FrameworkConfig::optimizer_grad_bytes_per_param,
                             0, 8));
    v->push_back(NumberField("grad_reduce_bytes_per_param",
                             &FrameworkConfig::grad_reduce_bytes_per_param, 1,
                             8));
    v->push_back(
        {"sharding",
         [](FrameworkConfig& f, absl::string_view s) {
           for (StateSharding x :
                {StateSharding::kNone, StateSharding::kOptimizer,
                 StateSharding::kGradients, StateSharding::kParameters}) {
             if (s == StateShardingName(x)) {
               f.sharding = x;
               return absl::OkStatus();
             }
           }
           return BadValue("sharding", s,
                           "none, optimizer, gradients or parameters");
         },
         [](const FrameworkConfig& f) {
           return std::string(StateShardingName(f.sharding));
         }});
    v->push_back(BoolField("overlap_grad_reduce",
                           &FrameworkConfig::overlap_grad_reduce));
    v->push_back(BoolField("pipeline_scatter_gather",
                           &FrameworkConfig::pipeline_scatter_gather));
    v->push_back(NumberField("tp_comm_exposed_fraction",
                             &FrameworkConfig::tp_comm_exposed_fraction, 0,
                             1));
    v->push_back(NumberField("micro_batch_fixed_ms",
                             &FrameworkConfig::micro_batch_fixed_s, 0, 1e4,
                             1e-3));
    v->push_back(NumberField("iteration_fixed_ms",
                             &FrameworkConfig::iteration_fixed_s, 0, 1e6,
                             1e-3));
    v->push_back(NumberField("optimizer_step_bytes_per_param",
                             &FrameworkConfig::optimizer_step_bytes_per_param,
                             0, 128));
    v->push_back(NumberField("context_reserve_gib",
                             &FrameworkConfig::context_reserve_gib, 0, 64));
    v->push_back(NumberField("comm_buffer_gib",
                             &FrameworkConfig::comm_buffer_gib, 0, 64));
    v->push_back(NumberField("fragmentation", &FrameworkConfig::fragmentation,
                             0, 1));
    return v;
  }();
  return *fields;
}

const Field* FindField(absl::string_view name) {
  for (const Field& f : Fields())
    if (f.name == name) return &f;
  return nullptr;
}

absl::Status UnknownField(absl::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat(
      "framework: unknown field \"", name, "\" (fields: ",
      absl::StrJoin(FrameworkFieldNames(), ", "), ")"));
}

}  // namespace

absl::string_view FrameworkPresetName(FrameworkPreset p) {
  switch (p) {
    case FrameworkPreset::kMegatronCore:
      return "megatron-core";
    case FrameworkPreset::kMegatronDeepSpeed:
      return "megatron-deepspeed";
    case FrameworkPreset::kDeepSpeedZero1:
      return "deepspeed-zero1";
    case FrameworkPreset::kFsdp:
      return "fsdp";
    case FrameworkPreset::kArachneReference:
      return "arachne-reference";
  }
  return "megatron-core";
}

absl::StatusOr<FrameworkPreset> ParseFrameworkPreset(absl::string_view name) {
  std::vector<std::string> names;
  for (FrameworkPreset p : kAllFrameworkPresets) {
    if (name == FrameworkPresetName(p)) return p;
    names.emplace_back(FrameworkPresetName(p));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("framework: must be one of ", absl::StrJoin(names, ", "),
                   ", got \"", name, "\""));
}

absl::string_view AttentionKernelName(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kFlash:
      return "flash";
    case AttentionKernel::kFlash2:
      return "flash2";
    case AttentionKernel::kMaterialized:
      return "materialized";
  }
  return "flash";
}

absl::string_view StateShardingName(StateSharding s) {
  switch (s) {
    case StateSharding::kNone:
      return "none";
    case StateSharding::kOptimizer:
      return "optimizer";
    case StateSharding::kGradients:
      return "gradients";
    case StateSharding::kParameters:
      return "parameters";
  }
  return "none";
}

FrameworkConfig FrameworkPresetConfig(FrameworkPreset preset) {
  FrameworkConfig f;  // megatron-core
  f.preset = preset;
  switch (preset) {
    case FrameworkPreset::kMegatronCore:
      break;
    case FrameworkPreset::kMegatronDeepSpeed:
      // DeepSpeed's ZeRO-1 state and buckets under Megatron's 2021 model
      // code: scores materialized, with attention dropout.
      f = FrameworkPresetConfig(FrameworkPreset::kDeepSpeedZero1);
      f.preset = preset;
      f.attention = AttentionKernel::kMaterialized;
      f.attention_dropout = true;
      break;
    case FrameworkPreset::kDeepSpeedZero1:
      // PyTorch SDPA's flash backend or flash-attn 2 (FlashAttention-2).
      f.attention = AttentionKernel::kFlash2;
      f.sequence_parallel = false;
      f.optimizer_grad_bytes_per_param = 4;
      f.sharding = StateSharding::kOptimizer;
      f.comm_buffer_gib = kDeepSpeedBucketsGib;
      break;
    case FrameworkPreset::kFsdp:
      // PyTorch SDPA's flash backend (FlashAttention-2), as torchtitan and
      // llm-foundry run it.
      f.attention = AttentionKernel::kFlash2;
      f.sequence_parallel = false;
      f.weight_bytes_per_param = 4;  // fp32 sharded parameters (the master)
      f.optimizer_bytes_per_param = 8;  // Adam m and v
      f.grad_bytes_per_param = 4;
      f.sharding = StateSharding::kParameters;
      f.overlap_grad_reduce = true;
      break;
    case FrameworkPreset::kArachneReference:
      f.attention = AttentionKernel::kMaterialized;
      f.sequence_parallel = false;
      f.grad_bytes_per_param = 4;  // fp32 gradients, all-reduced in fp32
      f.grad_reduce_bytes_per_param = 4;
      f.context_reserve_gib = 0.25;
      break;
  }
  return f;
}

absl::Status FrameworkConfig::Validate() const {
  for (const Field& field : Fields()) {
    FrameworkConfig copy = *this;
    // Re-reading each field's own text form checks its range.
    if (absl::Status s = field.set(copy, field.get(*this)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

const std::vector<std::string>& FrameworkFieldNames() {
  static const std::vector<std::string>* names = [] {
    auto* v = new std::vector<std::string>;
    for (const Field& f : Fields()) v->push_back(f.name);
    return v;
  }();
  return *names;
}

absl::Status SetFrameworkField(FrameworkConfig& framework,
                               absl::string_view name,
                               absl::string_view value) {
  const Field* f = FindField(name);
  if (f == nullptr) return UnknownField(name);
  FrameworkConfig copy = framework;
  if (absl::Status s = f->set(copy, value); !s.ok()) return s;
  framework = copy;
  return absl::OkStatus();
}

absl::StatusOr<std::string> FrameworkFieldValue(
    const FrameworkConfig& framework, absl::string_view name) {
  const Field* f = FindField(name);
  if (f == nullptr) return UnknownField(name);
  return f->get(framework);
}

std::vector<std::pair<std::string, std::string>> FrameworkOverrides(
    const FrameworkConfig& framework) {
  const FrameworkConfig preset = FrameworkPresetConfig(framework.preset);
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : Fields()) {
    std::string mine = f.get(framework);
    if (mine != f.get(preset)) out.emplace_back(f.name, std::move(mine));
  }
  return out;
}

}  // namespace arachne
