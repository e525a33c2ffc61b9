// A user's value quoted for an error message. In the core so that the
// core's own messages (a measured run's label, calibration/run_corrections.h)
// quote exactly as the file readers' do (io/json_yaml.h includes this).
#ifndef ARACHNE_PLANNER_SERVICE_CORE_TEXT_QUOTE_H_
#define ARACHNE_PLANNER_SERVICE_CORE_TEXT_QUOTE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace arachne {

// Bytes of a user's value an error message quotes before it abbreviates,
// so a 5 MB name gives a one-line error, not a 5 MB one.
inline constexpr int kMaxQuotedBytes = 64;

// `s` quoted for an error message: "\"abc\"", or its first kMaxQuotedBytes
// bytes and the full size, "\"abc...\" (5242880 bytes)". Escaped as a JSON
// string (quote, backslash and control characters; other characters as
// they are); bytes that are not UTF-8 are shown as U+FFFD, one for each
// maximal ill-formed subsequence (a sequence cut in two by the
// abbreviation, too).
std::string QuoteForMessage(absl::string_view s);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_TEXT_QUOTE_H_
