// Shared by the libFuzzer targets: the io readers, the container reader and the trace
// importer work on files, so each input is written to one scratch file per process and its
// path is handed to the reader. The scratch file is a real file (in $TMPDIR, else /dev/shm,
// else /tmp), not a memfd: HDF5 resolves the path with realpath(), which fails on
// /proc/self/fd/N of a memfd ("/memfd:... (deleted)"), so the container target would reject
// every input at H5Fopen. Expected rejections (ckpt::BadInput, ckpt::CheckFailed) are fine;
// any other exception escaping is a finding (abort).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/checkpoint.h"

namespace fuzz {

/// Write data to this process's scratch file (truncated first); returns its path. The file
/// is removed at normal exit; a crashing input leaves it behind (ckptkit-fuzz-PID).
inline const std::string& as_file(const uint8_t* data, size_t size) {
    static int fd = -1;
    static std::string path;
    if (fd < 0) {
        const char* tmp = std::getenv("TMPDIR");
        std::string dir = tmp && *tmp ? tmp : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        path = dir + "/ckptkit-fuzz-" + std::to_string(getpid());
        fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) { std::perror(path.c_str()); std::abort(); }
        std::atexit([] { unlink(path.c_str()); });
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

/// Reader limits for the torch-file targets: small enough that one input stays fast
/// (4 MiB pickle, 2^20 objects, 2^16 memo entries).
inline ckpt::Limits small_limits() {
    ckpt::Limits lim;
    lim.max_pickle_bytes = 1 << 22;
    lim.max_objects = 1 << 20;
    lim.max_memo_entries = 1 << 16;
    return lim;
}

}  // namespace fuzz
