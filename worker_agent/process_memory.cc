#include "worker_agent/process_memory.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>

namespace arachne::agent {
namespace {

// A "Key:   123 kB" line of /proc/self/status, bytes; 0 when absent.
int64_t StatusKib(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) {
      try {
        return std::stoll(line.substr(key.size())) * 1024;
      } catch (const std::exception&) {
        return 0;
      }
    }
  }
  return 0;
}

// The largest window peak seen before the current window began.
std::atomic<int64_t> earlier_peak{0};

}  // namespace

int64_t ResidentBytes() { return StatusKib("VmRSS:"); }

int64_t WindowPeakResidentBytes() { return StatusKib("VmHWM:"); }

int64_t PeakResidentBytes() {
  return std::max(earlier_peak.load(), WindowPeakResidentBytes());
}

void ResetWindowPeak() {
  const int64_t peak = WindowPeakResidentBytes();
  int64_t seen = earlier_peak.load();
  while (peak > seen && !earlier_peak.compare_exchange_weak(seen, peak)) {
  }
  std::ofstream("/proc/self/clear_refs") << "5";
}

int64_t AvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace arachne::agent
