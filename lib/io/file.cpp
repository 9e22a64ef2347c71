#include "io/file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/error.h"

namespace ckpt::io {

InputFile::InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw BadInput(path, fmt::format("cannot open: {}", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd_);
        fd_ = -1;
        throw BadInput(path, "not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::InputFile(std::string name, std::vector<Span> spans) : path_(std::move(name)) {
    for (const Span& sp : spans) {
        if (sp.size == 0) continue;
        starts_.push_back(size_);
        spans_.push_back(sp);
        size_ += sp.size;
    }
}

void InputFile::copy_memory(uint64_t offset, char* p, std::size_t len) const {
    // the span holding `offset`: the last one starting at or before it
    std::size_t i = std::size_t(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
    while (len > 0) {
        const uint64_t in = offset - starts_[i];
        const std::size_t k = std::size_t(std::min<uint64_t>(len, spans_[i].size - in));
        if (!spans_[i].fill) {
            std::memcpy(p, static_cast<const char*>(spans_[i].data) + in, k);
        } else {
            try {
                spans_[i].fill(in, p, k);
            } catch (const std::exception& e) {
                throw BadInput(path_, fmt::format("reading {} bytes at offset {}: {}", k, offset, e.what()));
            }
        }
        p += k;
        offset += k;
        len -= k;
        ++i;
    }
}

InputFile::~InputFile() {
    if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* dst, std::size_t len, const char* what) const {
    if (!contains(offset, len))
        throw BadInput(path_, fmt::format("{} at offset {} ({} bytes) runs past end of file ({} bytes)",
                                          what, offset, len, size_));
    auto* p = static_cast<char*>(dst);
    if (len == 0) return;
    if (fd_ < 0) return copy_memory(offset, p, len);   // memory-backed (bounds checked above)
    if (len >= kSmall) return pread_all(offset, p, len);
    std::lock_guard<std::mutex> lock(block_mutex_);
    if (offset < block_offset_ || offset + len > block_offset_ + block_.size()) {  // load the block from offset
        block_.resize(std::size_t(std::min<uint64_t>(kBlock, size_ - offset)));
        block_offset_ = offset;
        try {
            pread_all(offset, block_.data(), block_.size());
        } catch (...) {
            block_.clear();
            throw;
        }
    }
    std::memcpy(p, block_.data() + (offset - block_offset_), len);
}

void InputFile::pread_all(uint64_t offset, char* p, std::size_t len) const {
    while (len > 0) {
        ssize_t n = ::pread(fd_, p, len, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            throw BadInput(path_, fmt::format("read error at offset {}: {}", offset,
                                              n < 0 ? std::strerror(errno) : "unexpected end of file"));
        p += n;
        offset += static_cast<uint64_t>(n);
        len -= static_cast<std::size_t>(n);
    }
}

std::string InputFile::read_string(uint64_t offset, std::size_t len, const char* what) const {
    if (!contains(offset, len)) read_at(offset, nullptr, len, what);   // throws the bounds error
    std::string s(len, '\0');
    read_at(offset, s.data(), len, what);
    return s;
}

uint16_t InputFile::u16(uint64_t offset, const char* what) const {
    uint8_t b[2];
    read_at(offset, b, 2, what);
    return static_cast<uint16_t>(b[0] | (b[1] << 8));
}
uint32_t InputFile::u32(uint64_t offset, const char* what) const {
    uint8_t b[4];
    read_at(offset, b, 4, what);
    return uint32_t(b[0]) | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24);
}
uint64_t InputFile::u64(uint64_t offset, const char* what) const {
    return uint64_t(u32(offset, what)) | (uint64_t(u32(offset + 4, what)) << 32);
}

RangeReader::RangeReader(const InputFile& f, uint64_t begin, uint64_t end)
    : f_(f), pos_(begin), end_(end), buf_pos_(begin) {
    if (begin > end || !f.contains(begin, end - begin))
        throw BadInput(f.path(), fmt::format("byte range [{}, {}) is outside the file ({} bytes)",
                                             begin, end, f.size()));
}

void RangeReader::fill() {
    constexpr uint64_t kChunk = 64 * 1024;
    uint64_t n = std::min<uint64_t>(kChunk, end_ - pos_);
    buf_.resize(n);
    f_.read_at(pos_, buf_.data(), n, "data");
    buf_pos_ = pos_;
}

uint8_t RangeReader::byte(const char* what) {
    if (pos_ >= end_)
        throw BadInput(f_.path(), fmt::format("{} truncated at offset {}", what, pos_));
    if (pos_ < buf_pos_ || pos_ >= buf_pos_ + buf_.size()) fill();
    return buf_[pos_++ - buf_pos_];
}

void RangeReader::read(void* dst, std::size_t n, const char* what) {
    if (n > remaining())
        throw BadInput(f_.path(), fmt::format("{} truncated at offset {}: needs {} bytes, {} left",
                                              what, pos_, n, remaining()));
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
        if (pos_ < buf_pos_ || pos_ >= buf_pos_ + buf_.size()) fill();
        std::size_t avail = static_cast<std::size_t>(buf_pos_ + buf_.size() - pos_);
        std::size_t k = std::min(avail, n);
        std::memcpy(p, buf_.data() + (pos_ - buf_pos_), k);
        p += k;
        pos_ += k;
        n -= k;
    }
}

std::string RangeReader::string(std::size_t n, const char* what) {
    if (n > remaining()) read(nullptr, n, what);   // throws the truncation error
    std::string s(n, '\0');
    read(s.data(), n, what);
    return s;
}

std::string RangeReader::line(std::size_t max, const char* what) {
    std::string s;
    for (;;) {
        uint8_t c = byte(what);
        if (c == '\n') return s;
        if (s.size() >= max)
            throw BadInput(f_.path(), fmt::format("{} line longer than {} bytes at offset {}", what, max, pos_));
        s.push_back(static_cast<char>(c));
    }
}

}  // namespace ckpt::io
