// Shared by the libFuzzer targets: the io readers, the container reader and the trace
// importer work on files, so each input is written to one memfd per process and its
// /proc/self/fd path is handed to the reader. Expected rejections (ckpt::BadInput,
// ckpt::CheckFailed) are fine; any other exception escaping is a finding (abort).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace fuzz {

/// Write data to this process's memfd (truncated first); returns its path.
inline const std::string& as_file(const uint8_t* data, size_t size) {
    static int fd = -1;
    static std::string path;
    if (fd < 0) {
        fd = memfd_create("ckptkit-fuzz", MFD_CLOEXEC);
        if (fd < 0) { std::perror("memfd_create"); std::abort(); }
        path = "/proc/self/fd/" + std::to_string(fd);
    }
    if (ftruncate(fd, 0) != 0) std::abort();
    size_t off = 0;
    while (off < size) {
        const ssize_t n = pwrite(fd, data + off, size - off, off_t(off));
        if (n <= 0) std::abort();
        off += size_t(n);
    }
    return path;
}

}  // namespace fuzz
