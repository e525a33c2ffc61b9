// The reference engine. Only this file (and job_store.cc) of the agent
// includes LibTorch.
#ifndef USE_C10D_GLOO  // Torch's own compile flags may define it already.
#define USE_C10D_GLOO
#endif
#include "worker_agent/engine/reference_engine.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <numbers>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "worker_agent/engine/compute_pacer.h"
#include "worker_agent/engine/synthetic_corpus.h"
#include "worker_agent/job_store.h"

namespace arachne::agent {
namespace {

using migration::ByteRange;
using migration::Holding;
using migration::StateKind;
using migration::TensorSpec;
using migration::TpSplit;
using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

constexpr double kInitStd = 0.02;
constexpr double kNormEps = 1e-5;
constexpr double kRopeTheta = 10000.0;

// ---------------------------------------------------------------------------
// Collectives with autograd (Megatron's f, g and the vocabulary gather).

void AllReduce(c10d::ProcessGroup* group, torch::Tensor& t) {
  std::vector<at::Tensor> v{t};
  group->allreduce(v)->wait();
}

c10d::ProcessGroup* GroupOf(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<c10d::ProcessGroup*>(ctx->saved_data["g"].toInt());
}

// Identity forward, all-reduce of the gradient backward: the input of a
// column-parallel linear, replicated over the TP group.
struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor x, int64_t group) {
    ctx->saved_data["g"] = group;
    return x.clone();
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad) {
    torch::Tensor g = grad[0].contiguous().clone();
    AllReduce(GroupOf(ctx), g);
    return {g, torch::Tensor()};
  }
};

// All-reduce forward, identity backward: the partial outputs of a
// row-parallel linear (and of the vocabulary-parallel embedding).
struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor x, int64_t group) {
    torch::Tensor y = x.contiguous().clone();
    AllReduce(reinterpret_cast<c10d::ProcessGroup*>(group), y);
    return y;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad) {
    return {grad[0], torch::Tensor()};
  }
};

// All-gather along the last dimension forward (the vocabulary-parallel
// logits), this rank's slice of the gradient backward: every TP rank
// computes the same loss from the same gathered logits.
struct GatherFromTp : public torch::autograd::Function<GatherFromTp> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor x, int64_t group, int64_t rank,
                               int64_t size) {
    ctx->saved_data["rank"] = rank;
    ctx->saved_data["local"] = x.size(-1);
    torch::Tensor in = x.contiguous();
    std::vector<std::vector<at::Tensor>> out(1);
    for (int64_t i = 0; i < size; ++i) out[0].push_back(torch::empty_like(in));
    std::vector<at::Tensor> inputs{in};
    reinterpret_cast<c10d::ProcessGroup*>(group)
        ->allgather(out, inputs)
        ->wait();
    return torch::cat(out[0], -1);
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad) {
    const int64_t rank = ctx->saved_data["rank"].toInt();
    const int64_t local = ctx->saved_data["local"].toInt();
    return {grad[0].narrow(-1, rank * local, local).contiguous(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The expert group of a MoE stage: every GPU of the stage over all replicas
// of its template, g = replica * tp + tp_rank (ETP innermost, then EP, then
// EDP: plan.h). Tokens are replicated over a replica's TP ranks, so a
// gather keeps TP rank 0's copy of each replica.
struct ExpertGroupInfo {
  int64_t group = 0;  // c10d::ProcessGroup*
  int64_t tp = 1;
  int64_t replicas = 1;
  int64_t replica = 0;  // this rank's
};

std::vector<at::Tensor> GatherReplicas(const ExpertGroupInfo& info,
                                       const torch::Tensor& x) {
  torch::Tensor in = x.contiguous();
  std::vector<std::vector<at::Tensor>> out(1);
  for (int64_t i = 0; i < info.tp * info.replicas; ++i) {
    out[0].push_back(torch::empty_like(in));
  }
  std::vector<at::Tensor> inputs{in};
  reinterpret_cast<c10d::ProcessGroup*>(info.group)->allgather(out, inputs)->wait();
  std::vector<at::Tensor> per_replica;
  for (int64_t r = 0; r < info.replicas; ++r) per_replica.push_back(out[0][r * info.tp]);
  return per_replica;
}

ExpertGroupInfo InfoOf(torch::autograd::AutogradContext* ctx) {
  return {ctx->saved_data["g"].toInt(), ctx->saved_data["tp"].toInt(),
          ctx->saved_data["R"].toInt(), ctx->saved_data["r"].toInt()};
}
void Save(torch::autograd::AutogradContext* ctx, const ExpertGroupInfo& i) {
  ctx->saved_data["g"] = i.group;
  ctx->saved_data["tp"] = i.tp;
  ctx->saved_data["R"] = i.replicas;
  ctx->saved_data["r"] = i.replica;
}

// Dispatch: every replica's tokens [n, d] to every rank of the expert group
// ([replicas * n, d]); backward sums each rank's gradient of them and hands
// a replica its own rows (complete, the same on its TP ranks).
struct GatherTokens : public torch::autograd::Function<GatherTokens> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor x, int64_t group, int64_t tp,
                               int64_t replicas, int64_t replica) {
    const ExpertGroupInfo info{group, tp, replicas, replica};
    Save(ctx, info);
    return torch::cat(GatherReplicas(info, x), 0);
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad) {
    const ExpertGroupInfo info = InfoOf(ctx);
    torch::Tensor g = grad[0].contiguous().clone();
    AllReduce(reinterpret_cast<c10d::ProcessGroup*>(info.group), g);
    const int64_t n = g.size(0) / info.replicas;
    return {g.narrow(0, info.replica * n, n).contiguous(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Combine: the sum over the group of every rank's expert outputs, this
// replica's rows; backward gathers every replica's output gradient.
struct CombineTokens : public torch::autograd::Function<CombineTokens> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor y, int64_t group, int64_t tp,
                               int64_t replicas, int64_t replica) {
    const ExpertGroupInfo info{group, tp, replicas, replica};
    Save(ctx, info);
    torch::Tensor sum = y.contiguous().clone();
    AllReduce(reinterpret_cast<c10d::ProcessGroup*>(group), sum);
    const int64_t n = sum.size(0) / replicas;
    return sum.narrow(0, replica * n, n).contiguous();
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad) {
    return {torch::cat(GatherReplicas(InfoOf(ctx), grad[0]), 0),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// ---------------------------------------------------------------------------
// Parameters in canonical and engine layout.

uint64_t NameHash(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Element `j` (canonical order) of the initial value of parameter `name`:
// a normal draw from (seed, name, j), so every plan starts from the same
// weights whatever shard a rank holds.
float InitialValue(uint64_t seed, uint64_t name_hash, int64_t j, double std) {
  const uint64_t a = SplitMix64(seed ^ name_hash ^ (static_cast<uint64_t>(j) * 2));
  const uint64_t b = SplitMix64(a + 0x632be59bd9b4e019ULL);
  const double u1 = ((a >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  const double u2 = (b >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) *
                            std::cos(2.0 * std::numbers::pi * u2));
}

struct Param {
  std::string name;  // without the ":kind" suffix
  TpSplit split = TpSplit::kReplicated;
  int ids[4] = {-1, -1, -1, -1};  // tensor ids: weight, master, adam_m, adam_v
  ByteRange master_range;         // canonical bytes of the master shard
  // The elements of the shard (canonical order, from its first) this rank
  // counts in the gradient's global norm: [begin, end) pairs, those no lower
  // plan rank holds (OwnedElements).
  std::vector<std::pair<int64_t, int64_t>> owned;
  std::vector<int64_t> canonical_shape;  // of this shard, canonical order
  // The state, each tensor in canonical order (a row-parallel weight
  // transposed, so the shard is one contiguous range of canonical bytes):
  // the engine's memory is the canonical layout, and a switch moves it
  // where it lives (Engine::StateView). Compute reads SwapLayout(master).
  torch::Tensor master;  // requires_grad; its gradient is canonical too
  torch::Tensor weight;  // bf16 rounding of master, updated in place
  torch::Tensor adam_m, adam_v;
};

// The elements of `range` (canonical bytes of fp32 tensor `tensor` that
// plan rank `me` holds) that no lower plan rank holds, as [begin, end)
// element offsets from the range's first: every canonical element of the
// model belongs to exactly one rank, so the ranks' sums of squared
// gradients over what they own add up to the whole model's, counted once,
// under every plan (TP-replicated tensors on TP rank 0 or its first holder,
// DP replicas and EDP copies once). python/arachne_torch/trainer.py owns
// by the same rule.
std::vector<std::pair<int64_t, int64_t>> OwnedElements(
    const migration::PlanLayout& layout, int me, int tensor, ByteRange range) {
  std::vector<ByteRange> lower;
  for (int g = 0; g < me; ++g) {
    for (const Holding& h : layout.holdings(g)) {
      if (h.tensor != tensor) continue;
      const ByteRange r = migration::Intersect(h.range, range);
      if (!r.empty()) lower.push_back(r);
    }
  }
  std::sort(lower.begin(), lower.end(),
            [](const ByteRange& a, const ByteRange& b) {
              return a.begin < b.begin;
            });
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = range.begin;
  for (const ByteRange& r : lower) {
    if (r.begin > at) out.push_back({at, r.begin});
    at = std::max(at, r.end);
  }
  if (at < range.end) out.push_back({at, range.end});
  for (auto& [b, e] : out) {
    b = (b - range.begin) / 4;
    e = (e - range.begin) / 4;
  }
  return out;
}

// Canonical -> the [out, in] shape compute uses: row-parallel weights are
// stored transposed. A view (autograd flows through it to the canonical
// master).
torch::Tensor SwapLayout(const Param& p, const torch::Tensor& t) {
  return p.split == TpSplit::kRow ? t.t() : t;
}

// The canonical bytes of kind `kind` of `p` this rank holds: the master
// shard's element range at that kind's width.
ByteRange KindRange(const Param& p, const TensorSpec& ts) {
  if (p.split == TpSplit::kReplicated) return {0, ts.bytes()};
  const int bpe = migration::BytesPerElement(ts.kind);
  return {p.master_range.begin / 4 * bpe, p.master_range.end / 4 * bpe};
}

int KindIndex(StateKind k) {
  switch (k) {
    case StateKind::kWeight:
      return 0;
    case StateKind::kMasterWeight:
      return 1;
    case StateKind::kAdamM:
      return 2;
    case StateKind::kAdamV:
      return 3;
    case StateKind::kScalars:
      break;
  }
  return -1;
}

// One group of parameters reduced together: every rank (of any template)
// whose stage holds them. The buffer holds each parameter whole, in
// canonical order; each replica adds its shards (replicated tensors from
// TP rank 0 only) and the sum over the group is the sum over replicas.
struct GradGroup {
  std::vector<int> members;  // plan ranks, sorted
  std::vector<int> params;   // indices into Engine::params_ held here
  std::vector<int64_t> offsets;  // element offset of each param's tensor
  int64_t elements = 0;
  Group group;  // null when this rank is the only member
};

std::string StatusText(const std::exception& e) {
  std::string w = e.what();
  // c10::Error appends a C++ backtrace; the first line says what failed.
  const size_t nl = w.find('\n');
  return nl == std::string::npos ? w : w.substr(0, nl);
}

class ReferenceEngine : public Engine {
 public:
  ReferenceEngine(const EngineArgs& args)
      : job_(args.job),
        plan_(args.plan),
        state_(*args.state),
        layout_(*args.layout),
        me_(args.plan_rank),
        role_(args.layout->role(args.plan_rank)),
        corpus_(args.job.engine.data_seed, args.job.model.vocab,
                args.job.training.seq_len),
        pacer_(args.virtual_gpu_speed) {}

  absl::Status Build(const EngineArgs& args, EngineBuildTiming* timing);

  absl::StatusOr<IterationResult> RunIteration(
      const IterationControl& control) override;
  int64_t iteration() const override { return scalars_[kScalarStep]; }
  const std::vector<Holding>& holdings() const override {
    return layout_.holdings(me_);
  }
  absl::Status SaveState(migration::ShardSet* out) const override;
  absl::Status LoadState(const migration::ShardSet& in) override;
  migration::ShardSet StateView() override;
  absl::Status StateWritten() override;
  migration::MemoryKind state_memory() const override {
    return migration::MemoryKind::kHost;
  }
  int64_t StateBytes() const override { return layout_.BytesOn(me_); }

 private:
  const migration::GpuRole& role() const { return role_; }
  const Template& tmpl() const { return plan_.templates[role_.template_index]; }
  const Stage& stage() const { return tmpl().stages[role_.stage]; }
  bool first_stage() const { return role_.stage == 0; }
  bool last_stage() const { return role_.stage == tmpl().depth() - 1; }
  int PlanRankOf(int t, int r, int s, int k) const {
    return rank_of_.at({t, r, s, k});
  }
  Param& P(const std::string& name) { return params_[param_index_.at(name)]; }
  // A parameter as compute uses it ([out, in] for a linear): a view.
  torch::Tensor W(const std::string& name) {
    const Param& p = P(name);
    return SwapLayout(p, p.master);
  }

  absl::Status CreateGroups(const EngineArgs& args);
  // param_index_ in the order CreateParams creates the parameters, so the
  // groups can be built (they need it) before the tensors are allocated.
  void IndexParams();
  void CreateParams(bool initialize, ReferenceEngine* share_with);
  // FailedPrecondition when scalars `sc` do not belong to this job.
  absl::Status CheckScalars(const std::vector<int64_t>& sc) const;
  // The tensors of `p` in the order of Param::ids.
  static std::array<torch::Tensor, 4> Parts(const Param& p) {
    return {p.weight, p.master.detach(), p.adam_m, p.adam_v};
  }
  torch::Tensor Linear(const torch::Tensor& x, const std::string& name) {
    return torch::matmul(x, W(name).t());
  }
  torch::Tensor RmsNorm(const torch::Tensor& x, const std::string& name) {
    torch::Tensor r = torch::rsqrt(x.pow(2).mean(-1, true) + kNormEps);
    return x * r * W(name);
  }
  torch::Tensor ToTp(const torch::Tensor& x) {
    return tp_ ? CopyToTp::apply(x, Ptr(tp_)) : x;
  }
  torch::Tensor FromTp(const torch::Tensor& x) {
    return tp_ ? ReduceFromTp::apply(x, Ptr(tp_)) : x;
  }
  static int64_t Ptr(const Group& g) {
    return reinterpret_cast<int64_t>(g.get());
  }
  torch::Tensor Embed(const torch::Tensor& tokens);
  torch::Tensor Block(int layer, torch::Tensor h);
  torch::Tensor SwiGlu(const torch::Tensor& x, const std::string& prefix) {
    return Linear(torch::silu(Linear(x, prefix + "gate.weight")) *
                      Linear(x, prefix + "up.weight"),
                  prefix + "down.weight");
  }
  torch::Tensor MoeMlp(int layer, const torch::Tensor& x);
  torch::Tensor HeadLoss(const torch::Tensor& h, const torch::Tensor& targets);
  torch::Tensor Tokens(int64_t first_sample, bool targets);
  void SyncGradients();
  // This rank's share of the squared global gradient norm: the sum of
  // squares of the synced gradient elements it owns (Param::owned).
  double OwnedGradientSquares();
  // One AdamW step on the gradients scaled by `grad_scale` (clipping).
  void OptimizerStep(double grad_scale);

  JobSpec job_;
  Plan plan_;
  const migration::ModelState& state_;
  const migration::PlanLayout& layout_;
  int me_;
  migration::GpuRole role_;
  SyntheticCorpus corpus_;
  ComputePacer pacer_;
  std::map<std::tuple<int, int, int, int>, int> rank_of_;

  Group world_, tp_;  // tp_ null when TP is 1
  Group experts_;     // the stage's expert group; null when it has one GPU
  std::vector<GradGroup> grad_groups_;
  std::vector<Param> params_;
  absl::flat_hash_map<std::string, int> param_index_;
  int scalars_id_ = -1;
  std::vector<int64_t> scalars_ = std::vector<int64_t>(kReferenceScalars, 0);
  torch::Tensor rope_cos_, rope_sin_;
  int heads_local_ = 0, kv_heads_local_ = 0;
};

absl::Status ReferenceEngine::CreateGroups(const EngineArgs& args) {
  // The groups of the plan in one global order; a rank creates those it is
  // in, in that order, so the rendezvous of two groups never wait on each
  // other.
  struct GroupSpec {
    std::string name;
    std::vector<int> members;
  };
  std::vector<GroupSpec> specs;
  std::vector<int> all(layout_.num_gpus());
  for (int g = 0; g < layout_.num_gpus(); ++g) all[g] = g;
  specs.push_back({"world", all});
  for (int ti = 0; ti < static_cast<int>(plan_.templates.size()); ++ti) {
    const Template& t = plan_.templates[ti];
    for (int r = 0; r < t.replicas; ++r) {
      for (int s = 0; s < t.depth(); ++s) {
        if (t.stages[s].tp == 1) continue;
        std::vector<int> m;
        for (int k = 0; k < t.stages[s].tp; ++k) {
          m.push_back(PlanRankOf(ti, r, s, k));
        }
        specs.push_back({absl::StrCat("tp/", ti, "/", r, "/", s), m});
      }
    }
    for (int s = 0; s < t.depth(); ++s) {
      const Stage& st = t.stages[s];
      if (job_.model.MoeLayersIn(st.layer_begin, st.layer_end) == 0 ||
          st.tp * t.replicas == 1) {
        continue;
      }
      std::vector<int> m;  // g = replica * tp + tp_rank
      for (int r = 0; r < t.replicas; ++r) {
        for (int k = 0; k < st.tp; ++k) m.push_back(PlanRankOf(ti, r, s, k));
      }
      specs.push_back({absl::StrCat("experts/", ti, "/", s), m});
    }
  }
  // Gradient groups: parameters by the set of ranks holding them.
  std::map<std::vector<int>, std::vector<int>> by_holders;  // -> tensor ids
  {
    std::map<int, std::vector<int>> holders;  // master tensor id -> ranks
    for (int g = 0; g < layout_.num_gpus(); ++g) {
      for (const Holding& h : layout_.holdings(g)) {
        if (state_.tensor(h.tensor).kind == StateKind::kMasterWeight) {
          holders[h.tensor].push_back(g);
        }
      }
    }
    for (auto& [id, ranks] : holders) by_holders[ranks].push_back(id);
  }
  int gi = 0;
  for (const auto& [members, ids] : by_holders) {
    const bool mine =
        std::binary_search(members.begin(), members.end(), me_);
    if (mine) {
      GradGroup gg;
      gg.members = members;
      for (int id : ids) {
        const std::string& n = state_.tensor(id).name;
        const std::string base = n.substr(0, n.rfind(':'));
        gg.params.push_back(param_index_.at(base));
        gg.offsets.push_back(gg.elements);
        gg.elements += state_.tensor(id).elements();
      }
      grad_groups_.push_back(std::move(gg));
    }
    if (members.size() > 1) {
      specs.push_back({absl::StrCat("dp/", gi), members});
    }
    ++gi;
  }

  std::string host;
  int port = 0;
  if (absl::Status s =
          ParseStoreAddress(args.store_address, "store_address", &host, &port);
      !s.ok()) {
    return s;
  }
  const auto timeout =
      std::chrono::milliseconds(absl::ToInt64Milliseconds(args.timeout));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = false;
    so.waitWorkers = false;
    // The rendezvous may wait for peers still building their engines; the
    // collectives' own timeout (`timeout`) can be shorter.
    so.timeout = std::max(timeout, std::chrono::milliseconds(60000));
    c10::intrusive_ptr<c10d::Store> base =
        c10::make_intrusive<c10d::PrefixStore>(
            GenerationPrefix(args.generation),
            c10::make_intrusive<c10d::TCPStore>(host, so));
    auto device =
        c10d::ProcessGroupGloo::createDeviceForHostname(args.listen_host);
    size_t next_grad = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const GroupSpec& spec = specs[i];
      const auto pos = std::find(spec.members.begin(), spec.members.end(), me_);
      if (pos == spec.members.end()) continue;
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(device);
      opts->threads = 1;
      Group g = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(spec.name, base),
          static_cast<int>(pos - spec.members.begin()),
          static_cast<int>(spec.members.size()), opts);
      if (spec.name == "world") {
        world_ = g;
      } else if (spec.name.rfind("tp/", 0) == 0) {
        tp_ = g;
      } else if (spec.name.rfind("experts/", 0) == 0) {
        experts_ = g;
      } else {
        while (next_grad < grad_groups_.size() &&
               grad_groups_[next_grad].members != spec.members) {
          ++next_grad;
        }
        CHECK_LT(next_grad, grad_groups_.size()) << spec.name;
        grad_groups_[next_grad].group = g;
      }
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("plan rank ", me_, ": building the process groups of "
                     "generation ", args.generation, " failed: ",
                     StatusText(e)));
  }
  return absl::OkStatus();
}

void ReferenceEngine::IndexParams() {
  for (const Holding& h : layout_.holdings(me_)) {
    const TensorSpec& ts = state_.tensor(h.tensor);
    if (ts.kind != StateKind::kMasterWeight) continue;
    const int next = static_cast<int>(param_index_.size());
    param_index_[ts.name.substr(0, ts.name.rfind(':'))] = next;
  }
}

void ReferenceEngine::CreateParams(bool initialize,
                                   ReferenceEngine* share_with) {
  absl::flat_hash_map<std::string, int> id_of;
  for (int id = 0; id < state_.num_tensors(); ++id) {
    id_of[state_.tensor(id).name] = id;
  }
  const int depth_layers = job_.model.num_layers;
  for (const Holding& h : layout_.holdings(me_)) {
    const TensorSpec& ts = state_.tensor(h.tensor);
    if (ts.kind == StateKind::kScalars) {
      scalars_id_ = h.tensor;
      continue;
    }
    if (ts.kind != StateKind::kMasterWeight) continue;
    Param p;
    p.name = ts.name.substr(0, ts.name.rfind(':'));
    p.split = ts.split;
    for (StateKind k : {StateKind::kWeight, StateKind::kMasterWeight,
                        StateKind::kAdamM, StateKind::kAdamV}) {
      p.ids[KindIndex(k)] = id_of.at(
          absl::StrCat(p.name, ":", migration::StateKindName(k)));
    }
    p.master_range = h.range;
    p.owned = OwnedElements(layout_, me_, h.tensor, h.range);
    // The canonical shape of the shard: split dimension outermost.
    std::vector<int64_t> cshape = ts.shape;
    if (ts.split == TpSplit::kRow) std::swap(cshape[0], cshape[1]);
    const int64_t row_elems = ts.elements() / cshape[0];
    cshape[0] = h.range.size() / 4 / row_elems;
    p.canonical_shape = cshape;
    if (share_with != nullptr) {
      auto it = share_with->param_index_.find(p.name);
      if (it != share_with->param_index_.end()) {
        const Param& o = share_with->params_[it->second];
        if (o.master_range == p.master_range) {
          // The same canonical bytes: share, do not hold them twice. A
          // leaf of its own over the same storage (its gradient is its own).
          p.master = o.master.detach().set_requires_grad(true);
          p.weight = o.weight;
          p.adam_m = o.adam_m;
          p.adam_v = o.adam_v;
          CHECK_EQ(param_index_.at(p.name), static_cast<int>(params_.size()));
          params_.push_back(std::move(p));
          continue;
        }
      }
    }
    torch::Tensor canon = torch::empty(cshape, torch::kFloat32);
    if (initialize) {
      float* d = canon.data_ptr<float>();
      const int64_t first = h.range.begin / 4;
      const bool norm = p.name.find("norm") != std::string::npos;
      const bool out_proj = p.name.find(".attn.o.") != std::string::npos ||
                            p.name.find(".mlp.down.") != std::string::npos;
      const double std =
          out_proj ? kInitStd / std::sqrt(2.0 * depth_layers) : kInitStd;
      const uint64_t nh = NameHash(p.name);
      for (int64_t j = 0; j < canon.numel(); ++j) {
        d[j] = norm ? 1.0f
                    : InitialValue(job_.engine.init_seed, nh, first + j, std);
      }
    } else {
      canon.zero_();
    }
    p.master = canon.set_requires_grad(true);
    p.weight = p.master.detach().to(torch::kBFloat16);
    p.adam_m = torch::zeros_like(p.master.detach());
    p.adam_v = torch::zeros_like(p.master.detach());
    CHECK_EQ(param_index_.at(p.name), static_cast<int>(params_.size()));
    params_.push_back(std::move(p));
  }
  CHECK_GE(scalars_id_, 0) << "the layout has no " << migration::kTrainStateTensor;
  scalars_[kScalarFormat] = kReferenceStateFormat;
  scalars_[kScalarStep] = 0;
  scalars_[kScalarCursor] = 0;
  scalars_[kScalarDataSeed] = static_cast<int64_t>(job_.engine.data_seed);
  scalars_[kScalarInitSeed] = static_cast<int64_t>(job_.engine.init_seed);
  scalars_[kScalarGlobalBatch] = job_.training.global_batch;
  scalars_[kScalarSeqLen] = job_.training.seq_len;
}

absl::Status ReferenceEngine::Build(const EngineArgs& args,
                                    EngineBuildTiming* timing) {
  for (int g = 0; g < layout_.num_gpus(); ++g) {
    const migration::GpuRole& r = layout_.role(g);
    rank_of_[{r.template_index, r.replica, r.stage, r.tp_rank}] = g;
  }
  // The process groups first, then the tensors: every rank of the plan
  // reaches the groups' rendezvous at once, instead of the ranks that share
  // their tensors with the current engine (nothing to allocate) waiting
  // there, under the collective timeout, for ranks still allocating and
  // zero-filling gigabytes of new state (4 GB per rank took longer than the
  // 10 s timeout on the 2-core machine).
  const absl::Time t0 = absl::Now();
  IndexParams();
  if (absl::Status s = CreateGroups(args); !s.ok()) return s;
  const absl::Time t1 = absl::Now();
  CreateParams(args.initialize,
               args.initialize ? nullptr
                               : dynamic_cast<ReferenceEngine*>(args.share_with));
  const int tp = stage().tp;
  heads_local_ = job_.model.num_heads / tp;
  kv_heads_local_ = job_.model.num_kv_heads / tp;
  const int hd = job_.model.head_dim;
  const int seq = job_.training.seq_len;
  torch::Tensor inv = torch::pow(
      kRopeTheta, -torch::arange(0, hd, 2, torch::kFloat64) / hd);
  torch::Tensor ang = torch::outer(torch::arange(seq, torch::kFloat64), inv);
  ang = torch::cat({ang, ang}, -1).to(torch::kFloat32);
  rope_cos_ = ang.cos();
  rope_sin_ = ang.sin();
  const absl::Time t2 = absl::Now();
  if (timing != nullptr) {
    timing->groups_seconds = absl::ToDoubleSeconds(t1 - t0);
    timing->build_seconds = absl::ToDoubleSeconds(t2 - t1);
  }
  return absl::OkStatus();
}

torch::Tensor ReferenceEngine::Tokens(int64_t first_sample, bool targets) {
  const int mbs = tmpl().micro_batch_size;
  const int seq = job_.training.seq_len;
  torch::Tensor out = torch::empty({mbs, seq}, torch::kInt64);
  std::vector<int64_t> buf(seq + 1);
  for (int b = 0; b < mbs; ++b) {
    corpus_.Sample(first_sample + b, buf.data());
    std::memcpy(out[b].data_ptr<int64_t>(), buf.data() + (targets ? 1 : 0),
                sizeof(int64_t) * seq);
  }
  return out;
}

torch::Tensor ReferenceEngine::Embed(const torch::Tensor& tokens) {
  Param& e = P("embedding.weight");
  const int64_t rows = e.master.size(0);
  const int64_t v0 = e.master_range.begin / 4 / job_.model.hidden;
  torch::Tensor local = tokens - v0;
  torch::Tensor mine = (local >= 0).logical_and(local < rows);
  torch::Tensor x = torch::embedding(e.master, local.clamp(0, rows - 1));
  x = x * mine.unsqueeze(-1).to(torch::kFloat32);
  return FromTp(x);
}

torch::Tensor ReferenceEngine::Block(int layer, torch::Tensor h) {
  const std::string p = absl::StrCat("layers.", layer, ".");
  const int64_t b = h.size(0), s = h.size(1);
  const int hd = job_.model.head_dim;
  {
    torch::Tensor x = ToTp(RmsNorm(h, p + "input_norm.weight"));
    auto heads = [&](torch::Tensor t, int n) {
      return t.view({b, s, n, hd}).transpose(1, 2);
    };
    auto rope = [&](const torch::Tensor& t) {
      torch::Tensor x1 = t.narrow(-1, 0, hd / 2);
      torch::Tensor x2 = t.narrow(-1, hd / 2, hd / 2);
      return t * rope_cos_ + torch::cat({-x2, x1}, -1) * rope_sin_;
    };
    torch::Tensor q = rope(heads(Linear(x, p + "attn.q.weight"), heads_local_));
    torch::Tensor k =
        rope(heads(Linear(x, p + "attn.k.weight"), kv_heads_local_));
    torch::Tensor v = heads(Linear(x, p + "attn.v.weight"), kv_heads_local_);
    const int group = heads_local_ / kv_heads_local_;
    if (group > 1) {
      k = k.repeat_interleave(group, 1);
      v = v.repeat_interleave(group, 1);
    }
    torch::Tensor scores =
        torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd));
    torch::Tensor mask =
        torch::ones({s, s}, torch::kBool).triu(1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
    torch::Tensor a = torch::matmul(torch::softmax(scores, -1), v);
    a = a.transpose(1, 2).reshape({b, s, heads_local_ * hd});
    h = h + FromTp(Linear(a, p + "attn.o.weight"));
  }
  torch::Tensor x = RmsNorm(h, p + "post_norm.weight");
  if (job_.model.IsMoeLayer(layer)) return h + MoeMlp(layer, x);
  return h + FromTp(SwiGlu(ToTp(x), p + "mlp."));
}

// A MoE block's MLP: the shared experts (TP-split like a dense MLP) plus the
// routed experts. Each replica routes its own tokens (top-k of the router's
// logits, softmax over the k); the tokens of every replica of the template
// are dispatched to the stage's expert group, where the rank holding expert
// e's ETP slice for EDP copy (replica % edp) computes it, and the outputs are
// summed back. Every (token, expert, ETP slice) is computed exactly once,
// so the result is the same under every tiling.
torch::Tensor ReferenceEngine::MoeMlp(int layer, const torch::Tensor& x) {
  const std::string p = absl::StrCat("layers.", layer, ".");
  const MoeSpec& moe = job_.model.moe;
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2), n = b * s;
  torch::Tensor out = torch::zeros_like(x);
  for (int e = 0; e < moe.shared_experts; ++e) {
    out = out + FromTp(SwiGlu(ToTp(x), absl::StrCat(p, "shared.", e, ".")));
  }
  torch::Tensor xs = x.reshape({n, h});
  torch::Tensor logits = Linear(xs, p + "router.weight");
  auto [top, idx] = logits.topk(moe.top_k, -1);
  torch::Tensor w = torch::softmax(top, -1);
  // One dispatch of tokens, weights and expert ids together: a single
  // collective per layer keeps every rank's backward in the same order.
  torch::Tensor packed =
      torch::cat({xs, w, idx.to(torch::kFloat32).detach()}, -1);
  const int replicas = tmpl().replicas;
  const ExpertTiling& tiling = stage().tiling;
  ExpertGroupInfo info{Ptr(experts_), stage().tp, replicas, role_.replica};
  torch::Tensor all = experts_ ? GatherTokens::apply(packed, info.group, info.tp,
                                                     info.replicas, info.replica)
                               : packed;
  torch::Tensor X = all.narrow(1, 0, h);
  torch::Tensor W = all.narrow(1, h, moe.top_k);
  torch::Tensor I = all.narrow(1, h + moe.top_k, moe.top_k).detach().to(torch::kInt64);
  const int g = role_.replica * stage().tp + role_.tp_rank;
  const int edp_rank = g / (tiling.ep * tiling.etp);
  // Zero terms tie y to X and W on every rank, so each rank's backward runs
  // the same collectives even when no token picked its experts.
  torch::Tensor y = X * 0.0 + W.sum() * 0.0;
  // The replica of a row. Floor division: `/` on integer tensors divides
  // exactly (0, 1/n, 2/n, ...), which left every token but each replica's
  // first out of the routed experts.
  torch::Tensor rows =
      torch::div(torch::arange(int64_t{replicas} * n), n, "floor");
  torch::Tensor mine = (rows.remainder(tiling.edp) == edp_rank).unsqueeze(1);
  for (int e = 0; e < moe.num_experts; ++e) {
    const std::string ep = absl::StrCat(p, "experts.", e, ".");
    if (!param_index_.contains(ep + "gate.weight")) continue;  // not held here
    torch::Tensor hit = ((I == e).logical_and(mine)).nonzero();
    if (hit.size(0) == 0) continue;
    torch::Tensor t = hit.select(1, 0), j = hit.select(1, 1);
    torch::Tensor we = W.index({t, j}).unsqueeze(1);
    y = y.index_add(0, t, SwiGlu(X.index_select(0, t), ep) * we);
  }
  torch::Tensor routed =
      experts_ ? CombineTokens::apply(y, info.group, info.tp, info.replicas,
                                      info.replica)
               : y;
  return out + routed.reshape({b, s, h});
}

torch::Tensor ReferenceEngine::HeadLoss(const torch::Tensor& h,
                                        const torch::Tensor& targets) {
  torch::Tensor x = ToTp(RmsNorm(h, "final_norm.weight"));
  torch::Tensor logits = Linear(x, "lm_head.weight");
  if (tp_) {
    logits = GatherFromTp::apply(logits, Ptr(tp_), role_.tp_rank, stage().tp);
  }
  const int64_t global_tokens =
      int64_t{job_.training.global_batch} * job_.training.seq_len;
  return torch::nn::functional::cross_entropy(
             logits.reshape({-1, logits.size(-1)}), targets.reshape(-1),
             torch::nn::functional::CrossEntropyFuncOptions().reduction(
                 torch::kSum)) /
         static_cast<double>(global_tokens);
}

void ReferenceEngine::SyncGradients() {
  for (GradGroup& gg : grad_groups_) {
    torch::Tensor buf = torch::zeros({gg.elements}, torch::kFloat32);
    for (size_t i = 0; i < gg.params.size(); ++i) {
      const Param& p = params_[gg.params[i]];
      if (p.split == TpSplit::kReplicated && role_.tp_rank != 0) continue;
      torch::Tensor g = p.master.grad();
      torch::Tensor c = g.defined() ? g : torch::zeros(p.canonical_shape);
      buf.narrow(0, gg.offsets[i] + p.master_range.begin / 4, c.numel())
          .copy_(c.reshape(-1));
    }
    if (gg.group) AllReduce(gg.group.get(), buf);
    for (size_t i = 0; i < gg.params.size(); ++i) {
      Param& p = params_[gg.params[i]];
      torch::Tensor c = buf.narrow(0, gg.offsets[i] + p.master_range.begin / 4,
                                   p.master_range.size() / 4)
                            .reshape(p.canonical_shape);
      p.master.mutable_grad() = c;
    }
  }
}

double ReferenceEngine::OwnedGradientSquares() {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (const Param& p : params_) {
    if (p.owned.empty()) continue;
    const torch::Tensor g = p.master.grad();
    if (p.owned.size() == 1 && p.owned[0].first == 0 &&
        p.owned[0].second == p.master_range.size() / 4) {
      sum += g.to(torch::kFloat64).square().sum().item<double>();
      continue;
    }
    const torch::Tensor c = g.reshape(-1).to(torch::kFloat64);
    for (const auto& [b, e] : p.owned) {
      sum += c.narrow(0, b, e - b).square().sum().item<double>();
    }
  }
  return sum;
}

void ReferenceEngine::OptimizerStep(double grad_scale) {
  torch::NoGradGuard no_grad;
  const EngineConfig& c = job_.engine;
  // The step counter is the migrated scalars' (kScalarStep), so a switched
  // run takes the same learning rates as an unswitched one.
  const int64_t t = scalars_[kScalarStep] + 1;
  const double lr = c.LearningRateAt(t);
  const double bc1 = 1.0 - std::pow(c.adam_beta1, double(t));
  const double bc2 = 1.0 - std::pow(c.adam_beta2, double(t));
  for (Param& p : params_) {
    torch::Tensor g = p.master.grad();
    if (grad_scale != 1.0) g = g * grad_scale;
    p.adam_m.mul_(c.adam_beta1).add_(g, 1.0 - c.adam_beta1);
    p.adam_v.mul_(c.adam_beta2).addcmul_(g, g, 1.0 - c.adam_beta2);
    torch::Tensor denom = (p.adam_v / bc2).sqrt_().add_(c.adam_eps);
    torch::Tensor update = (p.adam_m / bc1).div_(denom);
    if (c.weight_decay > 0) update.add_(p.master.detach(), c.weight_decay);
    p.master.detach().sub_(update * lr);
    // In place: a switch's views (StateView) and a shared tensor stay valid.
    p.weight.copy_(p.master.detach());
    p.master.mutable_grad() = torch::Tensor();
  }
}

absl::StatusOr<IterationResult> ReferenceEngine::RunIteration(
    const IterationControl& control) {
  const absl::Time start = absl::Now();
  const Template& t = tmpl();
  const int ti = role_.template_index, r = role_.replica, s = role_.stage;
  const int depth = t.depth();
  // This replica's micro-batches and their first sample: templates in plan
  // order, replicas in order, each a contiguous run of samples.
  int64_t first = scalars_[kScalarCursor];
  for (int tj = 0; tj <= ti; ++tj) {
    const Template& o = plan_.templates[tj];
    for (int rj = 0; rj < (tj == ti ? r : o.replicas); ++rj) {
      const int m = o.total_micro_batches / o.replicas +
                    (rj < o.total_micro_batches % o.replicas ? 1 : 0);
      first += int64_t{m} * o.micro_batch_size;
    }
  }
  const int mbs = t.micro_batch_size;
  const int micro = t.total_micro_batches / t.replicas +
                    (r < t.total_micro_batches % t.replicas ? 1 : 0);
  const int seq = job_.training.seq_len;
  const int hidden = job_.model.hidden;
  const int tp_here = stage().tp;
  const int tp_prev = s > 0 ? t.stages[s - 1].tp : 1;
  const int tp_next = s + 1 < depth ? t.stages[s + 1].tp : 1;
  const uint32_t iter_tag = static_cast<uint32_t>(scalars_[kScalarStep] % 1024) << 20;

  std::vector<std::pair<torch::Tensor, c10::intrusive_ptr<c10d::Work>>> sends;
  std::vector<torch::Tensor> inputs(micro), outputs(micro);
  double loss_share = 0;
  try {
    auto forward = [&](int mb) {
      const int64_t sample = first + int64_t{mb} * mbs;
      torch::Tensor h;
      ComputePacer::Mark computing = pacer_.Start();
      if (s == 0) {
        h = Embed(Tokens(sample, false));
      } else {
        torch::Tensor in = torch::empty({mbs, seq, hidden});
        std::vector<at::Tensor> v{in};
        world_->recv(v, PlanRankOf(ti, r, s - 1, role_.tp_rank % tp_prev),
                     iter_tag | (mb << 1))
            ->wait();
        computing = pacer_.Start();  // the wait for the input is not compute
        in.set_requires_grad(true);
        inputs[mb] = in;
        h = in;
      }
      for (int l = stage().layer_begin; l < stage().layer_end; ++l) {
        h = Block(l, h);
      }
      if (s == depth - 1) {
        outputs[mb] = HeadLoss(h, Tokens(sample, true));
        loss_share += outputs[mb].item<double>();
        pacer_.Pace(computing);
      } else {
        outputs[mb] = h;
        torch::Tensor out = h.detach().contiguous();
        pacer_.Pace(computing);
        for (int j = role_.tp_rank; j < tp_next; j += tp_here) {
          std::vector<at::Tensor> v{out};
          sends.push_back(
              {out, world_->send(v, PlanRankOf(ti, r, s + 1, j),
                                 iter_tag | (mb << 1))});
        }
      }
    };
    auto backward = [&](int mb) {
      ComputePacer::Mark computing = pacer_.Start();
      if (s == depth - 1) {
        outputs[mb].backward();
      } else {
        torch::Tensor g = torch::empty({mbs, seq, hidden});
        std::vector<at::Tensor> v{g};
        world_->recv(v, PlanRankOf(ti, r, s + 1, role_.tp_rank % tp_next),
                     iter_tag | (mb << 1) | 1)
            ->wait();
        computing = pacer_.Start();
        outputs[mb].backward(g);
      }
      pacer_.Pace(computing);
      outputs[mb] = torch::Tensor();
      if (s > 0) {
        torch::Tensor g = inputs[mb].grad().contiguous();
        for (int j = role_.tp_rank; j < tp_prev; j += tp_here) {
          std::vector<at::Tensor> v{g};
          sends.push_back({g, world_->send(v, PlanRankOf(ti, r, s - 1, j),
                                           iter_tag | (mb << 1) | 1)});
        }
        inputs[mb] = torch::Tensor();
      }
    };
    // 1F1B: warm-up forwards, then one forward and one backward, then the
    // remaining backwards.
    const int warmup = std::min(depth - s - 1, micro);
    int f = 0, b = 0;
    for (; f < warmup; ++f) forward(f);
    for (; f < micro; ++f, ++b) {
      forward(f);
      backward(b);
    }
    for (; b < micro; ++b) backward(b);
    for (auto& [tensor, work] : sends) work->wait();
    sends.clear();
    SyncGradients();
    // The global loss (every pipeline's last stage adds its share), the
    // agreement to stop here (any rank that was asked) and, when clipping,
    // the squared global gradient norm (each rank's owned elements).
    const bool clip = job_.engine.grad_clip_norm > 0;
    torch::Tensor loss = torch::tensor(
        {s == depth - 1 && role_.tp_rank == 0 ? loss_share : 0.0,
         control.stop_requested ? 1.0 : 0.0,
         clip ? OwnedGradientSquares() : 0.0},
        torch::kFloat64);
    AllReduce(world_.get(), loss);
    const ComputePacer::Mark stepping = pacer_.Start();
    OptimizerStep(
        clip ? job_.engine.ClipScale(std::sqrt(loss[2].item<double>())) : 1.0);
    pacer_.Pace(stepping);
    scalars_[kScalarStep] += 1;
    scalars_[kScalarCursor] += job_.training.global_batch;
    IterationResult res;
    res.iteration = scalars_[kScalarStep];
    res.loss = loss[0].item<double>();
    res.stop_agreed = loss[1].item<double>() > 0;
    res.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    res.tokens = int64_t{job_.training.global_batch} * seq;
    return res;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "plan rank ", me_, " (template ", ti, " replica ", r, " stage ", s,
        " tp rank ", role_.tp_rank, "): iteration ",
        scalars_[kScalarStep] + 1, " failed: ", StatusText(e)));
  }
}

absl::Status ReferenceEngine::SaveState(migration::ShardSet* out) const {
  if (out->holdings() != holdings()) {
    return absl::InvalidArgumentError(
        "SaveState: the shard set does not hold this rank's holdings");
  }
  for (const Param& p : params_) {
    const std::array<torch::Tensor, 4> parts = Parts(p);
    for (int k = 0; k < 4; ++k) {
      const TensorSpec& ts = state_.tensor(p.ids[k]);
      const ByteRange range = KindRange(p, ts);
      uint8_t* to = out->Find(p.ids[k], range);
      if (to == nullptr) {
        return absl::InternalError(absl::StrCat("SaveState: no buffer for ",
                                                ts.name));
      }
      // Written in place through a view of the buffer: no temporary (a
      // switch exports the whole state on the critical path).
      torch::Tensor view = torch::from_blob(to, p.canonical_shape,
                                            parts[k].options());
      view.copy_(parts[k]);
    }
  }
  uint8_t* sc = out->Find(scalars_id_, {0, 8 * kReferenceScalars});
  CHECK(sc != nullptr);
  std::memcpy(sc, scalars_.data(), 8 * kReferenceScalars);
  return absl::OkStatus();
}

absl::Status ReferenceEngine::LoadState(const migration::ShardSet& in) {
  if (in.holdings() != holdings()) {
    return absl::InvalidArgumentError(
        "LoadState: the shard set does not hold this rank's holdings");
  }
  std::vector<int64_t> sc(kReferenceScalars);
  const uint8_t* from = in.Find(scalars_id_, {0, 8 * kReferenceScalars});
  CHECK(from != nullptr);
  std::memcpy(sc.data(), from, 8 * kReferenceScalars);
  if (absl::Status s = CheckScalars(sc); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  for (Param& p : params_) {
    std::array<torch::Tensor, 4> parts = Parts(p);
    for (int k = 0; k < 4; ++k) {
      const TensorSpec& ts = state_.tensor(p.ids[k]);
      const ByteRange range = KindRange(p, ts);
      const uint8_t* src = in.Find(p.ids[k], range);
      if (src == nullptr) {
        return absl::InternalError(absl::StrCat("LoadState: no buffer for ",
                                                ts.name));
      }
      // Copied from a view of the received bytes into the engine's own
      // tensors (allocated when it was built): no temporary.
      torch::Tensor view = torch::from_blob(const_cast<uint8_t*>(src),
                                            p.canonical_shape,
                                            parts[k].options());
      parts[k].copy_(view);
    }
  }
  std::copy(sc.begin(), sc.end(), scalars_.begin());
  return absl::OkStatus();
}

absl::Status ReferenceEngine::CheckScalars(
    const std::vector<int64_t>& sc) const {
  if (sc[kScalarFormat] != kReferenceStateFormat) {
    return absl::FailedPreconditionError(absl::StrCat(
        "LoadState: state format ", sc[kScalarFormat], ", expected ",
        kReferenceStateFormat));
  }
  if (sc[kScalarDataSeed] != static_cast<int64_t>(job_.engine.data_seed) ||
      sc[kScalarGlobalBatch] != job_.training.global_batch ||
      sc[kScalarSeqLen] != job_.training.seq_len) {
    return absl::FailedPreconditionError(absl::StrCat(
        "LoadState: the state was trained with data_seed ", sc[kScalarDataSeed],
        ", global_batch ", sc[kScalarGlobalBatch], ", seq_len ",
        sc[kScalarSeqLen], "; this job has ", job_.engine.data_seed, ", ",
        job_.training.global_batch, ", ", job_.training.seq_len));
  }
  return absl::OkStatus();
}

migration::ShardSet ReferenceEngine::StateView() {
  absl::flat_hash_map<int, uint8_t*> at;
  for (const Param& p : params_) {
    const std::array<torch::Tensor, 4> parts = Parts(p);
    for (int k = 0; k < 4; ++k) {
      CHECK(parts[k].is_contiguous()) << p.name;
      at[p.ids[k]] = static_cast<uint8_t*>(parts[k].data_ptr());
    }
  }
  at[scalars_id_] = reinterpret_cast<uint8_t*>(scalars_.data());
  std::vector<Holding> hs = holdings();
  std::vector<uint8_t*> data;
  for (const Holding& h : hs) {
    auto it = at.find(h.tensor);
    CHECK(it != at.end()) << "no tensor of the engine holds tensor " << h.tensor;
    data.push_back(it->second);
  }
  return migration::ShardSet::View(std::move(hs), std::move(data));
}

absl::Status ReferenceEngine::StateWritten() {
  if (absl::Status s = CheckScalars(scalars_); !s.ok()) {
    // Nothing to undo: the engine is new and trains only after a Commit.
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<migration::ModelState> ReferenceModelState(const JobSpec& job) {
  return migration::ModelState::Create(
      job.model, {.training_scalars = kReferenceScalars});
}

absl::Status CheckReferencePlan(const JobSpec& job, const Plan& plan) {
  const ModelSpec& m = job.model;
  if (absl::Status s = job.engine.Validate(); !s.ok()) return s;
  if (job.engine.token_file.has_value()) {
    return absl::UnimplementedError(absl::StrCat(
        "engine.token_file (", job.engine.token_file->path,
        "): the reference engine trains on the synthetic corpus only; run "
        "the job on arachne_torch (docs/pytorch.md) to train on a token "
        "file"));
  }
  if (m.attention != AttentionKind::kGqa || m.mlp != MlpKind::kSwiGlu ||
      m.tied_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", m.name, ": the reference engine trains LLaMA-shaped models "
        "(GQA attention, SwiGLU MLP, untied embeddings)"));
  }
  if (m.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", m.name, ".head_dim: must be even for rotary embeddings, got ",
        m.head_dim));
  }
  int64_t samples = 0;
  for (size_t ti = 0; ti < plan.templates.size(); ++ti) {
    const Template& t = plan.templates[ti];
    for (size_t si = 0; si < t.stages.size(); ++si) {
      const int tp = t.stages[si].tp;
      const std::string w =
          absl::StrCat("plan.templates[", ti, "].stages[", si, "].tp");
      for (auto [what, n] : {std::pair<const char*, int64_t>{"num_heads", m.num_heads},
                             {"num_kv_heads", m.num_kv_heads},
                             {"ffn", m.ffn},
                             {"vocab", m.vocab}}) {
        if (tp <= 0 || n % tp != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              w, ": ", tp, " does not divide the model's ", what, " (", n,
              ")"));
        }
      }
    }
    for (size_t si = 0; si < t.stages.size(); ++si) {
      const Stage& st = t.stages[si];
      if (m.MoeLayersIn(st.layer_begin, st.layer_end) == 0) continue;
      const std::string w =
          absl::StrCat("plan.templates[", ti, "].stages[", si, "]");
      const int etp = st.tiling.etp;
      const int64_t shared_ffn = m.moe.shared_expert_ffn > 0
                                     ? m.moe.shared_expert_ffn
                                     : m.moe.expert_ffn;
      if (etp <= 0 || m.moe.expert_ffn % etp != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            w, ".expert_tiling.etp: ", etp, " does not divide expert_ffn (",
            m.moe.expert_ffn, ")"));
      }
      if (m.moe.shared_experts > 0 && shared_ffn % st.tp != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            w, ".tp: ", st.tp, " does not divide shared_expert_ffn (",
            shared_ffn, ")"));
      }
      // The replicas of a MoE stage dispatch tokens to each other once per
      // micro-batch, so they run the same number of micro-batches.
      if (t.total_micro_batches % t.replicas != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan.templates[", ti, "].total_micro_batches: ",
            t.total_micro_batches, " is not a multiple of its ", t.replicas,
            " replicas, which its MoE stage ", si, " needs"));
      }
    }
    if (t.micro_batch_size <= 0 || t.total_micro_batches < t.replicas) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan.templates[", ti, "]: micro_batch_size ", t.micro_batch_size,
          " and total_micro_batches ", t.total_micro_batches,
          " must give every one of its ", t.replicas,
          " replicas a micro-batch"));
    }
    samples += int64_t{t.micro_batch_size} * t.total_micro_batches;
  }
  if (samples != job.training.global_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: its micro-batches hold ", samples,
        " samples per iteration, the global batch is ",
        job.training.global_batch));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> CreateReferenceEngine(
    const EngineArgs& args, EngineBuildTiming* timing) {
  CHECK(args.state != nullptr && args.layout != nullptr);
  if (absl::Status s = CheckReferencePlan(args.job, args.plan); !s.ok()) {
    return s;
  }
  if (args.plan_rank < 0 || args.plan_rank >= args.layout->num_gpus()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan_rank: ", args.plan_rank, " is not a GPU of the plan (",
        args.layout->num_gpus(), " GPUs)"));
  }
  // Ranks share the agent's cores; one intra-op thread each.
  torch::set_num_threads(1);
  auto engine = std::make_unique<ReferenceEngine>(args);
  if (absl::Status s = engine->Build(args, timing); !s.ok()) return s;
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace arachne::agent
