// A job whose input may crash a library it calls (libhdf5 on a malformed container,
// docs/reliability.md) run in a child process made by fork(), so that a crash ends the
// child, not its caller (the Python interpreter: the package's container reads). The child
// runs fn and hands back one message through a pipe; a fatal signal removes the temporaries
// it noted (common/cleanup.h) and is reported by name. After the pattern of Chromium's and
// the Linux tools' crash-isolated parsers.
#pragma once

#include <functional>
#include <string>

namespace ckpt {

/// What became of an isolated job.
struct Isolated {
    bool ran = false;     ///< fn returned and its whole message arrived
    std::string message;  ///< fn's return value (when ran)
    std::string signal;   ///< otherwise the fatal signal that ended the child ("SIGSEGV"), or ""
    int status = 0;       ///< the child's wait status (waitpid)
};

/// Run fn() in a child process made by fork() and return its result. The child runs only
/// fn (C++: no Python, no CUDA), then _exit(0): no atexit handlers, no destructors. fork
/// copies the calling thread only: the caller must hold whatever lock the work fn does
/// takes, so that no other thread is inside it (the package holds its one job lock), and
/// fn must not wait on threads made before the fork (the codec's worker pool starts afresh
/// in a child: codec.cpp). fn must not throw (a throw is reported as ran = false, exit 3).
/// Throws std::system_error when the pipe or the child cannot be made. A SIGINT or SIGTERM
/// that ends the child removes its temporaries and reports that signal.
Isolated run_isolated(const std::function<std::string()>& fn);

}  // namespace ckpt
