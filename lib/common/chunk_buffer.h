// Buffers of a whole HDF5 chunk (1 MiB) or more, written soon after they are allocated. A
// dozen live at once (a container writer's or reader's, one per dataset), and the pages a
// process touches first cost it a fault and a clear each, a visible part of compress and
// restore on a VM (docs/benchmarks.md, "Measurements behind the code's choices"). So these
// buffers are whole 2 MiB blocks advised as transparent huge pages (one fault per block
// where THP is "madvise", Debian's default, or "always"; elsewhere plain pages), and a freed
// block is kept for the next one (the self-check's readers take the writer's), up to
// kPoolBlocks. Smaller requests go to operator new as usual.
#pragma once
#include <cstddef>
#include <utility>

namespace ckpt {

/// Blocks of `bytes` (rounded up to 2 MiB, 2 MiB-aligned, madvise(MADV_HUGEPAGE)): a kept
/// block of that size if any, else a new one. Throws std::bad_alloc.
void* chunk_block_alloc(std::size_t bytes);
/// Give back a block of chunk_block_alloc(bytes): kept (at most kPoolBlocks of 2 MiB,
/// 64 MiB), else freed. Thread-safe, as chunk_block_alloc.
void chunk_block_free(void* p, std::size_t bytes) noexcept;
constexpr std::size_t kChunkBlockMin = std::size_t(1) << 20;  ///< smaller requests: operator new
constexpr std::size_t kPoolBlocks = 32;

/// A growable byte buffer: from kChunkBlockMin bytes on, in a block (below, operator new).
/// Bytes are copied with memcpy (a std::vector with a custom allocator constructs them one
/// by one). Move-only.
class ChunkBuffer {
public:
    ChunkBuffer() = default;
    explicit ChunkBuffer(std::size_t n) { resize(n); }
    ChunkBuffer(ChunkBuffer&& o) noexcept { swap(o); }
    ChunkBuffer& operator=(ChunkBuffer&& o) noexcept {
        swap(o);
        return *this;
    }
    ChunkBuffer(const ChunkBuffer&) = delete;
    ChunkBuffer& operator=(const ChunkBuffer&) = delete;
    ~ChunkBuffer() { release(p_, cap_); }
    unsigned char* data() { return p_; }
    const unsigned char* data() const { return p_; }
    std::size_t size() const { return size_; }
    std::size_t capacity() const { return cap_; }
    bool empty() const { return size_ == 0; }
    /// Room for n bytes, keeping the contents. Throws std::bad_alloc.
    void reserve(std::size_t n);
    /// n bytes: the first min(size, n) kept, any new ones unspecified (the caller writes them).
    void resize(std::size_t n) {
        reserve(n);
        size_ = n;
    }
    /// Append n bytes from src (room grown as reserve, to at least twice the size).
    void append(const void* src, std::size_t n);
    void clear() { size_ = 0; }
    void swap(ChunkBuffer& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(size_, o.size_);
        std::swap(cap_, o.cap_);
    }

private:
    static void release(unsigned char* p, std::size_t cap) noexcept;
    unsigned char* p_ = nullptr;
    std::size_t size_ = 0, cap_ = 0;
};

}  // namespace ckpt
