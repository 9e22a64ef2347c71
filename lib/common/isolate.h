// A job whose input may crash a library it calls (libhdf5 on a malformed container,
// docs/reliability.md) run in a helper process, so that a crash ends the helper, not its
// caller (the Python interpreter: the package's container reads, python/ckptkit/reader.h).
// The helper is spawned (posix_spawn: no copy of the caller's page tables, unlike fork,
// which costs tens of milliseconds in a process holding torch) and sends one message
// through a pipe at fd 3; a fatal signal removes the temporaries it noted
// (common/cleanup.h) and is reported by name. After the crash-isolated parsers of Chromium
// and the Linux tools.
#pragma once

#include <string>
#include <vector>

namespace ckpt {

/// What became of an isolated job.
struct Isolated {
    bool ran = false;     ///< the helper sent its whole result and exited 0
    std::string message;  ///< its result (when ran)
    std::string signal;   ///< otherwise the fatal signal that ended it ("SIGSEGV"), or ""
    int status = 0;       ///< its wait status (waitpid)
};

/// Run the program `exe` with `args` (argv[1..]) as a helper: its result pipe at fd 3,
/// pass[i] at fd 4 + i, stdin/stdout/stderr inherited. Waits for it. Throws
/// std::system_error when the pipe or the process cannot be made (no such program, out
/// of processes).
Isolated run_isolated(const std::string& exe, const std::vector<std::string>& args, const std::vector<int>& pass = {});

/// In the helper, first: a fatal signal (SIGSEGV, SIGFPE, ...) then removes the noted
/// temporaries and reports its name to the caller; SIGINT / SIGTERM remove them and end
/// the helper by that signal (common/cleanup.h).
void isolated_begin();

/// In the helper, last: send `result` to the caller (then exit 0). False when the pipe
/// is gone.
bool isolated_send(const std::string& result);

}  // namespace ckpt
