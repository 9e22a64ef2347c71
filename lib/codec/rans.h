// The entropy coder of vlog's code streams (formats/container.md, "vlog segments"): one
// segment = up to kSegment uint16 codes, coded on its own (its own frequency table), so
// segments decode in parallel and a reader seeks by segment.
//
// Symbols: a code x < 32 is its own symbol; a larger x with bit length nb (6..16) is symbol
// 32 + 4 (nb - 6) + (its two bits below the top bit), followed by its nb - 3 low bits raw
// (the "log bucket" alphabet of deflate/zstd length codes): 76 symbols.
// Coder (mode 3, format version 4): rANS with sixteen interleaved 32-bit states (code i
// uses state i mod 16), 12-bit frequencies and 16-bit renormalisation words (Duda 2013;
// the formulation and interleaving of F. Giesen's public-domain ryg_rans, its word-wise
// SIMD variant rans_word_sse41), so that a decoder gathers one table word per code and
// runs the 16 states as one AVX-512 vector or two AVX2 vectors. Raw bits go in a separate
// LSB-first stream. Older segments still decode: byte-wise rANS with 14-bit frequencies and
// four states (mode 2, format version 3) or two (mode 0, version 2). A segment whose rANS
// form is not smaller than its raw 2 bytes per code is stored raw.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ckpt::codec {

/// n codes stored as 2 little-endian bytes each (ChunkOut's codes, a raw segment) as
/// uint16 values, and back: a copy on a little-endian host.
inline void codes_from_bytes(const uint8_t* bytes, std::size_t n, uint16_t* codes) {
    if constexpr (std::endian::native == std::endian::little) {
        if (n) std::memcpy(codes, bytes, 2 * n);  // (no null pointer to memcpy, even for 0 bytes)
    } else {
        for (std::size_t i = 0; i < n; ++i) codes[i] = uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    }
}
inline void codes_to_bytes(const uint16_t* codes, std::size_t n, uint8_t* bytes) {
    if constexpr (std::endian::native == std::endian::little) {
        if (n) std::memcpy(bytes, codes, 2 * n);
    } else {
        for (std::size_t i = 0; i < n; ++i) bytes[2 * i] = uint8_t(codes[i]), bytes[2 * i + 1] = uint8_t(codes[i] >> 8);
    }
}

/// Append the coded form of codes[0..n) (one segment) to out, with `states` interleaved
/// rANS states: 16 (mode 3, format version 4), 4 or 2 (the byte-wise modes of versions 3
/// and 2), or 0 (the writer's default): 16, except that a segment of at most 4096 codes is
/// coded with 4 as well and the smaller form kept (mode 3's 48 more state bytes outweigh
/// its speed there). std::invalid_argument for another count. Deterministic, and the same
/// on every instruction-set level.
void segment_encode(const uint16_t* codes, std::size_t n, std::vector<uint8_t>& out, int states = 0);

/// segment_encode (default states) of two segments (a = 0, 1: codes[a][0..n[a]) appended
/// to *out[a]): the same bytes as two segment_encode calls. With AVX-512 and both longer
/// than 4096 codes, the two segments' rANS rounds run interleaved, so their dependency
/// chains overlap.
void segment_encode2(const uint16_t* const codes[2], const std::size_t n[2], std::vector<uint8_t>* const out[2]);

/// Decode the segment held in bytes [p, p + size) into codes[0..n). Throws
/// std::runtime_error when the bytes are not exactly one valid segment of n codes (bad
/// table, truncated or trailing bytes, a final rANS state other than the initial one).
void segment_decode(const uint8_t* p, std::size_t size, std::size_t n, uint16_t* codes);

/// segment_decode of two segments (a = 0, 1: bytes [p[a], p[a] + size[a]), n[a] codes into
/// codes[a]): the same codes, and the same first error, as segment_decode on segment 0 and
/// then on segment 1. With AVX-512 the two segments' rANS rounds run interleaved, so their
/// dependency chains overlap.
void segment_decode2(const uint8_t* const p[2], const std::size_t size[2], const std::size_t n[2], uint16_t* const codes[2]);

}  // namespace ckpt::codec
