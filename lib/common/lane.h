// One pipeline stage on its own thread: tasks run one after another, in the order they were
// submitted, beside the caller's work (ckpt-compress reads and hashes the next chunk, and
// hashes the codes of the last one, while the worker pool encodes this one). Ordered streams
// (a storage's XXH3, a file read front to back) stay in order, so the bytes written do not
// depend on whether the lane has a thread. Without one (`threaded` false: --threads 1), a
// task runs at submit(), on the caller.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt {

class SerialLane {
public:
    explicit SerialLane(bool threaded) {
        if (threaded) thread_ = std::thread([this] { loop(); });
    }
    /// Waits for every task submitted, then ends the thread.
    ~SerialLane() {
        {
            std::lock_guard<std::mutex> lk(m_);
            stop_ = true;
        }
        cv_.notify_one();
        if (thread_.joinable()) thread_.join();
    }
    SerialLane(const SerialLane&) = delete;
    SerialLane& operator=(const SerialLane&) = delete;

    /// Run fn after every task submitted before it; the future rethrows what fn threw.
    std::future<void> submit(std::function<void()> fn) {
        std::packaged_task<void()> task(std::move(fn));
        std::future<void> done = task.get_future();
        if (!thread_.joinable()) {
            task();
            return done;
        }
        {
            std::lock_guard<std::mutex> lk(m_);
            queue_.push_back(std::move(task));
        }
        cv_.notify_one();
        return done;
    }

private:
    void loop() {
        std::unique_lock<std::mutex> lk(m_);
        for (;;) {
            cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stop_, nothing left
            std::packaged_task<void()> task = std::move(queue_.front());
            queue_.pop_front();
            lk.unlock();
            task();
            lk.lock();
        }
    }
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<std::packaged_task<void()>> queue_;
    bool stop_ = false;
    std::thread thread_;
};

/// Waits for the futures it holds when it goes out of scope, a throw included: tasks that
/// use the caller's buffers finish before the buffers go.
struct LaneTasks {
    std::vector<std::future<void>*> held;
    ~LaneTasks() {
        for (auto* f : held)
            if (f->valid()) f->wait();
    }
};

}  // namespace ckpt
