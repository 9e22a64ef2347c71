#include "common/chunk_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

namespace ckpt {

namespace {
constexpr std::size_t kHuge = std::size_t(2) << 20;
std::size_t block_len(std::size_t bytes) { return (bytes + kHuge - 1) / kHuge * kHuge; }

/// Kept 2 MiB blocks (larger ones are freed: none is asked for by the formats we write).
struct Pool {
    std::mutex m;
    std::vector<void*> kept;
    ~Pool() {
        for (void* p : kept) std::free(p);
    }
};
Pool& pool() {
    static Pool p;
    return p;
}
}  // namespace

void* chunk_block_alloc(std::size_t bytes) {
    const std::size_t len = block_len(bytes);
    if (len == kHuge) {
        Pool& p = pool();
        std::lock_guard<std::mutex> lock(p.m);
        if (!p.kept.empty()) {
            void* b = p.kept.back();
            p.kept.pop_back();
            return b;
        }
    }
    void* b = std::aligned_alloc(kHuge, len);
    if (!b) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(b, len, MADV_HUGEPAGE);  // advice only: a failure leaves plain pages
#endif
    return b;
}

void chunk_block_free(void* b, std::size_t bytes) noexcept {
    if (block_len(bytes) == kHuge) {
        Pool& p = pool();
        std::lock_guard<std::mutex> lock(p.m);
        if (p.kept.size() < kPoolBlocks) {
            try {
                p.kept.push_back(b);
                return;
            } catch (...) {  // no room to keep it: free it
            }
        }
    }
    std::free(b);
}

void ChunkBuffer::release(unsigned char* p, std::size_t cap) noexcept {
    if (!p) return;
    if (cap < kChunkBlockMin) ::operator delete(p);
    else chunk_block_free(p, cap);
}

void ChunkBuffer::reserve(std::size_t n) {
    if (n <= cap_) return;
    if (n > std::size_t(-1) / 4) throw std::bad_alloc();
    auto* q = static_cast<unsigned char*>(n < kChunkBlockMin ? ::operator new(n) : chunk_block_alloc(n));
    if (size_) std::memcpy(q, p_, size_);
    release(p_, cap_);
    p_ = q;
    cap_ = n;
}

void ChunkBuffer::append(const void* src, std::size_t n) {
    if (size_ + n > cap_) reserve(std::max(size_ + n, 2 * size_));
    if (n) std::memcpy(p_ + size_, src, n);
    size_ += n;
}

}  // namespace ckpt
