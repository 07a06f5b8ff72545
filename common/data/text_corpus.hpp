// text_corpus.hpp: byte-level token data for chapter 08's GPT. A token is a byte
// (vocabulary 256), and a document is a piece of text between separators.
//
//   read_documents(path)        a fortune(6) file's documents, separated by lines that hold
//                               only "%" (else at blank lines); documents of fewer than two
//                               bytes are dropped
//   make_sequences(docs, T)     padded sequences of T positions (position t: byte t, target
//                               byte t + 1); a document longer than T + 1 bytes is cut into
//                               pieces of at most T + 1 bytes that share their boundary byte
//   read_token_sequences(path)  a .npy file of integers [N, L], real tokens (>= 0) then
//                               padding (negative): row i is one sequence of L - 1 positions
// Padding is token 0 with target kIgnoredLabel (dataset.hpp), which the loss counts for
// nothing.
// Why and how: docs/internals.md#commondatatext_corpushpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/data/dataset.hpp"

namespace bigbatch {

/// Padded sequences of byte tokens: N sequences of `length` positions, row-major.
struct TokenSequences {
  std::int64_t length = 0;            ///< T, positions per sequence
  std::vector<std::int32_t> tokens;   ///< [N, T] bytes, 0 on padding
  std::vector<std::int32_t> targets;  ///< [N, T] the next byte, kIgnoredLabel on padding

  /// N, the number of sequences.
  std::int64_t count() const {
    return length == 0 ? 0 : static_cast<std::int64_t>(tokens.size()) / length;
  }
  /// The targets that are not padding, over all sequences or over sequences [first, end).
  std::int64_t real_targets(std::int64_t first = 0, std::int64_t end = -1) const;
  /// The share of positions that are padding.
  double padding_fraction() const;
};

/// The documents of a text file (the format above). Throws std::runtime_error naming the
/// path when it cannot be read or holds no document of two bytes or more.
std::vector<std::string> read_documents(const std::string& path);

/// What read_token_sequences returns: the sequences and the largest token in them.
struct TokenFile {
  TokenSequences sequences;   ///< N sequences of L - 1 positions
  std::int64_t largest = 0;   ///< the largest token id, so the vocabulary is at least largest + 1
};

/// The sequences of a .npy token file (the format above). Throws std::runtime_error naming
/// the path and what is wrong: not an integer [N, L] array with L >= 2, a row of fewer than
/// two real tokens (no target), a real token after padding, a token too large for int32.
TokenFile read_token_sequences(const std::string& path);

/// Splits text (the format above) into documents.
std::vector<std::string> split_documents(const std::string& text);

/// Every document as padded sequences of `length` positions (above), in document order.
/// Throws std::invalid_argument for a length below 1.
TokenSequences make_sequences(const std::vector<std::string>& documents, std::int64_t length);

/// The sequences as a token Dataset (dataset.hpp): features i32 [N, T] the tokens, labels
/// i32 [N, T] the targets, num_classes `vocabulary` (256: bytes), in host memory
/// (MemoryCategory::host_data). Throws std::invalid_argument for an empty `sequences`.
Dataset make_token_dataset(const TokenSequences& sequences, const std::string& name,
                           std::int64_t vocabulary = 256);

/// `count` documents of random bytes, each of a length drawn uniformly from [min_length,
/// max_length], from the counter-based RNG: test data with uneven lengths.
std::vector<std::string> synthetic_documents(std::int64_t count, std::int64_t min_length,
                                             std::int64_t max_length, std::uint64_t seed);

}  // namespace bigbatch
