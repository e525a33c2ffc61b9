#include "planner_service/core/text/quote.h"

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner_service/core/text/utf8.h"

namespace arachne {
namespace {

constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends `c` (< 0x80) as a JSON string holds it.
void AppendAscii(unsigned char c, std::string* out) {
  switch (c) {
    case '\b': out->append("\\b"); return;
    case '\t': out->append("\\t"); return;
    case '\n': out->append("\\n"); return;
    case '\f': out->append("\\f"); return;
    case '\r': out->append("\\r"); return;
    case '"': out->append("\\\""); return;
    case '\\': out->append("\\\\"); return;
    default:
      if (c <= 0x1F) {
        absl::StrAppendFormat(out, "\\u%04x", c);
      } else {
        out->push_back(static_cast<char>(c));
      }
  }
}

// Appends `s` escaped, well-formed UTF-8 sequences as they are and each
// maximal ill-formed subpart (Utf8SequenceAt) as one U+FFFD.
void AppendEscaped(absl::string_view s, std::string* out) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Sequence seq = Utf8SequenceAt(s, i);
    if (seq.length == 1 && seq.valid) {
      AppendAscii(static_cast<unsigned char>(s[i]), out);
    } else if (seq.valid) {
      absl::StrAppend(out, s.substr(i, seq.length));
    } else {
      absl::StrAppend(out, kReplacement);
    }
    i += seq.length;
  }
}

}  // namespace

std::string QuoteForMessage(absl::string_view s) {
  const bool cut = s.size() > static_cast<size_t>(kMaxQuotedBytes);
  std::string quoted = "\"";
  AppendEscaped(cut ? s.substr(0, kMaxQuotedBytes) : s, &quoted);
  if (cut) quoted.append("...");
  quoted.push_back('"');
  if (!cut) return quoted;
  return absl::StrCat(quoted, " (", s.size(), " bytes)");
}

}  // namespace arachne
