// The cost model: prices a plan (iteration time, throughput, MFU, per-GPU
// memory, time breakdown) from exact-match profile entries and the formulas
// of docs/cost-model.md. Memory is checked before throughput: a plan that
// does not fit is infeasible, never priced.
//
// All profile lookups are resolved once, when the model is built, into a
// dense table indexed by (GPU type, TP degree, micro-batch size), so pricing
// a plan is pure arithmetic without allocation (the exact planner prices
// millions of plans).
#ifndef ARACHNE_PLANNER_SERVICE_CORE_COST_COST_MODEL_H_
#define ARACHNE_PLANNER_SERVICE_CORE_COST_COST_MODEL_H_

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/cost/cost_params.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"
#include "planner_service/core/cost/profile_store.h"

namespace arachne {

inline constexpr int kMaxTpLog2 = 4;    // TP degrees 1..16
inline constexpr int kMaxMbsLog2 = 7;   // micro-batch sizes 1..128
inline constexpr double kInfeasible = std::numeric_limits<double>::infinity();
// Deepest pipeline the cost model prices (kBadStructure beyond).
inline constexpr int kMaxPricedDepth = 128;

// Power-of-two index: 1 -> 0, 2 -> 1, 4 -> 2; -1 when not a power of two.
int Log2Exact(int v);

// Time of `compute_s` of compute with a collective of `comm_s` overlapping
// it, when the compute runs (1 + slowdown) times slower while the two
// overlap (CostParams::overlap_compute_slowdown). A collective the slowed
// compute covers costs slowdown / (1 + slowdown) of its own time (the
// compute it overlaps stretches to its length): compute_s + comm_s * c /
// (1 + c); a longer one leaves only itself: comm_s. The two meet at
// comm_s = compute_s * (1 + c). With c = 0: max(compute_s, comm_s).
double OverlappedTime(double compute_s, double comm_s, double slowdown);

// One profile entry converted for the cost model: seconds and bytes, with the
// training config's recomputation already applied.
struct LayerCost {
  bool present = false;
  double compute_s = 0;      // fwd + bwd (+ recompute)
  double fwd_s = 0;          // forward alone (full recompute re-runs it)
  double tp_comm_s = 0;      // fwd + bwd TP collectives
  double activation_bytes = 0;  // held per in-flight micro-batch
  // The block's activations without recomputation: what full recomputation
  // rebuilds, and holds while that block's backward runs.
  double full_activation_bytes = 0;
  double params = 0;         // parameters held per GPU
};

// Why a plan is not priced, for messages; kOk when it is.
enum class Infeasibility {
  kOk,
  kMissingProfile,
  kOutOfMemory,
  kBadBatch,
  kBadStructure,
};

class CostModel {
 public:
  // Resolves every profile entry the cluster's GPU types can use. Fails with
  // InvalidArgument on a bad model/training config.
  static absl::StatusOr<CostModel> Create(const GpuCatalog& catalog,
                                          const ModelSpec& model,
                                          const TrainingConfig& training,
                                          const Cluster& cluster,
                                          const ProfileStore& profiles,
                                          CostParams params = {});

  class PricingScratch;  // below

  // Sets each template's total_micro_batches so that the global batch is
  // split in whole micro-batches with the slowest replica as fast as
  // possible. Fails (kBadBatch) when the batch cannot be split exactly.
  // `scratch` (see PricingScratch) as BalanceAndPrice takes it.
  Infeasibility BalanceMicroBatches(Plan& plan,
                                    PricingScratch* scratch = nullptr) const;

  // Iteration time in seconds, or kInfeasible (why in *why when non-null).
  // Allocates only for plans of more than 16 templates; `plan` must be
  // structurally valid (see ValidatePlan) and balanced.
  double IterationTime(const Plan& plan, Infeasibility* why = nullptr) const;

  // Facts about one template's placement that several terms need; computed
  // in one pass over the placement so pricing stays linear in its size.
  struct PlacementFacts {
    // Lowest per-GPU NIC share (GB/s) over the nodes of each stage.
    std::array<double, kMaxPricedDepth> stage_min_share;
    // Lowest NIC share (GB/s) one data-parallel ring of stage s gets over
    // the nodes it crosses: a ring with k members on a node crosses that
    // node's NIC once, so it gets k GPUs' shares (NCCL's ring keeps the
    // node's members adjacent, the intra-node hops run on NVLink/PCIe).
    std::array<double, kMaxPricedDepth> stage_ring_share;
    // Bandwidth (GB/s) of the slowest link from stage s to s+1 over
    // replicas.
    std::array<double, kMaxPricedDepth> boundary_gbps;
    // Whether all replicas of stage s sit on one node.
    std::array<bool, kMaxPricedDepth> stage_single_node;
    double min_ring_share = kInfeasible;
    // The node every stage of every replica sits on, -1 when more than one.
    int only_node = -1;
  };

  // What BalanceAndPrice can keep between the candidates of one fill: the
  // placement facts of the plan's templates. Valid only while no template
  // is added or removed and no placement, GPU type or TP changes (the
  // candidates auto-fill prices for one template differ only in micro-batch
  // size, layer split and expert tilings); a new fill takes a new one.
  //
  // It also keeps, per template, what pricing it costs apart from the
  // balance: its stage times per micro-batch, its stages' worst gradient
  // sync and optimizer step, and whether they fit in memory with every
  // stage's micro-batches in flight at their most (d - s), keyed by what
  // they depend on besides the placement (every stage's GPU type, TP,
  // layers and expert tiling, the micro-batch size, its replicas, the
  // plan's template and replica counts). A template a candidate leaves as
  // it was (auto-fill's templates before the one it fills) is not priced
  // again; its memory is checked again only when its busiest replica runs
  // fewer micro-batches than it has stages. Prices, reasons and balances
  // are those of pricing afresh, bit for bit (cost_model_test).
  //
  // The same holds stage by stage: a template priced again with some
  // stages changed and the rest of its key the same (auto-fill's tiling
  // re-selection changes one stage's tiling at a time) has only those
  // stages' time, gradient sync, optimizer step and memory priced again.
  class PricingScratch {
   private:
    friend class CostModel;
    // The stage times of one template and the key they were priced under;
    // `valid` false until priced (or after a stage had no profile).
    struct TimedTemplate {
      bool valid = false;
      int micro_batch_size = 0, replicas = 0, total_replicas = 0,
          templates = 0;
      std::vector<Stage> stages;  // placement-free: gpu_type, tp, layers, tiling
      std::vector<double> stage_t;
      // Once a plan with it was priced (`priced`): its stages' worst
      // gradient sync and optimizer step, and whether they fit in memory
      // with d - s micro-batches in flight on stage s (1, -1; 0 unknown).
      bool priced = false;
      double worst_sync = 0, worst_opt = 0;
      int fits_deep = 0;
      // Per stage, under the same key: its gradient sync and optimizer
      // step once priced (`synced`), and whether it fits in memory with
      // `mem_in_flight` micro-batches in flight (-1: not checked).
      std::vector<uint8_t> synced;
      std::vector<double> stage_sync, stage_opt;
      std::vector<int> mem_in_flight;
      std::vector<uint8_t> mem_fits;
      // Forgets what was priced for stage s (its stage changed).
      void ForgetStage(int s) {
        synced[s] = 0;
        mem_in_flight[s] = -1;
      }
    };
    std::vector<PlacementFacts> facts_;
    std::vector<TimedTemplate> timed_;
  };

  // BalanceMicroBatches, then IterationTime when the balance succeeds (its
  // failure in *why otherwise): the same result, with the placement facts
  // and stage times both need computed once, and the facts taken from
  // `scratch` when it has them (see PricingScratch). What every search
  // prices a candidate with.
  double BalanceAndPrice(Plan& plan, Infeasibility* why = nullptr,
                         PricingScratch* scratch = nullptr) const;

  // Full prediction with breakdown and per-stage memory. FailedPrecondition
  // naming the stage when it does not fit or a profile is missing.
  absl::StatusOr<Prediction> Predict(const Plan& plan) const;

  // Peak memory per GPU of stage `s` of template `t` (GiB).
  StageMemory StageMemoryOf(const Plan& plan, int t, int s) const;
  // Usable memory of a GPU of catalog type `gpu_type` (GiB).
  double UsableMemoryGib(int gpu_type) const;

  // Time of one micro-batch on stage `s` of template `t` (seconds), kInfeasible
  // when a profile is missing.
  double StageTime(const Plan& plan, int t, int s) const;
  // The same, with the placement facts taken from `scratch` (computed into
  // it for every template when it has none; see PricingScratch): for a
  // search timing many variants of one placement.
  double StageTime(const Plan& plan, int t, int s,
                   PricingScratch& scratch) const;

  // Memory (StageMemoryOf's total, GiB) and time per micro-batch
  // (StageTime's) of stage `s` of template `t` under each of `tilings`, bit
  // for bit what those give with the stage's tiling set to each in turn:
  // what auto-fill's tiling pick compares, with the profile cells and the
  // placement facts (from `scratch` when given) looked up once. A tiling
  // whose memory exceeds `memory_limit_gib` is not timed (kInfeasible).
  // The stage keeps its tiling. `memory_gib` and `time_s` hold one entry
  // per tiling.
  void PriceStageTilings(Plan& plan, int t, int s,
                         absl::Span<const ExpertTiling> tilings,
                         double memory_limit_gib, PricingScratch* scratch,
                         absl::Span<double> memory_gib,
                         absl::Span<double> time_s) const;

  // What stage `s` of template `t` adds to the iteration, as it is now,
  // apart from the balance: its time per micro-batch, its gradient sync
  // left exposed and its optimizer step. The iteration is the slowest
  // template's pipeline plus the worst sync and step over every stage, so
  // a change to one stage that lowers none of the three (and leaves every
  // other stage as it was) cannot lower it. Placement facts from `scratch`
  // (see PricingScratch).
  struct StageWeight {
    double time_s = 0, sync_s = 0, step_s = 0;
  };
  StageWeight StageWeightOf(const Plan& plan, int t, int s,
                            PricingScratch& scratch) const;

  // Profiled cost of one layer of `kind`; nullptr-like (present=false) when
  // no entry exists. tp / mbs must be powers of two.
  const LayerCost& Layer(LayerKind kind, int gpu_type, int tp, int mbs) const;
  bool HasProfile(LayerKind kind, int gpu_type, int tp, int mbs) const {
    return Layer(kind, gpu_type, tp, mbs).present;
  }
  // True when every layer kind the model needs is profiled at (type, tp, mbs).
  bool Supports(int gpu_type, int tp, int mbs) const;

  const GpuCatalog& catalog() const { return *catalog_; }
  const ModelSpec& model() const { return model_; }
  const TrainingConfig& training() const { return training_; }
  const Cluster& cluster() const { return *cluster_; }
  const CostParams& params() const { return params_; }
  // Model FLOPs of one iteration (for MFU).
  double IterationFlops() const { return iteration_flops_; }

 private:
  struct StageTerms {
    double compute_s = 0, tp_comm_s = 0, p2p_s = 0, all_to_all_s = 0;
    // Exposed part of the parameter all-gathers under parameter sharding
    // (FSDP), and the framework's host-side cost per micro-batch.
    double dp_gather_s = 0, fixed_s = 0;
    double total() const {
      return compute_s + tp_comm_s + p2p_s + all_to_all_s + dp_gather_s +
             fixed_s;
    }
  };

  CostModel() = default;
  int CellIndex(int gpu_type, int tp_log2, int mbs_log2) const;
  // Every layer kind's cost at one (GPU type, TP, micro-batch) cell.
  using LayerRow = std::array<LayerCost, kNumLayerKinds>;
  // The row of (gpu_type, tp, mbs); absent_row_ outside the table.
  const LayerRow& Row(int gpu_type, int tp, int mbs) const;
  // What pricing stage `s` of `t` reads from the profile table, looked up
  // once for its memory, parameters and time.
  struct StageCells {
    const LayerRow* layers = nullptr;   // at the stage's TP
    const LayerRow* experts = nullptr;  // at its expert TP (ETP)
    int n_moe = 0, n_dense = 0;
  };
  StageCells CellsOf(const Template& t, int s) const;
  StageTerms StageTimeTerms(const Plan& plan, int t, int s,
                            const PlacementFacts& facts,
                            const StageCells& cells) const;
  PlacementFacts FactsOf(const Template& t) const;
  // Writes the facts of `t` into `f`, only the entries of its depth.
  void FillFacts(const Template& t, PlacementFacts& f) const;
  // Parameters one GPU of stage `s` holds: non-expert (layers / tp,
  // embedding, head) and routed-expert (per EP x ETP shard).
  struct StageParams {
    double non_expert = 0;
    double expert = 0;
  };
  StageParams ParamsOf(const Template& t, int s,
                       const StageCells& cells) const;
  StageMemory MemoryWithParams(const Plan& plan, int t, int s,
                               const StageParams& params,
                               const StageCells& cells) const;
  // What every stage's gradient sync and optimizer step read of the whole
  // plan (placement facts of each template in `facts`).
  struct SyncContext {
    int total_replicas = 0, templates = 0;
    bool plan_single_node = true;
    double plan_min_ring_share = kInfeasible;
    double replicas_moved = 0, reduce_share = 1, step_bytes = 0;
    bool opt_sharded = false;
  };
  SyncContext SyncContextOf(const Plan& plan,
                            const PlacementFacts* facts) const;
  // Stage s of `t`'s gradient sync left exposed after its overlap with the
  // last backward (`stage_s`: its time per micro-batch) and its optimizer
  // step.
  struct SyncAndStep {
    double sync_s = 0, step_s = 0;
  };
  SyncAndStep StageSyncAndStep(const Template& t, int s, const StageParams& sp,
                               double stage_s, const PlacementFacts& f,
                               SyncContext c) const;
  double Evaluate(const Plan& plan, Infeasibility* why,
                  Prediction* detail) const;
  struct PlanWork;  // per-template facts and stage times, see cost_model.cc
  Infeasibility CheckStructure(const Plan& plan) const;
  // Fills work.facts, and work.max_t / sum_t when `stage_times`
  // (kMissingProfile when a stage has no profile).
  Infeasibility PrepareWork(const Plan& plan, bool stage_times,
                            PlanWork& work,
                            PricingScratch* scratch = nullptr) const;
  // The scratch's facts for `plan`, computed when it holds none for a plan
  // of this many templates.
  const PlacementFacts* ScratchFacts(const Plan& plan,
                                     PricingScratch& scratch) const;
  Infeasibility BalanceWith(Plan& plan, const PlanWork& work) const;
  // Evaluate with the work done: stage times reused when work has them.
  // `scratch`: the one PrepareWork keyed for this plan (its kept
  // templates' sync, optimizer step and memory reused).
  double EvaluateWith(const Plan& plan, const PlanWork& work,
                      Infeasibility* why, Prediction* detail,
                      PricingScratch* scratch = nullptr) const;

  const GpuCatalog* catalog_ = nullptr;
  const Cluster* cluster_ = nullptr;
  ModelSpec model_;
  TrainingConfig training_;
  CostParams params_;
  double iteration_flops_ = 0;
  bool has_dense_layers_ = true;
  StateSharding sharding_ = StateSharding::kNone;  // EffectiveSharding()
  std::vector<double> nic_gbps_;   // per node: Cluster::NicGBps
  std::vector<double> nic_share_;  // per node
  // cells_[cell][kind]
  std::vector<LayerRow> cells_;
  LayerRow absent_row_{};
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_COST_COST_MODEL_H_
