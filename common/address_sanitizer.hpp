// address_sanitizer.hpp: a hot loop's memory checked once per call under AddressSanitizer.
//
// A function marked BIGBATCH_CHECKED_BY_SPANS is not instrumented; before its loop it calls
// require_addressable_span on every span of memory it reads or writes, and the spans cover
// every byte the loop touches. An access out of bounds, or to freed memory, is reported as
// AddressSanitizer reports any other (its own report, with the stack; the program aborts),
// once per call instead of per access. Outside AddressSanitizer both compile to nothing.
//
// Why and how: docs/internals.md#commonaddress_sanitizerhpp
#pragma once

#include <cstddef>
#include <cstdint>

// BIGBATCH_ADDRESS_SANITIZER: 1 under AddressSanitizer (GCC says so by a macro, clang by
// __has_feature), else 0.
#if defined(__SANITIZE_ADDRESS__)
#define BIGBATCH_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BIGBATCH_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef BIGBATCH_ADDRESS_SANITIZER
#define BIGBATCH_ADDRESS_SANITIZER 0
#endif

#if BIGBATCH_ADDRESS_SANITIZER
#include <sanitizer/asan_interface.h>

#include <cstdlib>

/// The function's own loads and stores are not instrumented: it checks its spans itself.
#define BIGBATCH_CHECKED_BY_SPANS __attribute__((no_sanitize_address))
#else
#define BIGBATCH_CHECKED_BY_SPANS
#endif

namespace bigbatch {

/// Under AddressSanitizer: reports and aborts unless every byte from `first` to the end of
/// the last of `rows` rows (`row_bytes` each, `stride_bytes` apart) may be accessed. The
/// span includes the bytes between rows, which belong to the same matrix or packed panel:
/// one check of the shadow memory, where a check per row would cost a call per row.
#if BIGBATCH_ADDRESS_SANITIZER
__attribute__((noinline)) inline void require_addressable_span(const void* first,
                                                               std::int64_t rows,
                                                               std::int64_t row_bytes,
                                                               std::int64_t stride_bytes) {
  if (rows <= 0 || row_bytes <= 0) return;
  const auto bytes = static_cast<std::size_t>((rows - 1) * stride_bytes + row_bytes);
  if (const void* bad = __asan_region_is_poisoned(const_cast<void*>(first), bytes)) {
    // An instrumented read of the first bad byte (this function is instrumented, and not
    // inlined into its uninstrumented caller): AddressSanitizer's report names the
    // allocation it is outside of, or the free that released it, and ends the program.
    static_cast<void>(*static_cast<const volatile char*>(bad));
    std::abort();  // halt_on_error=0 would come back here
  }
}
#else
inline void require_addressable_span(const void*, std::int64_t, std::int64_t, std::int64_t) {}
#endif

}  // namespace bigbatch
