// Buffers of a whole HDF5 chunk (1 MiB) or more, written soon after they are allocated.
// A dozen live at once (a container writer's or reader's, one per dataset), and the
// pages a process touches first cost it a fault and a clear each; on the bench machine,
// a VM, those were ~10% of compress and restore (docs/benchmarks.md, round 16). So these
// buffers are whole 2 MiB blocks advised as transparent huge pages (one fault per block
// where THP is "madvise", Debian's default, or "always"; elsewhere plain pages), and a
// freed block is kept for the next one (the self-check's readers take the writer's), up
// to kPoolBlocks. Smaller requests go to operator new as usual.
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace ckpt {

/// Blocks of `bytes` (rounded up to 2 MiB, 2 MiB-aligned, madvise(MADV_HUGEPAGE)): a kept
/// block of that size if any, else a new one. Throws std::bad_alloc.
void* chunk_block_alloc(std::size_t bytes);
/// Give back a block of chunk_block_alloc(bytes): kept (at most kPoolBlocks of 2 MiB,
/// 64 MiB), else freed. Thread-safe, as chunk_block_alloc.
void chunk_block_free(void* p, std::size_t bytes) noexcept;
constexpr std::size_t kChunkBlockMin = std::size_t(1) << 20;  ///< smaller requests: operator new
constexpr std::size_t kPoolBlocks = 32;

/// std::allocator for ChunkVector: requests of kChunkBlockMin bytes or more are blocks.
template <class T>
struct ChunkAllocator {
    using value_type = T;
    ChunkAllocator() = default;
    template <class U>
    ChunkAllocator(const ChunkAllocator<U>&) noexcept {}
    T* allocate(std::size_t n) {
        if (n > std::size_t(-1) / 2 / sizeof(T)) throw std::bad_alloc();
        const std::size_t bytes = n * sizeof(T);
        return static_cast<T*>(bytes < kChunkBlockMin ? ::operator new(bytes) : chunk_block_alloc(bytes));
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if (n * sizeof(T) < kChunkBlockMin) ::operator delete(p);
        else chunk_block_free(p, n * sizeof(T));
    }
    template <class U>
    bool operator==(const ChunkAllocator<U>&) const noexcept { return true; }
};

/// A std::vector of a chunk's bytes (or more) in blocks (ChunkAllocator).
template <class T>
using ChunkVector = std::vector<T, ChunkAllocator<T>>;

}  // namespace ckpt
