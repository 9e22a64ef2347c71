// The process settings every tool and the package's helper (python/ckptkit/reader_main.cpp)
// start with.
#pragma once

namespace ckpt {

/// SIGXFSZ ignored (a file-size limit becomes a write error, exit 2, not a kill), and on
/// glibc large buffers kept in the heap for reuse: by default glibc maps each chunk buffer
/// (MBs, allocated per parameter and chunk) afresh and unmaps it on free, so every chunk
/// paid its page faults and the kernel's zeroing again (3-4x the faults; restore ~0.84x CPU
/// without them, docs/benchmarks.md). Memory is returned at exit; peak RSS is unchanged in
/// kind.
void tool_process_setup();

}  // namespace ckpt
