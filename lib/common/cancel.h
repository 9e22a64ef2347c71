// Cooperative cancellation of a library job (ckptkit.save's Ctrl-C): the thread that runs a
// job installs a CancelScope over a flag another thread may set; the job's progress ticks
// (Progress::advance / item_done, at every chunk and tensor) throw Interrupted once it is
// set, so the job unwinds like any failure: AtomicOutput removes its temporary and an
// existing output is left as it was.
#pragma once
#include <atomic>

#include "common/error.h"

namespace ckpt {

namespace detail {
inline thread_local const std::atomic<bool>* t_cancel = nullptr;
}

/// While alive, `flag` set to true by any thread cancels the job running on this thread.
class CancelScope {
public:
    explicit CancelScope(const std::atomic<bool>& flag) : prev_(detail::t_cancel) { detail::t_cancel = &flag; }
    ~CancelScope() { detail::t_cancel = prev_; }
    CancelScope(const CancelScope&) = delete;
    CancelScope& operator=(const CancelScope&) = delete;

private:
    const std::atomic<bool>* prev_;
};

/// Throws Interrupted when this thread's job was cancelled (a relaxed load otherwise).
inline void check_cancelled() {
    if (detail::t_cancel && detail::t_cancel->load(std::memory_order_relaxed)) throw Interrupted("interrupted; no output was written");
}

}  // namespace ckpt
