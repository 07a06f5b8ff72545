#!/bin/sh
# write_corpus.sh FILE: the small text the CLI tests train the GPT on, in fortune(6)'s format:
# 40 documents of 1 to 9 sentences between "%" lines, so that some fit a sequence of 24
# positions and most are cut, and the sequences hold uneven counts of real targets.
awk 'BEGIN {
  for (d = 0; d < 40; ++d) {
    for (s = 0; s <= d % 9; ++s) printf "Sentence %d of document %d says little. ", s, d;
    printf "\n%%\n";
  }
}' > "$1"
