#include "common/isolate.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "common/cleanup.h"

extern char** environ;

namespace ckpt {

namespace {

constexpr int kResultFd = 3;  // the helper's end of the result pipe

bool write_all(int fd, const char* p, std::size_t n) {
    while (n > 0) {
        const ssize_t r = ::write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= std::size_t(r);
    }
    return true;
}

std::string signal_name(int sig) {
    const char* abbrev = ::sigabbrev_np(sig);  // "SEGV" (glibc 2.32)
    return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

/// fd duplicated above 9 (close-on-exec), so that no source of the spawn's dup2s is one
/// of its targets (3, 4, ...).
int high_fd(int fd) {
    const int h = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
    if (h < 0) throw std::system_error(errno, std::generic_category(), "fcntl");
    return h;
}

struct Fds {
    std::vector<int> fds;
    ~Fds() {
        for (int f : fds)
            if (f >= 0) ::close(f);
    }
};

}  // namespace

Isolated run_isolated(const std::string& exe, const std::vector<std::string>& args, const std::vector<int>& pass) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    Fds hold{{p[0], -1}};
    hold.fds[1] = high_fd(p[1]);
    ::close(p[1]);
    std::vector<int> from{hold.fds[1]};
    for (int f : pass) hold.fds.push_back(high_fd(f)), from.push_back(hold.fds.back());
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    for (std::size_t i = 0; i < from.size(); ++i) posix_spawn_file_actions_adddup2(&fa, from[i], kResultFd + int(i));
    std::vector<char*> argv{const_cast<char*>(exe.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int e = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0) throw std::system_error(e, std::generic_category(), "posix_spawn " + exe);
    for (std::size_t i = 1; i < hold.fds.size(); ++i) ::close(hold.fds[i]), hold.fds[i] = -1;  // the helper's ends
    std::string got;
    char buf[65536];
    for (;;) {
        const ssize_t r = ::read(p[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got.append(buf, std::size_t(r));
    }
    Isolated out;
    while (::waitpid(pid, &out.status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(out.status) && WEXITSTATUS(out.status) == 0 && !got.empty() && got[0] == 'R') {
        out.ran = true;
        out.message = got.substr(1);
    } else if (!got.empty() && got[0] == 'S') {
        out.signal = got.substr(1);
    } else if (WIFSIGNALED(out.status)) {
        out.signal = signal_name(WTERMSIG(out.status));
    }
    return out;
}

void isolated_begin() {
    install_signal_cleanup([](const char* signame) { return FatalMessages{"", std::string("S") + signame}; }, -1, kResultFd);
}

bool isolated_send(const std::string& result) {
    const std::string m = "R" + result;
    return write_all(kResultFd, m.data(), m.size());
}

}  // namespace ckpt
