#!/usr/bin/env bash
# Stages the test and benchmark libraries a GPU machine without package access needs.
#
# Usage: scripts/stage-gpu-deps.sh [PREFIX]      (default: build-deps)
#
# Copies GoogleTest, Google Benchmark, zlib, CLI11 and nlohmann-json (headers, libraries,
# CMake package files) from this machine's Debian packages into PREFIX, keeping their
# relative layout, so that
# scripts/gpu-check.sh can build the project on a machine that has CUDA but cannot
# install packages: carry PREFIX there and pass it as BIGBATCH_DEPS_PREFIX.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-build-deps}"
scripts/install-deps.sh

multiarch=lib/x86_64-linux-gnu
rm -rf "$prefix"
mkdir -p "$prefix/include" "$prefix/$multiarch/cmake" "$prefix/share/cmake"
cp -r /usr/include/gtest /usr/include/gmock /usr/include/benchmark /usr/include/CLI \
      /usr/include/nlohmann "$prefix/include/"
cp -r /usr/share/cmake/nlohmann_json "$prefix/share/cmake/"
cp /usr/include/zlib.h /usr/include/zconf.h "$prefix/include/"
cp -P /usr/$multiarch/libgtest*.a /usr/$multiarch/libgmock*.a "$prefix/$multiarch/"
cp -P /usr/$multiarch/libbenchmark* /usr/$multiarch/libz.a "$prefix/$multiarch/"
cp -r /usr/$multiarch/cmake/GTest /usr/$multiarch/cmake/benchmark "$prefix/$multiarch/cmake/"
du -sh "$prefix"
