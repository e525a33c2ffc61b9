#include "planner_service/core/text/quote.h"

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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
// maximal ill-formed subsequence as one U+FFFD (Unicode 15, section 3.9,
// "U+FFFD Substitution of Maximal Subparts"): an invalid lead byte alone,
// or a valid lead and the continuation bytes that still fit it, the byte
// that broke the sequence read again as the start of the next.
void AppendEscaped(absl::string_view s, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      AppendAscii(c, out);
      ++i;
      continue;
    }
    int extra = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      absl::StrAppend(out, kReplacement);
      ++i;
      continue;
    }
    int k = 1;
    for (; k <= extra && i + k < s.size(); ++k) {
      const unsigned char b = s[i + k];
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
    }
    if (k > extra) {
      absl::StrAppend(out, s.substr(i, extra + 1));
    } else {
      absl::StrAppend(out, kReplacement);
    }
    i += k;
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
