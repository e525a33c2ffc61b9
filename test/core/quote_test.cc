// QuoteForMessage (planner_service/core/text/quote.h) quotes as nlohmann's
// dump(-1, ' ', false, error_handler_t::replace) of the (abbreviated) value
// did when it lived in io/json_yaml.cc: every message that quotes a user's
// value reads the same. FirstInvalidUtf8 (utf8.h) agrees with nlohmann's
// strict dump.
#include "planner_service/core/text/quote.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/text/utf8.h"

namespace arachne {
namespace {

// The former implementation, on nlohmann-json.
std::string NlohmannQuote(absl::string_view s) {
  const bool cut = s.size() > static_cast<size_t>(kMaxQuotedBytes);
  std::string quoted =
      nlohmann::json(std::string(cut ? s.substr(0, kMaxQuotedBytes) : s))
          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!cut) return quoted;
  quoted.insert(quoted.size() - 1, "...");
  return absl::StrCat(quoted, " (", s.size(), " bytes)");
}

TEST(QuoteForMessage, Examples) {
  EXPECT_EQ(QuoteForMessage("abc"), "\"abc\"");
  EXPECT_EQ(QuoteForMessage(""), "\"\"");
  EXPECT_EQ(QuoteForMessage("a\"b\\c\n\t\x01\x7f"),
            "\"a\\\"b\\\\c\\n\\t\\u0001\x7f\"");
  EXPECT_EQ(QuoteForMessage("caf\xC3\xA9"), "\"caf\xC3\xA9\"");
  EXPECT_EQ(QuoteForMessage("a\xFF" "b"), "\"a\xEF\xBF\xBD" "b\"");
  EXPECT_EQ(QuoteForMessage(std::string(70, 'x')),
            absl::StrCat("\"", std::string(64, 'x'), "...\" (70 bytes)"));
}

TEST(QuoteForMessage, EdgeCasesAsNlohmann) {
  const char* const cases[] = {
      "\xC0\x80", "\xC1\xBF", "\xC2", "\xC2\x80", "\xE0\x80\x80",
      "\xE0\xA0\x80", "\xE0\xA0", "\xED\x9F\xBF", "\xED\xA0\x80",
      "\xEF\xBF\xBF", "\xF0\x8F\xBF\xBF", "\xF0\x90\x80\x80", "\xF0\x90\x80",
      "\xF4\x8F\xBF\xBF", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF\xFE",
      "\x80", "a\xE2\x82" "b", "\xE2\x82\xAC", "\xF0\x9F\x98\x80x",
      "\b\f\r\x1F\x1E\x7F \"\\/"};
  for (const char* c : cases) {
    EXPECT_EQ(QuoteForMessage(c), NlohmannQuote(c)) << NlohmannQuote(c);
  }
  // A sequence cut by the abbreviation.
  for (int pad = 60; pad <= 66; ++pad) {
    const std::string s =
        std::string(pad, 'a') + "\xF0\x9F\x98\x80\xE2\x82\xAC" + "zz";
    EXPECT_EQ(QuoteForMessage(s), NlohmannQuote(s)) << pad;
  }
}

TEST(QuoteForMessage, RandomBytesAsNlohmann) {
  // Bytes drawn mostly from the ones UTF-8 decoding tells apart.
  const unsigned char alphabet[] = {
      0x00, 0x01, 0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x1F, 0x20, 0x22, 0x2F,
      0x41, 0x5C, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1,
      0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3,
      0xF4, 0xF5, 0xFF};
  std::mt19937 rng(37);
  std::uniform_int_distribution<int> length(0, 80);
  std::uniform_int_distribution<int> pick(0, sizeof(alphabet) - 1);
  std::uniform_int_distribution<int> any(0, 255);
  for (int n = 0; n < 20000; ++n) {
    std::string s(length(rng), '\0');
    for (char& c : s) {
      c = static_cast<char>(n % 4 == 0 ? any(rng) : alphabet[pick(rng)]);
    }
    ASSERT_EQ(QuoteForMessage(s), NlohmannQuote(s)) << NlohmannQuote(s);
  }
}

// Whether nlohmann's strict dump takes `s` (it throws on ill-formed UTF-8).
bool NlohmannTakes(const std::string& s) {
  try {
    nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

TEST(FirstInvalidUtf8, AgreesWithNlohmann) {
  std::mt19937 rng(37);
  std::uniform_int_distribution<int> length(0, 12);
  std::uniform_int_distribution<int> byte(0x60, 0xFF);
  for (int n = 0; n < 20000; ++n) {
    std::string s(length(rng), '\0');
    for (char& c : s) c = static_cast<char>(byte(rng));
    const size_t bad = FirstInvalidUtf8(s);
    if (bad == absl::string_view::npos) {
      ASSERT_TRUE(NlohmannTakes(s)) << NlohmannQuote(s);
    } else {
      ASSERT_FALSE(NlohmannTakes(s)) << NlohmannQuote(s);
      ASSERT_TRUE(NlohmannTakes(s.substr(0, bad))) << NlohmannQuote(s);
    }
  }
}

}  // namespace
}  // namespace arachne
