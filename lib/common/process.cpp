#include "common/process.h"

#include <csignal>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ckpt {

void tool_process_setup() {
    std::signal(SIGXFSZ, SIG_IGN);
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

}  // namespace ckpt
