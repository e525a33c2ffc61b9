// What a generation's run measured, beside what its plan predicted: the
// controller's half of the calibration loop (docs/controller.md, "Measured
// iteration times and corrected predictions").
//
// The agents report, per rank, the wall time of the last iteration it ran
// (RankStatus.iteration_seconds, with its iteration number) and the peak
// resident set of the agent process (peak_rss_bytes). The controller polls
// them (status_poll, 100 ms), so an iteration may be seen several times or,
// when iterations are shorter than a poll, not at all: samples are keyed by
// iteration number, and the iteration's time is its slowest rank's (the
// ranks of a synchronous plan wait for each other in the all-reduce, so the
// slowest rank's time is the plan's). Pure logic, no I/O.
#ifndef ARACHNE_CONTROLLER_MEASUREMENT_H_
#define ARACHNE_CONTROLLER_MEASUREMENT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace arachne::controller {

// The measured iteration time of one generation: the median of the last
// `window` iterations after the first `warmup` ones of the generation (a
// switch's first iterations are slow: new process groups, cold caches,
// the allocator growing). The median, not the mean: one iteration held up
// by a poll, a checkpoint or a noisy neighbour does not move it.
class IterationMeter {
 public:
  // The generation started after iteration `first_iteration` (the one
  // training paused after, 0 for a fresh start): iterations up to
  // first_iteration + warmup are warm-up.
  IterationMeter(int64_t first_iteration, int warmup, int window);

  // A rank of the plan reported that iteration `iteration` took `seconds`.
  // Warm-up iterations, iterations of the previous generation (a rank
  // reports its last iteration until it runs one of the new plan) and
  // seconds <= 0 (no iteration run yet) are ignored. Returns whether the
  // median may have changed.
  bool Add(int64_t iteration, double seconds);

  // 0 when nothing was measured yet.
  double MedianSeconds() const;
  // Distinct iterations measured after the warm-up, all of them (the median
  // reads only the last `window`).
  int measured() const { return measured_; }
  int64_t first_iteration() const { return first_iteration_; }
  int warmup() const { return warmup_; }
  int window() const { return window_; }
  // The iterations the median reads, by iteration number.
  const std::map<int64_t, double>& samples() const { return samples_; }

  // Restores a meter saved as (samples, measured) (the state database's record
  // after a controller restart).
  void Restore(const std::map<int64_t, double>& samples, int measured);

 private:
  int64_t first_iteration_;
  int warmup_;
  int window_;
  int measured_ = 0;
  std::map<int64_t, double> samples_;
};

// The median of `values`; 0 for none. The mean of the middle two for an
// even count.
double Median(std::vector<double> values);
// Relative noise of iteration times: median absolute deviation / median of
// the samples' seconds; 0 with fewer than 3 samples.
double RelativeNoise(const std::map<int64_t, double>& samples);

// Peak memory of one node of a generation's plan.
struct NodeMemoryRecord {
  std::string node;
  std::string gpu_type;
  int gpus = 0;                 // GPUs of the plan on this node
  int64_t peak_rss_bytes = 0;   // the agent process's high-water mark
  double predicted_gib = 0;     // per GPU, the highest stage on the node
  // Measured per GPU: the process's peak shared by the plan's GPUs on the
  // node (virtual GPUs are ranks of one process).
  double MeasuredGibPerGpu() const;
};

// One generation as the state database keeps it: the plan, its raw prediction
// and what its run measured. The corrected predictions are not stored: they
// are recomputed from the corrections in force.
struct GenerationRecord {
  int64_t generation = 0;
  std::string cluster_json;  // cluster file JSON
  std::string plan_json;     // plan file JSON, with its raw prediction
  double predicted_iteration_s = 0;
  double predicted_peak_gib = 0;
  int64_t first_iteration = 0;
  int warmup = 0;
  int window = 0;
  std::map<int64_t, double> samples;  // iteration -> seconds (the window)
  int iterations_measured = 0;
  double measured_iteration_s = 0;  // the median; 0 = none yet
  std::vector<NodeMemoryRecord> memory;

  // The highest per-GPU measurement over the nodes; 0 when none reported.
  double MeasuredPeakGib() const;
};

// The samples and node memory as the state database writes them (JSON text).
std::string SamplesToJson(const std::map<int64_t, double>& samples);
absl::StatusOr<std::map<int64_t, double>> SamplesFromJson(
    const std::string& json);
std::string MemoryToJson(const std::vector<NodeMemoryRecord>& memory);
absl::StatusOr<std::vector<NodeMemoryRecord>> MemoryFromJson(
    const std::string& json);

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_MEASUREMENT_H_
