#include "controller/measurement.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace arachne::controller {

IterationMeter::IterationMeter(int64_t first_iteration, int warmup, int window)
    : first_iteration_(first_iteration),
      warmup_(std::max(0, warmup)),
      window_(std::max(1, window)) {}

bool IterationMeter::Add(int64_t iteration, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return false;
  if (iteration <= first_iteration_ + warmup_) return false;
  auto it = samples_.find(iteration);
  if (it != samples_.end()) {
    // Another rank of the same iteration: the slowest rank is the plan's.
    if (seconds <= it->second) return false;
    it->second = seconds;
    return true;
  }
  // An iteration older than the whole window, reported late by a slow
  // rank, was already counted (or would not be read): ignored.
  if (static_cast<int>(samples_.size()) >= window_ &&
      iteration < samples_.begin()->first) {
    return false;
  }
  samples_[iteration] = seconds;
  ++measured_;
  while (static_cast<int>(samples_.size()) > window_) {
    samples_.erase(samples_.begin());
  }
  return true;
}

double IterationMeter::MedianSeconds() const {
  std::vector<double> v;
  v.reserve(samples_.size());
  for (const auto& [iteration, seconds] : samples_) v.push_back(seconds);
  return Median(std::move(v));
}

void IterationMeter::Restore(const std::map<int64_t, double>& samples,
                             int measured) {
  samples_.clear();
  for (const auto& [iteration, seconds] : samples) {
    if (iteration > first_iteration_ + warmup_ && seconds > 0) {
      samples_[iteration] = seconds;
    }
  }
  while (static_cast<int>(samples_.size()) > window_) {
    samples_.erase(samples_.begin());
  }
  measured_ = std::max(measured, static_cast<int>(samples_.size()));
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double RelativeNoise(const std::map<int64_t, double>& samples) {
  if (samples.size() < 3) return 0;
  std::vector<double> v;
  v.reserve(samples.size());
  for (const auto& [iteration, seconds] : samples) v.push_back(seconds);
  const double median = Median(v);
  if (!(median > 0)) return 0;
  for (double& x : v) x = std::abs(x - median);
  return Median(std::move(v)) / median;
}

double NodeMemoryRecord::MeasuredGibPerGpu() const {
  if (gpus <= 0 || peak_rss_bytes <= 0) return 0;
  return static_cast<double>(peak_rss_bytes) / gpus / (1 << 30);
}

double GenerationRecord::MeasuredPeakGib() const {
  double peak = 0;
  for (const NodeMemoryRecord& m : memory) {
    peak = std::max(peak, m.MeasuredGibPerGpu());
  }
  return peak;
}

std::string SamplesToJson(const std::map<int64_t, double>& samples) {
  // [[iteration, seconds], ...]: JSON object keys would be strings.
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [iteration, seconds] : samples) {
    j.push_back(nlohmann::json::array({iteration, seconds}));
  }
  return j.dump();
}

absl::StatusOr<std::map<int64_t, double>> SamplesFromJson(
    const std::string& json) {
  std::map<int64_t, double> out;
  if (json.empty()) return out;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_array()) {
    return absl::DataLossError(
        absl::StrCat("samples_json: not a JSON array: ", json.substr(0, 60)));
  }
  for (const nlohmann::json& e : j) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer() ||
        !e[1].is_number()) {
      return absl::DataLossError(absl::StrCat(
          "samples_json: an entry is not [iteration, seconds]: ", e.dump()));
    }
    out[e[0].get<int64_t>()] = e[1].get<double>();
  }
  return out;
}

std::string MemoryToJson(const std::vector<NodeMemoryRecord>& memory) {
  nlohmann::json j = nlohmann::json::array();
  for (const NodeMemoryRecord& m : memory) {
    j.push_back({{"node", m.node},
                 {"gpu_type", m.gpu_type},
                 {"gpus", m.gpus},
                 {"peak_rss_bytes", m.peak_rss_bytes},
                 {"predicted_gib", m.predicted_gib}});
  }
  return j.dump();
}

absl::StatusOr<std::vector<NodeMemoryRecord>> MemoryFromJson(
    const std::string& json) {
  std::vector<NodeMemoryRecord> out;
  if (json.empty()) return out;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_array()) {
    return absl::DataLossError(
        absl::StrCat("memory_json: not a JSON array: ", json.substr(0, 60)));
  }
  for (const nlohmann::json& e : j) {
    if (!e.is_object() || !e.value("node", nlohmann::json()).is_string()) {
      return absl::DataLossError(
          absl::StrCat("memory_json: an entry has no node: ", e.dump()));
    }
    NodeMemoryRecord m;
    m.node = e.value("node", "");
    m.gpu_type = e.value("gpu_type", "");
    m.gpus = e.value("gpus", 0);
    m.peak_rss_bytes = e.value("peak_rss_bytes", int64_t{0});
    m.predicted_gib = e.value("predicted_gib", 0.0);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace arachne::controller
