// Per-layer cost profiles: one entry per (layer kind, GPU type, TP degree,
// micro-batch size, sequence length). The cost model reads exact matches
// only; a configuration no entry holds is outside the search space.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_COST_PROFILE_STORE_H_
#define ARACHNE_PLANNER_SERVICE_CORE_COST_PROFILE_STORE_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner_service/core/model/model.h"

namespace arachne {

enum class ProfileSource { kMeasured, kSynthesized };
absl::string_view ProfileSourceName(ProfileSource s);
absl::StatusOr<ProfileSource> ParseProfileSource(absl::string_view s);

struct ProfileKey {
  std::string model;  // ModelSpec::profile_name, e.g. "llama3-8b"
  LayerKind kind = LayerKind::kDense;
  std::string gpu;    // canonical GPU id, e.g. "H100-80GB"
  int tp = 1;         // tensor-parallel degree (ETP for kMoeExperts)
  int mbs = 1;        // micro-batch size, sequences
  int seq = 2048;     // sequence length, tokens

  template <typename H>
  friend H AbslHashValue(H h, const ProfileKey& k) {
    return H::combine(std::move(h), k.model, k.kind, k.gpu, k.tp, k.mbs,
                      k.seq);
  }
  friend bool operator==(const ProfileKey&, const ProfileKey&) = default;
};

// Costs of one layer of `kind` on one GPU of a TP group, for one micro-batch,
// in 16-bit precision without recomputation.
struct ProfileEntry {
  ProfileKey key;
  double fwd_ms = 0;
  double bwd_ms = 0;
  double tp_comm_ms = 0;         // TP collectives (fwd + bwd), 0 at tp = 1
  // Of fwd_ms / bwd_ms, the fused (flash) attention kernel's time: known
  // for synthesized entries (what CostParams::attention_scale scales), 0
  // for measured ones, whose split is not known.
  double attention_fwd_ms = 0;
  double attention_bwd_ms = 0;
  int64_t activation_bytes = 0;  // stored for backward, per GPU
  int64_t param_count = 0;       // parameters held per GPU
  ProfileSource source = ProfileSource::kSynthesized;
};

class ProfileStore {
 public:
  // Adds an entry; AlreadyExists when the key is present (measured entries
  // are added first and win: use AddIfAbsent for synthesized fill-in).
  absl::Status Add(ProfileEntry e);
  // Adds unless the key is present; returns whether it was added.
  bool AddIfAbsent(ProfileEntry e);
  // Exact-match lookup; nullptr when absent.
  const ProfileEntry* Find(const ProfileKey& key) const;
  bool HasModelGpu(absl::string_view model, absl::string_view gpu) const;
  size_t size() const { return entries_.size(); }
  std::vector<const ProfileEntry*> Entries() const;

 private:
  absl::flat_hash_map<ProfileKey, ProfileEntry> entries_;
  absl::flat_hash_map<std::string, int> count_by_model_gpu_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_COST_PROFILE_STORE_H_
