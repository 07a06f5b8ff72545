// Byte-level token data (common/data/text_corpus.hpp): fortune(6)'s documents and the
// blank-line fallback, every pair of consecutive bytes a target exactly once across the
// padded pieces of a document, padding ignored, and the errors; token files (.npy) read
// into the sequences the same documents give as text, and their errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/data/dataset.hpp"
#include "common/data/text_corpus.hpp"
#include "common/io/npy.hpp"
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


// ---- token files ------------------------------------------------------------------------

/// An integer .npy array of `dtype` ("<i8", "|u1", ...) and shape [rows, L] holding `values`.
void write_tokens(const std::string& path, const std::string& dtype, std::int64_t rows,
                  std::int64_t L, const std::vector<std::int64_t>& values) {
  NpyArray array;
  array.dtype = dtype;
  array.shape = {rows, L};
  const std::size_t size = array.itemsize();
  array.data.resize(values.size() * size);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto bits = static_cast<std::uint64_t>(values[i]);  // two's complement, little-endian
    for (std::size_t b = 0; b < size; ++b) {
      array.data[i * size + b] = static_cast<unsigned char>(bits >> (8 * b));
    }
  }
  write_npy(path, array);
}

// Documents that fit a sequence, written as rows of their bytes padded with -1, read back as
// the sequences make_sequences makes of the same documents: the same tokens and targets.
TEST(TokenFiles, RowsGiveTheSequencesTheirDocumentsGiveAsText) {
  const testing::TemporaryPath file("tokens.npy");
  for (const std::string dtype : {"<i8", "<i2", "|i1"}) {
    for (const std::int64_t T : {1, 5, 12}) {
      SCOPED_TRACE(dtype + ", T = " + std::to_string(T));
      const std::vector<std::string> documents = synthetic_documents(7, 2, T + 1, 11);
      std::vector<std::int64_t> values;
      std::int64_t largest = 0;
      for (const std::string& d : documents) {
        for (std::int64_t t = 0; t <= T; ++t) {
          const bool real = t < static_cast<std::int64_t>(d.size());
          // |i1 holds -128..127: its rows keep the bytes' low 7 bits.
          const std::int64_t byte = static_cast<unsigned char>(real ? d[t] : 0) &
                                    (dtype == "|i1" ? 0x7f : 0xff);
          values.push_back(real ? byte : -1);
          if (real) largest = std::max(largest, byte);
        }
      }
      write_tokens(file.str(), dtype, static_cast<std::int64_t>(documents.size()), T + 1, values);
      std::vector<std::string> expected = documents;
      if (dtype == "|i1") {
        for (std::string& d : expected) {
          for (char& c : d) c = static_cast<char>(c & 0x7f);
        }
      }
      const TokenFile read = read_token_sequences(file.str());
      const TokenSequences want = make_sequences(expected, T);
      EXPECT_EQ(read.sequences.length, T);
      EXPECT_EQ(read.sequences.tokens, want.tokens);
      EXPECT_EQ(read.sequences.targets, want.targets);
      EXPECT_EQ(read.largest, largest);
    }
  }
}

TEST(TokenFiles, UnsignedIdsAndFullRowsNeedNoPadding) {
  const testing::TemporaryPath file("tokens.npy");
  write_tokens(file.str(), "<u4", 2, 3, {7, 300000, 2, 0, 1, 65535});
  const TokenFile read = read_token_sequences(file.str());
  EXPECT_EQ(read.sequences.tokens, (std::vector<std::int32_t>{7, 300000, 0, 1}));
  EXPECT_EQ(read.sequences.targets, (std::vector<std::int32_t>{300000, 2, 1, 65535}));
  EXPECT_EQ(read.largest, 300000);
  const Dataset data = make_token_dataset(read.sequences, "tokens", read.largest + 1);
  EXPECT_EQ(data.num_classes, 300001);
  EXPECT_EQ(data.feature_dim(), 2);
}

// Every malformed file is refused naming the path and what is wrong with it.
TEST(TokenFiles, MalformedFilesAreRefusedSayingWhy) {
  const testing::TemporaryPath file("tokens.npy");
  const auto refusal = [&](const std::string& dtype, std::vector<std::int64_t> shape,
                           const std::vector<std::int64_t>& values) -> std::string {
    if (shape.size() == 2) {
      write_tokens(file.str(), dtype, shape[0], shape[1], values);
    } else {  // another rank: write the bytes of int64 values as they are
      NpyArray array{dtype, shape, false, {}};
      array.data.resize(values.size() * 8);
      std::memcpy(array.data.data(), values.data(), array.data.size());
      write_npy(file.str(), array);
    }
    try {
      read_token_sequences(file.str());
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(file.str()), std::string::npos) << what;
      return what;
    }
    ADD_FAILURE() << "accepted";
    return "";
  };
  EXPECT_NE(refusal("<f4", {1, 2}, {0, 0}).find("must be integers"), std::string::npos);
  EXPECT_NE(refusal("<i8", {4}, {1, 2, 3, 4}).find("[N, L]"), std::string::npos);
  EXPECT_NE(refusal("<i8", {3, 1}, {1, 2, 3}).find("[N, L]"), std::string::npos);
  EXPECT_NE(refusal("<i8", {2, 3}, {1, 2, 3, 4, -1, -1}).find("row 1 holds 1 token"),
            std::string::npos);
  EXPECT_NE(refusal("<i8", {1, 4}, {1, -1, 2, -1}).find("padding may only end a row"),
            std::string::npos);
  EXPECT_NE(refusal("<i8", {1, 2}, {1, std::int64_t{1} << 40}).find("too large"),
            std::string::npos);
}

}  // namespace
}  // namespace bigbatch
