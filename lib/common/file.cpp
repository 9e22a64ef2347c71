#include "common/file.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>


namespace ckpt {

namespace {
std::string errtext() { return std::strerror(errno); }
std::string dir_of(const std::string& p) {
    const auto s = p.rfind('/');
    return s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
}
}  // namespace

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
}

AtomicOutput::~AtomicOutput() {
    if (!done_) ::unlink(temp_.c_str());
}

void AtomicOutput::commit() {
    fsync_path(temp_);
    if (::rename(temp_.c_str(), path_.c_str()) != 0)
        throw std::runtime_error(path_ + ": cannot rename output into place: " + errtext());
    done_ = true;
    fsync_path(dir_of(path_));
}

FileWriter::FileWriter(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error(path + ": cannot create: " + errtext());
}

FileWriter::~FileWriter() {
    if (fd_ >= 0) ::close(fd_);
}

void FileWriter::pwrite(uint64_t offset, const void* data, uint64_t n) {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t r = ::pwrite(fd_, p, n, off_t(offset));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) throw std::runtime_error(path_ + ": write failed: " + errtext());
        p += r;
        offset += uint64_t(r);
        n -= uint64_t(r);
    }
}

void FileWriter::write(const void* data, uint64_t n) {
    pwrite(off_, data, n);
    off_ += n;
}

void FileWriter::close() {
    if (fd_ < 0) return;
    if (::fsync(fd_) != 0) throw std::runtime_error(path_ + ": fsync failed: " + errtext());
    if (::close(fd_) != 0) { fd_ = -1; throw std::runtime_error(path_ + ": close failed: " + errtext()); }
    fd_ = -1;
}

}  // namespace ckpt
