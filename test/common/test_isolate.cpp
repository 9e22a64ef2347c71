// common/isolate.h: a helper's result comes back whole through fd 3, a passed descriptor
// arrives at fd 4, and a helper that dies by a signal, exits without a result or cannot
// start is reported as such; the caller goes on. (/bin/sh plays the helper; the fatal-signal
// handler's own report is exercised by test_python_api.py with the package's helper.)
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <system_error>

#include "../temp_dir.h"
#include "common/isolate.h"

using ckpt::test::TempDir;

namespace {
ckpt::Isolated sh(const std::string& script, const std::vector<int>& pass = {}) {
    return ckpt::run_isolated("/bin/sh", {"-c", script}, pass);
}
}  // namespace

TEST_CASE("run_isolated: the helper's result, whole (larger than a pipe's buffer)") {
    const ckpt::Isolated r = sh("printf Rhello >&3");
    CHECK(r.ran);
    CHECK(r.message == "hello");
    const ckpt::Isolated big = sh("{ printf R; head -c 300000 /dev/zero; } >&3");
    CHECK(big.ran);
    CHECK(big.message == std::string(300000, '\0'));
}

TEST_CASE("run_isolated: a passed descriptor is the helper's fd 4") {
    TempDir t;
    const std::string path = (t.path / "out").string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    const ckpt::Isolated r = sh("printf written >&4; printf R >&3", {fd});
    ::close(fd);
    CHECK(r.ran);
    std::ifstream in(path);
    CHECK(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()) == "written");
}

TEST_CASE("run_isolated: a signal, an exit without a result, a missing program") {
    const ckpt::Isolated seg = sh("kill -SEGV $$");
    CHECK_FALSE(seg.ran);
    CHECK(seg.signal == "SIGSEGV");
    const ckpt::Isolated fpe = sh("printf Rpartial >&3; kill -FPE $$");  // a result, then a crash: not ran
    CHECK_FALSE(fpe.ran);
    CHECK(fpe.signal == "SIGFPE");
    const ckpt::Isolated quiet = sh("exit 3");
    CHECK_FALSE(quiet.ran);
    CHECK(quiet.signal.empty());
    CHECK((WIFEXITED(quiet.status) && WEXITSTATUS(quiet.status) == 3));
    const ckpt::Isolated bad = sh("printf Xnot-a-result >&3");  // exit 0 without the 'R' tag
    CHECK_FALSE(bad.ran);
    CHECK_THROWS_AS(ckpt::run_isolated("/nonexistent/helper", {}), std::system_error);
}
