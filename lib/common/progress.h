// The progress line every tool draws on a terminal: items (tensors, plans) and bytes done,
// rate and ETA. docs/design.md §6: stderr only, only when stderr is a TTY, never under --json.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace ckpt {

/// Progress on stderr, redrawn in place at most ten times a second, only when `enabled` and
/// stderr is a terminal. The destructor ends the line with a summary (or clears it while an
/// exception unwinds, so the error line starts clean).
class Progress {
public:
    /// `what` labels the line (the tool name); `total_bytes` is the work in bytes (0: count
    /// items only); `total_items` the tensors (or plans) to do (0: not shown), named `unit`.
    Progress(bool enabled, std::string what, uint64_t total_bytes, uint64_t total_items = 0,
             std::string unit = "tensors");
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;
    /// `n` more bytes done. Throws Interrupted when this thread's job was cancelled
    /// (common/cancel.h): every tool ticks at each chunk, so that is how soon a job stops.
    void advance(uint64_t n);
    /// `n` more items (tensors, plans) done; throws Interrupted as advance does.
    void item_done(uint64_t n = 1);
    /// The line for a state: "WHAT: I/N UNIT, B/T (P%), R/s, ETA M:SS" (no redraw control).
    static std::string format(const std::string& what, const std::string& unit, uint64_t items,
                              uint64_t total_items, uint64_t bytes, uint64_t total_bytes, double seconds);

private:
    void draw(bool force);
    bool on_;
    std::string what_, unit_;
    uint64_t total_bytes_, total_items_, bytes_ = 0, items_ = 0;
    std::chrono::steady_clock::time_point start_, last_;
    bool drawn_ = false;
};

/// Bytes as "512 B", "12.3 KiB", "4.56 GiB".
std::string human_size(double bytes);

}  // namespace ckpt
