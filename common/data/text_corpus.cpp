#include "common/data/text_corpus.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "common/check.hpp"
#include "common/format.hpp"
#include "common/memory.hpp"
#include "common/data/dataset.hpp"
#include "common/io/npy.hpp"
#include "common/rng.hpp"

namespace bigbatch {
namespace {

/// The lines of `text`, each with its newline (the last one may lack it).
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t newline = text.find('\n', begin);
    const std::size_t end = newline == std::string::npos ? text.size() : newline + 1;
    lines.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return lines;
}

/// A line holding only `marker` (and its newline).
bool is_line(const std::string& line, const std::string& marker) {
  return line == marker || line == marker + "\n";
}

}  // namespace

std::int64_t TokenSequences::real_targets(std::int64_t first, std::int64_t end) const {
  if (end < 0) end = count();
  std::int64_t real = 0;
  for (std::int64_t k = first * length; k < end * length; ++k) {
    real += targets[static_cast<std::size_t>(k)] != kIgnoredLabel ? 1 : 0;
  }
  return real;
}

double TokenSequences::padding_fraction() const {
  if (targets.empty()) return 0.0;
  return 1.0 - static_cast<double>(real_targets()) / static_cast<double>(targets.size());
}

TokenFile read_token_sequences(const std::string& path) {
  const auto fail = [&path](const std::string& what) {
    throw std::runtime_error(path + ": " + what);
  };
  const NpyArray array = read_npy(path);
  if ((array.kind() != 'i' && array.kind() != 'u') || array.itemsize() > 8) {
    fail("tokens must be integers (int8..int64, uint8..uint64), got '" + array.dtype + "'");
  }
  if (array.shape.size() != 2 || array.shape[0] < 1 || array.shape[1] < 2) {
    fail("tokens must be [N, L] with N >= 1 sequences of L >= 2 tokens (a target needs a "
         "next token), got shape " + shape_string(array.shape));
  }
  const std::int64_t rows = array.shape[0], L = array.shape[1], T = L - 1;
  const std::vector<NpyInteger> elements = integer_elements(array);
  constexpr auto kLargest =
      static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max() - 1);
  TokenFile file;
  TokenSequences& s = file.sequences;
  s.length = T;
  s.tokens.assign(static_cast<std::size_t>(rows * T), 0);
  s.targets.assign(static_cast<std::size_t>(rows * T), kIgnoredLabel);
  for (std::int64_t row = 0; row < rows; ++row) {
    const NpyInteger* element = elements.data() + row * L;
    std::int64_t real = 0;  // the row's real tokens: those before its first negative value
    while (real < L && !element[real].negative) ++real;
    const auto where = [row] { return " of row " + std::to_string(row); };
    for (std::int64_t t = real; t < L; ++t) {
      if (!element[t].negative) {
        fail("token " + std::to_string(element[t].magnitude) + " at position " +
             std::to_string(t) + where() + " follows padding (a negative value at position " +
             std::to_string(real) + "): padding may only end a row");
      }
    }
    if (real < 2) {
      fail("row " + std::to_string(row) + " holds " + std::to_string(real) +
           (real == 1 ? " token" : " tokens") + " before its padding: no target (it needs two)");
    }
    for (std::int64_t t = 0; t < real; ++t) {
      if (element[t].magnitude > kLargest) {
        fail("token " + std::to_string(element[t].magnitude) + " at position " +
             std::to_string(t) + where() + " is too large for an int32 token id");
      }
      file.largest = std::max(file.largest, static_cast<std::int64_t>(element[t].magnitude));
    }
    for (std::int64_t t = 0; t + 1 < real; ++t) {
      const auto at = static_cast<std::size_t>(row * T + t);
      s.tokens[at] = static_cast<std::int32_t>(element[t].magnitude);
      s.targets[at] = static_cast<std::int32_t>(element[t + 1].magnitude);
    }
  }
  return file;
}

std::vector<std::string> split_documents(const std::string& text) {
  const std::vector<std::string> lines = lines_of(text);
  bool fortune_format = false;
  for (const std::string& line : lines) fortune_format = fortune_format || is_line(line, "%");
  std::vector<std::string> documents(1);
  for (const std::string& line : lines) {
    const bool separator = fortune_format ? is_line(line, "%") : is_line(line, "");
    if (separator) {
      documents.emplace_back();
    } else {
      documents.back() += line;
    }
  }
  std::vector<std::string> kept;
  for (std::string& document : documents) {
    if (document.size() >= 2) kept.push_back(std::move(document));
  }
  return kept;
}

std::vector<std::string> read_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open the text file");
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<std::string> documents = split_documents(text.str());
  if (documents.empty()) {
    throw std::runtime_error(path + ": holds no document of two bytes or more");
  }
  return documents;
}

Dataset make_token_dataset(const TokenSequences& sequences, const std::string& name,
                           std::int64_t vocabulary) {
  const std::int64_t n = sequences.count(), T = sequences.length;
  BIGBATCH_CHECK(n > 0, "make_token_dataset: '", name, "' holds no sequence");
  Dataset data;
  data.features = Tensor({n, T}, DType::i32, Device::cpu(), MemoryCategory::host_data);
  data.labels = Tensor({n, T}, DType::i32, Device::cpu(), MemoryCategory::host_data);
  std::copy(sequences.tokens.begin(), sequences.tokens.end(), data.features.data<std::int32_t>());
  std::copy(sequences.targets.begin(), sequences.targets.end(),
            data.labels.data<std::int32_t>());
  data.num_classes = vocabulary;
  data.name = name;
  return data;
}

TokenSequences make_sequences(const std::vector<std::string>& documents, std::int64_t length) {
  BIGBATCH_CHECK(length >= 1, "make_sequences: sequences need at least one position, got ",
                 length);
  // Counted first: every piece takes `length` positions however short its document, so a
  // long --seq-len on short documents can ask for more than the machine holds.
  std::size_t positions = 0;
  for (const std::string& document : documents) {
    if (document.size() < 2) continue;
    const std::size_t pieces = (document.size() - 2) / static_cast<std::size_t>(length) + 1;
    std::size_t added = 0;
    if (__builtin_mul_overflow(pieces, static_cast<std::size_t>(length), &added) ||
        __builtin_add_overflow(positions, added, &positions)) {
      positions = std::numeric_limits<std::size_t>::max();
      break;
    }
  }
  const std::size_t machine = host_memory_bytes();
  // A token and a target, held twice while make_token_dataset copies them into tensors.
  constexpr std::size_t kPositionBytes = 4 * sizeof(std::int32_t);
  if (positions > machine / kPositionBytes) {
    const std::size_t bytes = positions > std::numeric_limits<std::size_t>::max() / kPositionBytes
                                  ? std::numeric_limits<std::size_t>::max()
                                  : positions * kPositionBytes;
    throw OutOfMemoryError("cutting " + std::to_string(documents.size()) +
                               " documents into sequences of " + std::to_string(length) +
                               " positions, each piece padded to the full length, takes " +
                               format_bytes_asked(bytes) + " of tokens and targets (twice, "
                               "while they become tensors), more than this machine's " +
                               format_bytes(machine),
                           bytes, MemoryCategory::host_data);
  }
  TokenSequences s;
  s.length = length;
  s.tokens.reserve(positions);
  s.targets.reserve(positions);
  for (const std::string& document : documents) {
    const auto size = static_cast<std::int64_t>(document.size());
    // Pieces of up to length + 1 bytes starting every `length` bytes: piece p covers bytes
    // [p T, min(p T + T, L - 1)] and its targets are the bytes after each.
    for (std::int64_t start = 0; start + 1 < size; start += length) {
      for (std::int64_t t = 0; t < length; ++t) {
        const bool real = start + t + 1 < size;
        const auto byte = [&](std::int64_t k) {
          return static_cast<std::int32_t>(static_cast<unsigned char>(document[k]));
        };
        s.tokens.push_back(real ? byte(start + t) : 0);
        s.targets.push_back(real ? byte(start + t + 1) : kIgnoredLabel);
      }
    }
  }
  return s;
}

std::vector<std::string> synthetic_documents(std::int64_t count, std::int64_t min_length,
                                             std::int64_t max_length, std::uint64_t seed) {
  BIGBATCH_CHECK(count >= 0 && 0 <= min_length && min_length <= max_length,
                 "synthetic_documents: need count >= 0 and 0 <= min_length <= max_length");
  std::vector<std::string> documents;
  std::uint64_t index = 0;
  for (std::int64_t d = 0; d < count; ++d) {
    const auto span = static_cast<double>(max_length - min_length + 1);
    const std::int64_t size =
        min_length + static_cast<std::int64_t>(random_uniform(seed, 0, index++) * span);
    std::string document;
    for (std::int64_t k = 0; k < size; ++k) {
      document.push_back(static_cast<char>(random_bits(seed, 1, index++) & 0xffu));
    }
    documents.push_back(std::move(document));
  }
  return documents;
}

}  // namespace bigbatch
