#include "common/isolate.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "common/cleanup.h"

namespace ckpt {

namespace {

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

}  // namespace

Isolated run_isolated(const std::function<std::string()>& fn) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    const pid_t pid = ::fork();
    if (pid < 0) {
        const int e = errno;
        ::close(fds[0]);
        ::close(fds[1]);
        throw std::system_error(e, std::generic_category(), "fork");
    }
    if (pid == 0) {  // the child: fn, its message ('R' + result), _exit
        ::close(fds[0]);
        // a fatal signal: remove the noted temporaries and send 'S' + its name (cleanup.h)
        install_signal_cleanup([](const char* signame) { return FatalMessages{"", std::string("S") + signame}; }, -1,
                               fds[1]);
        std::string m;
        try {
            m = "R" + fn();
        } catch (...) {
            ::_exit(3);
        }
        ::_exit(write_all(fds[1], m.data(), m.size()) ? 0 : 3);
    }
    ::close(fds[1]);
    std::string got;
    char buf[65536];
    for (;;) {
        const ssize_t r = ::read(fds[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got.append(buf, std::size_t(r));
    }
    ::close(fds[0]);
    Isolated out;
    while (::waitpid(pid, &out.status, 0) < 0 && errno == EINTR) {
    }
    const bool clean_exit = WIFEXITED(out.status) && WEXITSTATUS(out.status) == 0;
    if (clean_exit && !got.empty() && got[0] == 'R') {
        out.ran = true;
        out.message = got.substr(1);
    } else if (!got.empty() && got[0] == 'S') {
        out.signal = got.substr(1);
    } else if (WIFSIGNALED(out.status)) {
        out.signal = signal_name(WTERMSIG(out.status));
    }
    return out;
}

}  // namespace ckpt
