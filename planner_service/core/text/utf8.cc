#include "planner_service/core/text/utf8.h"

namespace arachne {

Utf8Sequence Utf8SequenceAt(absl::string_view s, size_t i) {
  const unsigned char c = s[i];
  if (c < 0x80) return {1, true};
  size_t extra = 0;
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
    return {1, false};
  }
  size_t k = 1;
  for (; k <= extra && i + k < s.size(); ++k) {
    const unsigned char b = s[i + k];
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
  }
  return {k, k > extra};
}

size_t FirstInvalidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Sequence seq = Utf8SequenceAt(s, i);
    if (!seq.valid) return i;
    i += seq.length;
  }
  return absl::string_view::npos;
}

}  // namespace arachne
