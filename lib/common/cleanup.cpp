#include "common/cleanup.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

namespace ckpt {

namespace {

// A slot's state: free, being filled or emptied, or holding a file or folder path.
enum : int { kFree = 0, kBusy = 1, kFile = 2, kFolder = 3 };

struct Slot {
    std::atomic<int> state{kFree};
    char path[PATH_MAX];
};
Slot g_slots[kMaxTemps];

constexpr int kTermSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr const char* kFatalNames[] = {"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT"};
constexpr int kFatalCount = sizeof kFatalSignals / sizeof kFatalSignals[0];

// The fatal messages, made before any handler can run (install_signal_cleanup); the
// handler reads the active set only.
FatalMessages g_fatal[2][kFatalCount];
std::atomic<int> g_active{-1};           // which set of g_fatal the handler prints (-1: none)
std::atomic<bool> g_cleaning{false};     // the first signal removes; a second one waits for nothing
std::atomic<int> g_err_fd{STDERR_FILENO}, g_out_fd{STDOUT_FILENO};  // where on_fatal writes (-1: nowhere)

void write_all(int fd, const std::string& s) {
    if (fd < 0) return;
    const char* p = s.data();
    std::size_t n = s.size();
    while (n > 0) {
        const ssize_t r = ::write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return;
        p += r;
        n -= std::size_t(r);
    }
}

// Remove `name` (relative to dirfd) and, when it is a folder, everything under it, depth
// first: openat + getdents64 + unlinkat only (async-signal-safe; no opendir, which
// allocates). A folder is read again from its start until a pass removes nothing, since
// removing entries while reading can make getdents64 skip some. True when `name` is gone.
bool remove_at(int dirfd, const char* name, int depth) {
    if (::unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return true;
    if (errno != EISDIR && errno != EPERM) return false;  // (EPERM: some systems say so for a folder)
    if (depth > 64) return false;
    const int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    for (int pass = 0; pass < 8; ++pass) {
        bool removed = false, more = false;
        alignas(struct dirent64) char buf[4096];
        for (;;) {
            const ssize_t n = ::getdents64(fd, buf, sizeof buf);  // (glibc's thin system-call wrapper)
            if (n <= 0) break;
            for (ssize_t off = 0; off < n;) {
                const auto* d = reinterpret_cast<const struct dirent64*>(buf + off);
                off += d->d_reclen;
                if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
                more = true;
                removed = remove_at(fd, d->d_name, depth + 1) || removed;
            }
        }
        if (!more || !removed) break;
        ::lseek(fd, 0, SEEK_SET);
    }
    ::close(fd);
    return ::unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT;  // gone exactly when empty
}

void remove_noted() {
    for (Slot& s : g_slots) {
        const int st = s.state.load(std::memory_order_acquire);
        if (st == kFile || st == kFolder) remove_at(AT_FDCWD, s.path, 0);
    }
}

void on_term(int sig) {
    if (!g_cleaning.exchange(true)) remove_noted();
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);  // delivered when this handler returns: the process dies by the signal
}

void on_fatal(int sig) {
    if (!g_cleaning.exchange(true)) remove_noted();
    const int set = g_active.load(std::memory_order_acquire);
    for (int i = 0; i < kFatalCount && set >= 0; ++i)
        if (kFatalSignals[i] == sig) {
            write_all(g_err_fd.load(), g_fatal[set][i].err);
            write_all(g_out_fd.load(), g_fatal[set][i].out);
        }
    ::_exit(2);
}

}  // namespace

void temp_note(const std::string& path, bool folder) {
    if (path.size() >= PATH_MAX) return;
    for (Slot& s : g_slots) {
        int expected = kFree;
        if (!s.state.compare_exchange_strong(expected, kBusy, std::memory_order_acq_rel)) continue;
        std::memcpy(s.path, path.c_str(), path.size() + 1);
        s.state.store(folder ? kFolder : kFile, std::memory_order_release);
        return;
    }
}

void temp_forget(const std::string& path) {
    for (Slot& s : g_slots) {
        int st = s.state.load(std::memory_order_acquire);
        if ((st != kFile && st != kFolder) || std::strcmp(s.path, path.c_str()) != 0) continue;
        if (s.state.compare_exchange_strong(st, kFree, std::memory_order_acq_rel)) return;
    }
}

bool remove_path_now(const std::string& path) { return remove_at(AT_FDCWD, path.c_str(), 0); }

std::string fatal_signal_reason(const std::string& signame) {
    return "fatal signal " + signame + " while processing it (a malformed container can crash libhdf5); no output was written";
}

void install_signal_cleanup(const std::function<FatalMessages(const char* signame)>& messages, int err_fd, int out_fd) {
    // fill the set not in use, then switch to it: a handler running meanwhile reads a whole set
    const int set = g_active.load() == 0 ? 1 : 0;
    for (int i = 0; i < kFatalCount; ++i) g_fatal[set][i] = messages(kFatalNames[i]);
    g_err_fd.store(err_fd);
    g_out_fd.store(out_fd);
    const bool first = g_active.exchange(set) < 0;
    if (!first) return;
    struct sigaction sa {};
    sigemptyset(&sa.sa_mask);
    for (int s : kTermSignals) sigaddset(&sa.sa_mask, s);  // one handler at a time
    for (int s : kFatalSignals) sigaddset(&sa.sa_mask, s);
    sa.sa_handler = on_term;
    for (int s : kTermSignals) {
        struct sigaction old {};
        // a signal the parent set to be ignored stays ignored (nohup; a shell's background job and SIGINT)
        if (::sigaction(s, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        ::sigaction(s, &sa, nullptr);
    }
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND;  // a crash inside the handler itself ends the process plainly
    for (int s : kFatalSignals) ::sigaction(s, &sa, nullptr);
#endif
}

}  // namespace ckpt
