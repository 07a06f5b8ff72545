// Byte-level token data (common/data/text_corpus.hpp): fortune(6)'s documents and the
// blank-line fallback, every pair of consecutive bytes a target exactly once across the
// padded pieces of a document, padding ignored, and the errors.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/data/dataset.hpp"
#include "common/data/text_corpus.hpp"
#include "tests/temp_files.hpp"

namespace bigbatch {
namespace {

TEST(TextCorpus, FortuneFilesSplitAtPercentLines) {
  const std::string text = "A horse!\nMy kingdom.\n%\nx\n%\n%\nTo be,\nor not.\n";
  const std::vector<std::string> documents = split_documents(text);
  // "x\n" is two bytes and stays; the empty document between the two "%" lines goes.
  EXPECT_EQ(documents,
            (std::vector<std::string>{"A horse!\nMy kingdom.\n", "x\n", "To be,\nor not.\n"}));
}

TEST(TextCorpus, OtherFilesSplitAtBlankLines) {
  const std::string text = "First paragraph,\ntwo lines.\n\nSecond.\n\n\nThird";
  EXPECT_EQ(split_documents(text), (std::vector<std::string>{"First paragraph,\ntwo lines.\n",
                                                             "Second.\n", "Third"}));
}

// A document of L bytes cut into pieces of T + 1 bytes that share their boundary byte: its
// L - 1 (byte, next byte) pairs each appear once as (token, target), in order, and every
// other position is padding (token 0, target ignored).
TEST(TextCorpus, EveryConsecutivePairIsATargetExactlyOnce) {
  for (const std::int64_t T : {1, 4, 8, 19, 30}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    const std::vector<std::string> documents = synthetic_documents(6, 0, 25, 3);
    const TokenSequences s = make_sequences(documents, T);
    std::vector<std::pair<std::int32_t, std::int32_t>> want, got;
    for (const std::string& d : documents) {
      for (std::size_t k = 0; k + 1 < d.size(); ++k) {
        want.emplace_back(static_cast<unsigned char>(d[k]), static_cast<unsigned char>(d[k + 1]));
      }
    }
    for (std::size_t k = 0; k < s.tokens.size(); ++k) {
      if (s.targets[k] == kIgnoredLabel) {
        EXPECT_EQ(s.tokens[k], 0) << k;
        continue;
      }
      got.emplace_back(s.tokens[k], s.targets[k]);
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(s.real_targets(), static_cast<std::int64_t>(want.size()));
    EXPECT_EQ(static_cast<std::int64_t>(s.tokens.size()), s.count() * T);
    // A sequence's real positions come first: padding only ever follows them.
    for (std::int64_t i = 0; i < s.count(); ++i) {
      bool padded = false;
      for (std::int64_t t = 0; t < T; ++t) {
        const bool ignored = s.targets[i * T + t] == kIgnoredLabel;
        EXPECT_FALSE(padded && !ignored) << "sequence " << i;
        padded = padded || ignored;
      }
    }
  }
}

TEST(TextCorpus, AShortDocumentIsOnePaddedSequence) {
  const TokenSequences s = make_sequences({"abcde"}, 8);
  EXPECT_EQ(s.tokens, (std::vector<std::int32_t>{'a', 'b', 'c', 'd', 0, 0, 0, 0}));
  EXPECT_EQ(s.targets, (std::vector<std::int32_t>{'b', 'c', 'd', 'e', kIgnoredLabel,
                                                  kIgnoredLabel, kIgnoredLabel,
                                                  kIgnoredLabel}));
  EXPECT_DOUBLE_EQ(s.padding_fraction(), 0.5);
  EXPECT_EQ(s.real_targets(0, 1), 4);
}

TEST(TextCorpus, ErrorsNameThePath) {
  EXPECT_THROW(make_sequences({"abc"}, 0), std::invalid_argument);
  EXPECT_THROW(read_documents("/nonexistent/corpus.txt"), std::runtime_error);
  const testing::TemporaryPath file("empty.txt");
  std::ofstream(file.str()) << "%\n\n%\n";  // documents "", "\n" and "": none of two bytes
  try {
    read_documents(file.str());
    ADD_FAILURE() << "a file of one-byte documents was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file.str()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bigbatch
