#include "common/chunk_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>

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

}  // namespace ckpt
