#include "common/file.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/error.h"

namespace ckpt {

namespace {
std::string errtext() { return std::strerror(errno); }
std::string dir_of(const std::string& p) {
    const auto s = p.rfind('/');
    return s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
}

/// Where a path points: device + inode when it exists, else the canonical folder + name.
struct FileId {
    bool exists = false, is_dir = false, is_special = false;
    dev_t dev = 0;
    ino_t ino = 0;
    std::string canon;
    explicit FileId(const std::string& p) {
        struct stat st {};
        if (::stat(p.c_str(), &st) == 0) {
            exists = true;
            is_dir = S_ISDIR(st.st_mode);
            is_special = !is_dir && !S_ISREG(st.st_mode);
            dev = st.st_dev;
            ino = st.st_ino;
            return;
        }
        char buf[PATH_MAX];
        const auto s = p.rfind('/');
        const std::string name = s == std::string::npos ? p : p.substr(s + 1);
        canon = ::realpath(dir_of(p).c_str(), buf) ? std::string(buf) + "/" + name : p;
    }
    bool same(const FileId& o) const {
        if (exists != o.exists) return false;
        return exists ? dev == o.dev && ino == o.ino : canon == o.canon;
    }
};
}  // namespace

void check_outputs(const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                   bool force) {
    std::vector<std::pair<std::string, FileId>> seen;
    for (const auto& out : outputs) {
        if (out.empty()) continue;
        const FileId id(out);
        for (const auto& in : inputs)
            if (id.same(FileId(in)))
                throw BadInput(out, "output is the input " + in + "; write the output to another path");
        for (const auto& [other, oid] : seen)
            if (id.same(oid)) throw BadInput(out, "also given for another output (" + other + "); give each output its own path");
        if (id.is_dir) throw BadInput(out, "output is a folder; give a file name");
        // the output is renamed into place: never over a device, pipe or socket (/dev/null)
        if (id.is_special) throw BadInput(out, "output is not a regular file; give a file name");
        if (id.exists && !force) throw BadInput(out, "output already exists; pass --force to overwrite it");
        seen.emplace_back(out, id);
    }
}

std::optional<uint64_t> hdf5_signature_at(int fd, uint64_t size) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    for (uint64_t off = 0; off + 8 <= size; off = off ? 2 * off : 512) {
        unsigned char b[8];
        const ssize_t n = ::pread(fd, b, 8, off_t(off));
        if (n != 8) throw std::system_error(n < 0 ? errno : EIO, std::generic_category(), "pread");
        if (std::memcmp(b, sig, 8) == 0) return off;
    }
    return std::nullopt;
}

bool readable_non_hdf5(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st {};
    bool result = false;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        try {
            result = !hdf5_signature_at(fd, uint64_t(st.st_size));
        } catch (const std::system_error&) {
            result = false;
        }
    }
    ::close(fd);
    return result;
}

void fsync_path(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(path + ": cannot open for fsync: " + errtext());
    const int r = ::fsync(fd);
    const std::string e = errtext();
    ::close(fd);
    if (r != 0 && errno != EINVAL) throw std::runtime_error(path + ": fsync failed: " + e);
}

AtomicOutput::AtomicOutput(std::string path) : path_(std::move(path)) {
    static std::atomic<int> counter{0};
    const auto s = path_.rfind('/');
    const std::string dir = s == std::string::npos ? "" : path_.substr(0, s + 1);
    const std::string base = s == std::string::npos ? path_ : path_.substr(s + 1);
    temp_ = dir + "." + base + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    temp_note(temp_, false);  // removed if a signal ends the process first (common/cleanup.h)
}

AtomicOutput::~AtomicOutput() {
    if (!done_) ::unlink(temp_.c_str());
    temp_forget(temp_);
}

void AtomicOutput::commit() {
    fsync_path(temp_);
    if (::rename(temp_.c_str(), path_.c_str()) != 0)
        throw std::runtime_error(path_ + ": cannot rename output into place: " + errtext());
    done_ = true;
    temp_forget(temp_);
    fsync_path(dir_of(path_));
}

void write_text_atomic(const std::string& path, const std::string& text) {
    AtomicOutput out(path);
    {
        FileWriter w(out.temp_path());
        w.write(text.data(), text.size());
        w.close();
    }
    out.commit();
}

FileWriter::FileWriter(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error(path + ": cannot create: " + errtext());
}

FileWriter::FileWriter(int fd, uint64_t size, std::string name) : path_(std::move(name)) {
    fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error(path_ + ": cannot use the descriptor: " + errtext());
    if (::ftruncate(fd_, off_t(size)) != 0) throw std::runtime_error(path_ + ": cannot size it: " + errtext());
}

FileWriter::~FileWriter() {
    if (fd_ >= 0) ::close(fd_);
}

void FileWriter::pwrite_now(uint64_t offset, const char* p, uint64_t n) {
    while (n > 0) {
        const ssize_t r = ::pwrite(fd_, p, n, off_t(offset));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) throw std::runtime_error(path_ + ": write failed: " + errtext());
        p += r;
        offset += uint64_t(r);
        n -= uint64_t(r);
    }
}

void FileWriter::flush() {
    if (buf_.empty()) return;
    const uint64_t start = off_ - buf_.size();
    std::vector<char> out;
    out.swap(buf_);  // empty even when the write fails
    pwrite_now(start, out.data(), out.size());
    out.clear();
    buf_.swap(out);  // keep the capacity
}

void FileWriter::pwrite(uint64_t offset, const void* data, uint64_t n) {
    flush();
    pwrite_now(offset, static_cast<const char*>(data), n);
}

void FileWriter::write(const void* data, uint64_t n) {
    const auto* p = static_cast<const char*>(data);
    if (buf_.size() + n > kBuffer || n >= kZeroSkip) flush();
    if (n >= kZeroSkip) {  // large pieces go straight to the file (no copy)
        pwrite_now(off_, p, n);
    } else {
        if (buf_.capacity() < kBuffer) buf_.reserve(kBuffer);
        buf_.insert(buf_.end(), p, p + n);
    }
    off_ += n;
}

void FileWriter::skip(uint64_t n) {
    if (n < kZeroSkip && buf_.size() + n <= kBuffer) {
        if (buf_.capacity() < kBuffer) buf_.reserve(kBuffer);
        buf_.insert(buf_.end(), std::size_t(n), '\0');
    } else {
        flush();   // a hole, which reads as zeros
    }
    off_ += n;
}

void FileWriter::close() {
    if (fd_ < 0) return;
    flush();
    if (::fsync(fd_) != 0) throw std::runtime_error(path_ + ": fsync failed: " + errtext());
    if (::close(fd_) != 0) { fd_ = -1; throw std::runtime_error(path_ + ": close failed: " + errtext()); }
    fd_ = -1;
}

}  // namespace ckpt
