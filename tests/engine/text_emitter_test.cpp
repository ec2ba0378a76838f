// TextEmitter: UTF-8 hold-back, stop-string hold-back, and their combination.
#include "engine/text_emitter.h"

#include <gtest/gtest.h>

namespace bonsai::engine {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(TextEmitter, PassesPlainTextThrough) {
  TextEmitter e;
  EXPECT_EQ(e.push("Hel"), "Hel");
  EXPECT_EQ(e.push("lo"), "lo");
  EXPECT_EQ(e.finish(), "");
  EXPECT_EQ(e.released(), "Hello");
  EXPECT_FALSE(e.stopped());
}

TEST(TextEmitter, MultiByteCharacterSplitAcrossTokens) {
  TextEmitter e;
  EXPECT_EQ(e.push("caf\xC3"), "caf");  // é = C3 A9
  EXPECT_EQ(e.push("\xA9!"), "\xC3\xA9!");
  // U+1F600 = F0 9F 98 80 in three pieces.
  EXPECT_EQ(e.push("\xF0"), "");
  EXPECT_EQ(e.push("\x9F\x98"), "");
  EXPECT_EQ(e.push("\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(e.released(), "caf\xC3\xA9!\xF0\x9F\x98\x80");
}

TEST(TextEmitter, InvalidBytesBecomeReplacementCharacters) {
  TextEmitter e;
  EXPECT_EQ(e.push("a\xFF"
                   "b"),
            "a" + kFffd + "b");                  // invalid byte
  EXPECT_EQ(e.push("\x80"), kFffd);              // stray continuation
  EXPECT_EQ(e.push("\xE2\x82"), "");             // valid prefix of a 3-byte char
  EXPECT_EQ(e.push("A"), kFffd + "A");           // ...broken: one U+FFFD for the subpart
  EXPECT_EQ(e.push("\xED\xA0"), kFffd + kFffd);  // surrogate: ED then A0 both invalid
  EXPECT_EQ(e.push("\xC3"), "");
  EXPECT_EQ(e.finish(), kFffd);  // incomplete at the end
}

TEST(TextEmitter, StopStringSplitAcrossTokens) {
  TextEmitter e({"END"});
  EXPECT_EQ(e.push("abc E"), "abc ");  // "E" may start END: held
  EXPECT_EQ(e.push("N"), "");
  EXPECT_EQ(e.push("Dxyz"), "");
  EXPECT_TRUE(e.stopped());
  EXPECT_EQ(e.matched_stop(), 0);
  EXPECT_EQ(e.released(), "abc ");
  EXPECT_EQ(e.push("more"), "");
  EXPECT_EQ(e.finish(), "");
  EXPECT_EQ(e.released(), "abc ");
}

TEST(TextEmitter, PartialMatchThatIsNotAStop) {
  TextEmitter e({"END"});
  EXPECT_EQ(e.push("xEN"), "x");
  EXPECT_EQ(e.push("d"), "ENd");  // "ENd" is not "END": released
  EXPECT_FALSE(e.stopped());
  EXPECT_EQ(e.push("E"), "");
  EXPECT_EQ(e.push("E"), "E");  // first E cannot start END any more; second may
  EXPECT_EQ(e.finish(), "E");   // end of generation releases what was held
  EXPECT_EQ(e.released(), "xENdEE");
}

TEST(TextEmitter, StopInsideOneToken) {
  TextEmitter e({"\n\n"});
  EXPECT_EQ(e.push("line\n\nnext"), "line");
  EXPECT_TRUE(e.stopped());
}

TEST(TextEmitter, EarliestOfSeveralStopsWins) {
  TextEmitter e({"world", "lo"});
  EXPECT_EQ(e.push("hello world"), "hel");
  EXPECT_EQ(e.matched_stop(), 1);
}

TEST(TextEmitter, HoldsLongestPossibleStart) {
  TextEmitter e({"abc", "bcd"});
  EXPECT_EQ(e.push("xab"), "x");  // "ab" may start "abc" (and "b" "bcd")
  EXPECT_EQ(e.push("c"), "");
  EXPECT_TRUE(e.stopped());
  EXPECT_EQ(e.matched_stop(), 0);
  EXPECT_EQ(e.released(), "x");
}

TEST(TextEmitter, MultiByteStopAndPartialCharacter) {
  TextEmitter e({"\xC3\xA9t\xC3\xA9"});            // "été"
  EXPECT_EQ(e.push("un \xC3"), "un ");             // partial char held (UTF-8)
  EXPECT_EQ(e.push("\xA9t"), "");                  // "ét" may start "été" (stop)
  EXPECT_EQ(e.push("\xC3"), "");                   // partial char
  EXPECT_EQ(e.push("\xA8"), "\xC3\xA9t\xC3\xA8");  // "étè" is not "été"
  EXPECT_FALSE(e.stopped());
  EXPECT_EQ(e.push("\xC3\xA9t\xC3\xA9!"), "");
  EXPECT_TRUE(e.stopped());
  EXPECT_EQ(e.released(), "un \xC3\xA9t\xC3\xA8");
}

TEST(TextEmitter, ConcatenationEqualsOneShot) {
  // Byte-by-byte pushes release exactly what one push + finish releases.
  const std::string text = "Il \xC3\xA9tait une fois STOP la fin";
  for (const std::vector<std::string>& stops :
       {std::vector<std::string>{}, std::vector<std::string>{"STOP"}, std::vector<std::string>{"fois S", "zz"}}) {
    TextEmitter whole(stops), bytes(stops);
    std::string a = whole.push(text) + whole.finish();
    std::string b;
    for (char c : text) b += bytes.push(std::string_view(&c, 1));
    b += bytes.finish();
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, whole.released());
  }
}

TEST(TextEmitter, EmptyStopStringsIgnored) {
  TextEmitter e({""});
  EXPECT_EQ(e.stop().size(), 0u);
  EXPECT_EQ(e.push("abc"), "abc");
}

}  // namespace
}  // namespace bonsai::engine
