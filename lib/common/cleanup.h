// Removal of temporary outputs when a signal ends the process, after git's tempfile.c and
// sigchain.c: a table of the temporaries being written, which a handler removes before the
// process goes (Ctrl-C, kill, a hang-up, a closed pipe; or a crash, e.g. inside libhdf5 on
// a malformed container, docs/reliability.md). SIGKILL cannot be caught: its temporaries
// (".NAME.tmp-PID...", never at an output path) stay.
#pragma once

#include <functional>
#include <string>

namespace ckpt {

/// How many temporaries can be noted at once (a process writes one file, or one folder
/// and a scratch folder); one more is not noted (it could then be left behind).
constexpr int kMaxTemps = 16;

/// Note `path` for removal if a signal ends the process before temp_forget(path): a file,
/// or (`folder`) a folder with everything in it. Thread-safe; paths of PATH_MAX bytes or
/// more are not noted.
void temp_note(const std::string& path, bool folder);

/// Stop noting `path` (renamed into place, or removed). Thread-safe; a path not noted is
/// ignored.
void temp_forget(const std::string& path);

/// What a fatal signal prints: the text for stderr and the text for stdout (empty: none).
struct FatalMessages {
    std::string err, out;
};

/// Install the handlers (once per process; a later call replaces only the messages):
/// - SIGINT, SIGTERM, SIGHUP, SIGPIPE: remove the noted paths, then die by the signal as
///   without the handler (the shell's exit status 128 + N);
/// - SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: remove the noted paths, print
///   messages(SIGNAME) (made here, once per signal, so that the handler only writes), and
///   exit 2. Not installed in a sanitizer build, whose own report of the crash comes first.
/// The handlers call only async-signal-safe functions (write, unlinkat, openat,
/// getdents64, lseek, close, sigaction, raise, _exit). The messages go to err_fd and out_fd
/// (-1: not written; common/isolate.cpp's child sends them through its pipe).
void install_signal_cleanup(const std::function<FatalMessages(const char* signame)>& messages, int err_fd = 2,
                            int out_fd = 1);

/// The reason the tools and the package give when a fatal signal ended their work on a file:
/// "fatal signal SIGSEGV while processing it (a malformed container can crash libhdf5); no
/// output was written".
std::string fatal_signal_reason(const std::string& signame);

/// Remove `path` and everything under it now (no error when it is not there); the same
/// routine the handler uses. Returns false when something could not be removed.
bool remove_path_now(const std::string& path);

}  // namespace ckpt
