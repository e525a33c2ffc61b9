// What every fuzz target checks of a reader's answer, besides "no crash": a
// rejected input is InvalidArgument (bad input is never another code, never
// OK with a silent default), and the message stays one short line however
// big the input (errors quote at most kMaxQuotedBytes of a value). A broken
// check aborts, which libFuzzer reports as a crash with the input.
#ifndef ARACHNE_FUZZ_FUZZ_CHECKS_H_
#define ARACHNE_FUZZ_FUZZ_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace arachne::fuzz {

// Far above the longest real message (an unknown field listing the allowed
// ones, an unknown GPU type listing the catalog), far below an echoed input.
inline constexpr size_t kMaxErrorBytes = 4096;

inline absl::string_view AsText(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

[[noreturn]] inline void Fail(absl::string_view what,
                              const absl::Status& status) {
  const std::string message(status.message().substr(0, 512));
  std::fprintf(stderr, "fuzz check failed: %.*s: %s: %s\n",
               static_cast<int>(what.size()), what.data(),
               absl::StatusCodeToString(status.code()).c_str(),
               message.c_str());
  std::abort();
}

// An error from reading input must be InvalidArgument with a short message;
// `also_ok` names one more acceptable code (e.g. NotFound where a reader may
// look a name up on disk).
// With ARACHNE_FUZZ_VERBOSE set, each answer is printed too (to see what a
// seed exercises: a seed that is rejected early covers little).
inline void CheckInputError(const absl::Status& status, absl::string_view what,
                            absl::StatusCode also_ok = absl::StatusCode::kOk) {
  static const bool verbose = std::getenv("ARACHNE_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(
        stderr, "  %.*s: %s\n", static_cast<int>(what.size()), what.data(),
        status.ok() ? "OK"
                    : std::string(status.message().substr(0, 300)).c_str());
  }
  if (status.ok()) return;
  if (status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != also_ok) {
    Fail(absl::StrCat(what, ": unexpected code"), status);
  }
  if (status.message().size() > kMaxErrorBytes) {
    Fail(absl::StrCat(what, ": message too long"), status);
  }
}

// Something that must hold, e.g. that a value written back reads again.
inline void CheckOk(const absl::Status& status, absl::string_view what) {
  if (!status.ok()) Fail(what, status);
}

}  // namespace arachne::fuzz

#endif  // ARACHNE_FUZZ_FUZZ_CHECKS_H_
