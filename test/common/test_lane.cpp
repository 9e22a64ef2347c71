// common/lane.h: a SerialLane runs its tasks in submission order on its own thread (or at
// submit() without one), a task's exception reaches its future, and LaneTasks waits for the
// tasks still running when a scope is left by a throw.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/lane.h"

using ckpt::LaneTasks;
using ckpt::SerialLane;

TEST_CASE("SerialLane runs tasks in order, off the caller's thread when threaded") {
    for (bool threaded : {false, true}) {
        std::vector<int> seen;
        std::vector<std::thread::id> ran_on;
        std::vector<std::future<void>> done;
        {
            SerialLane lane(threaded);
            for (int i = 0; i < 200; ++i)
                done.push_back(lane.submit([&, i] {
                    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // later ones queue up
                    seen.push_back(i);
                    ran_on.push_back(std::this_thread::get_id());
                }));
            if (!threaded) CHECK(seen.size() == 200);  // inline: each ran at submit()
        }  // the destructor waits for every task
        REQUIRE(seen.size() == 200);
        for (int i = 0; i < 200; ++i) CHECK(seen[std::size_t(i)] == i);
        for (auto& f : done) CHECK_NOTHROW(f.get());
        for (auto id : ran_on) CHECK((id == std::this_thread::get_id()) == !threaded);
    }
}

TEST_CASE("a task's exception reaches its future; the lane goes on") {
    SerialLane lane(true);
    auto bad = lane.submit([] { throw std::runtime_error("short read"); });
    int after = 0;
    auto good = lane.submit([&] { after = 7; });
    CHECK_THROWS_WITH_AS(bad.get(), "short read", std::runtime_error);
    good.get();
    CHECK(after == 7);
}

TEST_CASE("LaneTasks waits for running tasks when its scope ends by a throw") {
    SerialLane lane(true);
    std::atomic<int> finished{0};
    try {
        std::future<void> a, b;
        LaneTasks wait{{&a, &b}};
        a = lane.submit([&] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); ++finished; });
        b = lane.submit([&] { ++finished; });
        throw std::runtime_error("caller failed");
    } catch (const std::runtime_error&) {
        CHECK(finished.load() == 2);  // both done before the scope's buffers would go
    }
}
