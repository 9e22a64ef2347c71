#include "container/shuffle.h"

#include <bit>
#include <cstdint>
#include <cstring>

namespace ckpt::container {

namespace {

// 4-byte elements (/raw): whole words in, four byte runs out (and back); -O3 and the AVX2
// clone let GCC vectorise both with packs / unpacks.
__attribute__((target_clones("avx2", "default"))) void shuffle4(const unsigned char* s, unsigned char* d, std::size_t n) {
    unsigned char *d0 = d, *d1 = d + n, *d2 = d + 2 * n, *d3 = d + 3 * n;
    for (std::size_t i = 0; i < n; ++i) {
        uint32_t w;
        std::memcpy(&w, s + 4 * i, 4);  // byte k of the element is bits 8k.. on this little-endian host
        d0[i] = uint8_t(w);
        d1[i] = uint8_t(w >> 8);
        d2[i] = uint8_t(w >> 16);
        d3[i] = uint8_t(w >> 24);
    }
}
__attribute__((target_clones("avx2", "default"))) void unshuffle4(const unsigned char* s, unsigned char* d, std::size_t n) {
    const unsigned char *s0 = s, *s1 = s + n, *s2 = s + 2 * n, *s3 = s + 3 * n;
    for (std::size_t i = 0; i < n; ++i) {
        const uint32_t w = uint32_t(s0[i]) | uint32_t(s1[i]) << 8 | uint32_t(s2[i]) << 16 | uint32_t(s3[i]) << 24;
        std::memcpy(d + 4 * i, &w, 4);
    }
}

}  // namespace

void shuffle_bytes(const unsigned char* src, unsigned char* dst, std::size_t nbytes, std::size_t size) {
    if (nbytes == 0) return;  // (empty buffers may be null: no memcpy)
    const std::size_t n = size ? nbytes / size : 0;
    if (size <= 1 || n <= 1) { std::memcpy(dst, src, nbytes); return; }
    if (size == 4 && std::endian::native == std::endian::little) {
        shuffle4(src, dst, n);
    } else {
        for (std::size_t k = 0; k < size; ++k)
            for (std::size_t i = 0; i < n; ++i) dst[k * n + i] = src[i * size + k];
    }
    std::memcpy(dst + size * n, src + size * n, nbytes - size * n);  // the leftover bytes, at the end
}

void unshuffle_bytes(const unsigned char* src, unsigned char* dst, std::size_t nbytes, std::size_t size) {
    if (nbytes == 0) return;  // (empty buffers may be null: no memcpy)
    const std::size_t n = size ? nbytes / size : 0;
    if (size <= 1 || n <= 1) { std::memcpy(dst, src, nbytes); return; }
    if (size == 4 && std::endian::native == std::endian::little) {
        unshuffle4(src, dst, n);
    } else {
        for (std::size_t k = 0; k < size; ++k)
            for (std::size_t i = 0; i < n; ++i) dst[i * size + k] = src[k * n + i];
    }
    std::memcpy(dst + size * n, src + size * n, nbytes - size * n);
}

}  // namespace ckpt::container
