#include "planner_service/core/cost/profile_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace arachne {

absl::string_view ProfileSourceName(ProfileSource s) {
  return s == ProfileSource::kMeasured ? "measured" : "synthesized";
}

absl::StatusOr<ProfileSource> ParseProfileSource(absl::string_view s) {
  if (s == "measured") return ProfileSource::kMeasured;
  if (s == "synthesized") return ProfileSource::kSynthesized;
  return absl::InvalidArgumentError(absl::StrCat(
      "source: expected measured or synthesized, got \"", s, "\""));
}

absl::Status ProfileStore::Add(ProfileEntry e) {
  if (entries_.contains(e.key)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "profile entry (", e.key.model, ", ", LayerKindName(e.key.kind), ", ",
        e.key.gpu, ", tp=", e.key.tp, ", mbs=", e.key.mbs,
        ", seq=", e.key.seq, ") is already present"));
  }
  AddIfAbsent(std::move(e));
  return absl::OkStatus();
}

bool ProfileStore::AddIfAbsent(ProfileEntry e) {
  std::string model_gpu = absl::StrCat(e.key.model, "\n", e.key.gpu);
  auto [it, inserted] = entries_.emplace(e.key, std::move(e));
  if (inserted) ++count_by_model_gpu_[model_gpu];
  return inserted;
}

const ProfileEntry* ProfileStore::Find(const ProfileKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

bool ProfileStore::HasModelGpu(absl::string_view model,
                               absl::string_view gpu) const {
  return count_by_model_gpu_.contains(absl::StrCat(model, "\n", gpu));
}

std::vector<const ProfileEntry*> ProfileStore::Entries() const {
  std::vector<const ProfileEntry*> out;
  out.reserve(entries_.size());
  for (const auto& [k, e] : entries_) out.push_back(&e);
  std::sort(out.begin(), out.end(), [](const ProfileEntry* a,
                                       const ProfileEntry* b) {
    const ProfileKey &x = a->key, &y = b->key;
    return std::tie(x.model, x.kind, x.gpu, x.tp, x.mbs, x.seq) <
           std::tie(y.model, y.kind, y.gpu, y.tp, y.mbs, y.seq);
  });
  return out;
}

}  // namespace arachne
