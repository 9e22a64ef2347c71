// Bounded, read-only access to an input file through pread (docs/design.md §6: memory stays bounded,
// inputs are never modified). Every read is checked against the file size first.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace ckpt::io {

/// A read-only file opened by path. Throws BadInput{path, ...} when it cannot be opened
/// or when a read would run past its end.
class InputFile {
public:
    /// Open `path` read-only (O_CLOEXEC); BadInput when it cannot be opened or is not a regular file.
    explicit InputFile(const std::string& path);
    /// A byte range in memory, borrowed (the caller keeps it alive and unchanged while the
    /// InputFile is used); or, with `fill` set, `size` bytes that fill(offset, dst, len)
    /// copies on demand into dst (a GPU storage read in pieces by the Python package; it may
    /// be called from several threads and throws std::exception on failure, which reads
    /// report as BadInput).
    struct Span {
        const void* data = nullptr;
        uint64_t size = 0;
        std::function<void(uint64_t offset, void* dst, std::size_t len)> fill;
    };
    /// A memory-backed input: the concatenation of `spans`, named `name` in every error
    /// (the Python package serialises an object and compresses it without a file).
    InputFile(std::string name, std::vector<Span> spans);
    ~InputFile();   ///< closes the descriptor
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;

    const std::string& path() const { return path_; }
    uint64_t size() const { return size_; }   ///< bytes

    /// Read exactly `len` bytes at `offset` into `dst`. Throws BadInput naming `what`
    /// when [offset, offset+len) is not inside the file. Reads of less than 4 KiB go
    /// through one cached 64 KiB block (thread-safe): the many small records of a file of
    /// 10^5 tensors (zip headers, small tensors) then cost one system call per block.
    void read_at(uint64_t offset, void* dst, std::size_t len, const char* what) const;
    /// Same, returned as a byte string (callers bound `len` beforehand).
    std::string read_string(uint64_t offset, std::size_t len, const char* what) const;
    /// Little-endian integers at `offset` (bounds-checked as read_at).
    uint16_t u16(uint64_t offset, const char* what) const;
    uint32_t u32(uint64_t offset, const char* what) const;
    uint64_t u64(uint64_t offset, const char* what) const;
    /// True when [offset, offset+len) lies inside the file (overflow-safe).
    bool contains(uint64_t offset, uint64_t len) const {
        return offset <= size_ && len <= size_ - offset;
    }

private:
    void pread_all(uint64_t offset, char* dst, std::size_t len) const;  ///< throws BadInput on a read error
    void copy_memory(uint64_t offset, char* dst, std::size_t len) const;  ///< memory-backed reads
    std::string path_;
    int fd_ = -1;
    uint64_t size_ = 0;
    std::vector<Span> spans_;         ///< memory-backed: the bytes, in order (fd_ < 0)
    std::vector<uint64_t> starts_;    ///< offset of each span's first byte
    static constexpr std::size_t kBlock = 64 * 1024, kSmall = 4096;
    mutable std::mutex block_mutex_;
    mutable std::vector<char> block_;         ///< file bytes [block_offset_, + block_.size())
    mutable uint64_t block_offset_ = 0;
};

/// Sequential buffered reader over the byte range [begin, end) of an InputFile
/// (used by the unpickler; reads 64 KiB at a time, never the whole range).
class RangeReader {
public:
    /// BadInput when [begin, end) is not inside the file.
    RangeReader(const InputFile& f, uint64_t begin, uint64_t end);
    uint64_t position() const { return pos_; }             ///< absolute file offset
    uint64_t remaining() const { return end_ - pos_; }     ///< bytes left in the range
    /// Next byte; throws BadInput naming `what` at the end of the range.
    uint8_t byte(const char* what);
    /// Exactly n bytes (caller checks n against remaining() before allocating).
    void read(void* dst, std::size_t n, const char* what);
    std::string string(std::size_t n, const char* what);
    /// Bytes up to (not including) the next '\n', at most `max` bytes.
    std::string line(std::size_t max, const char* what);
    const InputFile& file() const { return f_; }

private:
    void fill();
    const InputFile& f_;
    uint64_t pos_, end_;
    std::vector<uint8_t> buf_;
    uint64_t buf_pos_ = 0;   ///< file offset of buf_[0]
};

}  // namespace ckpt::io
