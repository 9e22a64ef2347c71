// common/isolate.h: a job run in a forked child hands its result back; a crash in it ends
// only the child, is named, and removes the temporaries it noted; a throw is reported.
#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "../temp_dir.h"
#include "common/cleanup.h"
#include "common/isolate.h"

namespace fs = std::filesystem;
using ckpt::test::TempDir;

TEST_CASE("run_isolated: the child's result, whole (larger than a pipe's buffer)") {
    std::string big(300000, 'x');
    big[123456] = '\0';  // bytes, not a C string
    const ckpt::Isolated r = ckpt::run_isolated([&] { return big + "!"; });
    CHECK(r.ran);
    CHECK(r.signal.empty());
    CHECK(r.message == big + "!");
    CHECK(ckpt::run_isolated([] { return std::string(); }).ran);
}

TEST_CASE("run_isolated: a throw ends the child without a result") {
    const ckpt::Isolated r = ckpt::run_isolated([]() -> std::string { throw std::runtime_error("no"); });
    CHECK_FALSE(r.ran);
    CHECK(r.signal.empty());
    CHECK(r.status != 0);
}

TEST_CASE("run_isolated: SIGTERM in the child removes its temporary and is named") {
    TempDir t;
    const std::string tmp = (t.path / ".out.tmp-1-0").string();
    const ckpt::Isolated r = ckpt::run_isolated([&] {
        std::ofstream(tmp) << "partial";
        ckpt::temp_note(tmp, false);
        std::raise(SIGTERM);
        return std::string("not reached");
    });
    CHECK_FALSE(r.ran);
    CHECK(r.signal == "SIGTERM");
    CHECK_FALSE(fs::exists(tmp));
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST_CASE("run_isolated: a crash in the child removes its temporary and is named; the caller goes on") {
    TempDir t;
    const std::string tmp = (t.path / ".out.tmp-1-0").string();
    for (int sig : {SIGSEGV, SIGFPE}) {
        const ckpt::Isolated r = ckpt::run_isolated([&] {
            std::ofstream(tmp) << "partial";
            ckpt::temp_note(tmp, false);
            std::raise(sig);
            return std::string("not reached");
        });
        CHECK_FALSE(r.ran);
        CHECK(r.signal == (sig == SIGSEGV ? "SIGSEGV" : "SIGFPE"));
        CHECK_FALSE(fs::exists(tmp));
    }
    CHECK(ckpt::fatal_signal_reason("SIGFPE") ==
          "fatal signal SIGFPE while processing it (a malformed container can crash libhdf5); no output was written");
}
#endif
