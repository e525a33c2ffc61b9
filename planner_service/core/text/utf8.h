// Well-formed UTF-8 (Unicode section 3.9, table 3-7: no overlong forms, no
// surrogates, nothing above U+10FFFF), as the file readers check it and
// QuoteForMessage shows it.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_TEXT_UTF8_H_
#define ARACHNE_PLANNER_SERVICE_CORE_TEXT_UTF8_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace arachne {

// The sequence that starts at s[i] (i < s.size()): `valid`, and `length`
// bytes long (1 for ASCII); or not, and `length` is its maximal ill-formed
// subpart (an invalid lead byte alone, or a lead and the continuation bytes
// that still fit it), after which the next sequence starts.
struct Utf8Sequence {
  size_t length = 1;
  bool valid = true;
};
Utf8Sequence Utf8SequenceAt(absl::string_view s, size_t i);

// Offset of the first byte of `s` that does not belong to a well-formed
// UTF-8 sequence, or npos.
size_t FirstInvalidUtf8(absl::string_view s);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_TEXT_UTF8_H_
