#include "common/progress.h"

#include "common/cancel.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>

namespace ckpt {

std::string human_size(double b) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, ++u;
    char buf[32];
    std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
    return buf;
}

namespace {
std::string clock_text(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    const auto t = static_cast<unsigned long long>(s + 0.5);
    char buf[32];
    if (t >= 3600) std::snprintf(buf, sizeof buf, "%llu:%02llu:%02llu", t / 3600, t / 60 % 60, t % 60);
    else std::snprintf(buf, sizeof buf, "%llu:%02llu", t / 60, t % 60);
    return buf;
}
}  // namespace

Progress::Progress(bool enabled, std::string what, uint64_t total_bytes, uint64_t total_items, std::string unit)
    : on_(enabled && isatty(2)), what_(std::move(what)), unit_(std::move(unit)), total_bytes_(total_bytes),
      total_items_(total_items), start_(std::chrono::steady_clock::now()), last_(start_) {}

std::string Progress::format(const std::string& what, const std::string& unit, uint64_t items, uint64_t total_items,
                             uint64_t bytes, uint64_t total_bytes, double sec) {
    std::string s = what + ":";
    if (total_items) s += " " + std::to_string(items) + "/" + std::to_string(total_items) + " " + unit;
    // the rate and ETA follow bytes when there are any, else items
    const bool by_bytes = total_bytes > 0;
    const double done = by_bytes ? double(bytes) : double(items), total = by_bytes ? double(total_bytes) : double(total_items);
    if (by_bytes)
        s += std::string(total_items ? "," : "") + " " + human_size(double(bytes)) + " / " + human_size(double(total_bytes));
    if (total > 0) {
        char p[16];
        std::snprintf(p, sizeof p, " (%.0f%%)", std::floor(100.0 * std::min(done, total) / total));
        s += p;
    }
    if (sec > 0 && done > 0) {
        const double rate = done / sec;
        char r[32];
        std::snprintf(r, sizeof r, "%.1f", rate);
        s += ", " + (by_bytes ? human_size(rate) : std::string(r) + " " + unit) + "/s";
        if (total > done) s += ", ETA " + clock_text((total - done) / rate);
    }
    return s;
}

void Progress::draw(bool force) {
    const auto now = std::chrono::steady_clock::now();
    if (!force && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    drawn_ = true;
    const double sec = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r\033[K%s", format(what_, unit_, items_, total_items_, bytes_, total_bytes_, sec).c_str());
    std::fflush(stderr);
}

void Progress::advance(uint64_t n) {
    check_cancelled();
    bytes_ += n;
    if (on_) draw(false);
}

void Progress::item_done(uint64_t n) {
    check_cancelled();
    items_ += n;
    if (on_) draw(items_ == total_items_);
}

Progress::~Progress() {
    if (!on_) return;
    if (std::uncaught_exceptions() > 0) {
        std::fprintf(stderr, "\r\033[K");
    } else {
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        std::fprintf(stderr, "\r\033[K%s, done in %.1f s\n",
                     format(what_, unit_, items_, total_items_, bytes_, total_bytes_, sec).c_str(), sec);
    }
    std::fflush(stderr);
}

}  // namespace ckpt
