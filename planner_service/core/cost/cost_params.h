// Every tunable constant of the cost model that is not the framework's
// (framework.h), in one place, with its meaning and default.
// docs/cost-model.md explains each one and where the default comes from.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_COST_COST_PARAMS_H_
#define ARACHNE_PLANNER_SERVICE_CORE_COST_COST_PARAMS_H_

#include <map>
#include <string>

namespace arachne {

struct CostParams {
  // --- Memory ---------------------------------------------------------------
  // Fraction of device memory a plan's predicted peak may reach: the margin
  // the planner keeps (the allocator's own overhead is the framework's).
  double usable_memory_fraction = 0.95;
  // Selective recomputation keeps this fraction of a layer's activations
  // (the attention-core part is dropped and recomputed).
  double selective_activation_fraction = 0.8;

  // --- Compute --------------------------------------------------------------
  // Extra backward work under selective recomputation, as a fraction of the
  // forward time (the recomputed attention core).
  double selective_recompute_fwd_fraction = 0.15;

  // --- Communication --------------------------------------------------------
  // Latency per ring step of a collective (NCCL src/graph/tuning.cc tuning
  // model, older release): network 9.6 us, plus a base of 8.4 us per
  // collective.
  double network_step_latency_s = 9.6e-6;
  double intra_node_step_latency_s = 3.4e-6;
  double collective_base_latency_s = 8.4e-6;
  // Achieved fraction of the NIC line rate (100 Gb/s NIC -> 12.2 GB/s bus
  // bandwidth measured, nccl / nccl-tests issues).
  double nic_efficiency = 0.976;
  // Latency of one point-to-point activation send.
  double p2p_latency_s = 20e-6;
  // Compute kernels that run while a collective overlaps them are slower by
  // this fraction: NCCL's kernels hold SMs and HBM bandwidth. 18.9% on
  // average (40% at most) over GPT and LLaMA training steps on 4 A100, H100,
  // MI250 and MI210 GPUs (Lee et al. 2025, "Characterizing Compute-
  // Communication Overlap in GPU-Accelerated Distributed Deep Learning",
  // arXiv 2507.03114, abstract). Charged on every collective the cost
  // model overlaps with compute (FSDP's gathers, an overlapped gradient
  // reduction, the hidden share of the TP collectives): OverlappedTime.
  double overlap_compute_slowdown = 0.189;

  // --- Measured-run corrections (arachne calibrate) --------------------------
  // GPU id -> multiplier on that type's profiled layer compute time (forward
  // and backward); a type not listed keeps 1.
  std::map<std::string, double> compute_scale;
  // GPU id -> multiplier on the fused (flash) attention kernel's share of
  // that type's synthesized layer times (ProfileEntry::attention_*_ms),
  // applied before compute_scale: the attention kernel a framework runs
  // on a GPU can sit further from the profile than its GEMMs do, beyond
  // what its `attention` kernel (framework.h) already prices
  // (bench/published-runs/findings.md item 3). 1 when not listed.
  std::map<std::string, double> attention_scale;
  // GPU id -> multiplier on that type's profiled TP-collective time (the
  // intra-node link a profile assumes can be slower in practice: V100's
  // hybrid cube-mesh NVLink against the ring model). 1 when not listed.
  std::map<std::string, double> tp_comm_scale;

  // --- Search space ---------------------------------------------------------
  // Micro-batch sizes are the powers of two up to this (profiled sizes).
  int max_micro_batch_size = 32;
  // TP degrees are the powers of two up to min(this, largest node).
  int max_tp = 8;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_COST_COST_PARAMS_H_
