// codec.cpp's worker pool: parallel_ranges covers every index once, with its kept threads,
// and still in a child made by fork() after the parent started them (a training script's
// forked data-loader workers): the child gets a pool of its own instead of waiting for
// threads it does not have.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "codec/codec.h"

namespace {

/// Sum of i over [0, n) by parallel_ranges (4 threads), each index counted once.
uint64_t parallel_sum(std::size_t n) {
    std::atomic<uint64_t> sum{0};
    ckpt::codec::parallel_ranges(n, [&](unsigned, std::size_t a, std::size_t b) {
        uint64_t s = 0;
        for (std::size_t i = a; i < b; ++i) s += i;
        sum += s;
    });
    return sum.load();
}

}  // namespace

TEST_CASE("worker pool: parallel_ranges in the process, then in a forked child") {
    ckpt::codec::set_cpu_threads(4);
    const std::size_t n = std::size_t(1) << 20;  // 64 ranges' worth: every kept thread runs
    REQUIRE(ckpt::codec::parallel_parts(n) == 4);
    const uint64_t want = uint64_t(n) * (n - 1) / 2;
    CHECK(parallel_sum(n) == want);  // the parent's threads exist now
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        alarm(60);  // a pool waiting for the parent's threads would hang: SIGALRM ends it
        _exit(parallel_sum(n) == want ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(parallel_sum(n) == want);  // and the parent's pool still works
    ckpt::codec::set_cpu_threads(0);
}
