#include "codec/codec.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "codec/block.h"
#include "codec/isa.h"
#include "codec/rans.h"

namespace ckpt::codec {

Kind kind_from_name(const std::string& s) {
    if (s == "log8") return Kind::Log8;
    if (s == "bf16") return Kind::BF16;
    if (s == "blockwise8") return Kind::Blockwise8;
    if (s == "vlog") return Kind::VLog;
    throw std::invalid_argument("unknown codec '" + s + "' (vlog, log8, bf16, blockwise8)");
}
const char* kind_name(Kind k) {
    switch (k) {
        case Kind::Log8: return "log8";
        case Kind::BF16: return "bf16";
        case Kind::Blockwise8: return "blockwise8";
        case Kind::VLog: return "vlog";
    }
    return "?";
}
int code_bytes(Kind k) { return k == Kind::BF16 ? BF16::kCodeBytes : k == Kind::VLog ? VLog::kCodeBytes : 1; }
int params_per_block(Kind k) {
    switch (k) {
        case Kind::Log8: return Log8::kParams;
        case Kind::BF16: return BF16::kParams;
        case Kind::Blockwise8: return Blockwise8::kParams;
        case Kind::VLog: return VLog::kParams;
    }
    return 0;
}
bool entropy_coded(Kind k) { return k == Kind::VLog; }

double round_to(MomentType t, double x) { return round_to_type(t, x); }

namespace {
unsigned g_threads = 0;  // 0: all cores
}  // namespace

void set_cpu_threads(unsigned n) { g_threads = n; }
unsigned cpu_threads() {
    if (g_threads) return g_threads;
    cpu_set_t set;  // the cores this process may run on (taskset, cgroup cpusets)
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return unsigned(CPU_COUNT(&set));
    const unsigned hw = std::thread::hardware_concurrency();
    return hw ? hw : 1;
}

const char* isa_name(Isa i) { return i == Isa::AVX512 ? "avx512" : i == Isa::AVX2 ? "avx2" : "baseline"; }

bool isa_supported(Isa i) {
#if defined(__x86_64__)
    // LZCNT (ABM): CPUID 0x80000001, ECX bit 5 (clang's __builtin_cpu_supports lacks "lzcnt")
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool lzcnt = __get_cpuid(0x80000001u, &a, &b, &c, &d) && (c & (1u << 5)) != 0;
    const bool bmi = __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt") &&
                     lzcnt;  // isa.h: both levels use them
    if (i == Isa::AVX2) return bmi && __builtin_cpu_supports("avx2");
    if (i == Isa::AVX512)
        return bmi && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#endif
    return i == Isa::Baseline;
}

namespace {
std::atomic<int> g_isa{-1};  // -1: not chosen yet

Isa isa_from_env() {
    const char* e = std::getenv("CKPTKIT_ISA");
    if (!e || !*e) return isa_supported(Isa::AVX512) ? Isa::AVX512 : isa_supported(Isa::AVX2) ? Isa::AVX2 : Isa::Baseline;
    for (Isa i : {Isa::Baseline, Isa::AVX2, Isa::AVX512})
        if (std::string(e) == isa_name(i)) {
            if (!isa_supported(i)) throw std::invalid_argument(std::string("CKPTKIT_ISA=") + e + ": this CPU lacks it");
            return i;
        }
    throw std::invalid_argument(std::string("CKPTKIT_ISA=") + e + ": not baseline, avx2 or avx512");
}
}  // namespace

Isa active_isa() {
    int v = g_isa.load(std::memory_order_relaxed);
    if (v < 0) {
        v = int(isa_from_env());
        g_isa.store(v, std::memory_order_relaxed);
    }
    return Isa(v);
}

void set_isa(Isa i) {
    if (!isa_supported(i)) throw std::invalid_argument(std::string("instruction set ") + isa_name(i) + ": this CPU lacks it");
    g_isa.store(int(i), std::memory_order_relaxed);
}

void gradient_domain(const DomainRule& d, const float* theta, std::size_t i, double& lo, double& hi) {
    gradient_domain_hd(d, theta, i, lo, hi);
}

namespace {

/// Threads kept for for_block_ranges and woken per call: spawning them per call, with a
/// call per 64Ki-coordinate chunk (ckpt/pipeline.h's kCpuChunk), made --threads 2 no
/// faster than 1 (docs/benchmarks.md, "Measurements behind the code's choices").
class WorkerPool {
public:
    /// fn(p) for p in [0, parts): part 0 on the caller, the others on kept threads; returns
    /// when every part has (fn must not throw). A call while another runs (from another
    /// thread, or from inside fn) runs its parts on its caller, one after another.
    void run(unsigned parts, const std::function<void(unsigned)>& fn) {
        std::unique_lock<std::mutex> busy(run_m_, std::try_to_lock);
        if (!busy || parts <= 1) {
            for (unsigned p = 0; p < parts; ++p) fn(p);
            return;
        }
        {
            std::lock_guard<std::mutex> lk(m_);
            while (threads_.size() + 1 < parts) {  // started before gen_ moves: they take this job
                const unsigned id = unsigned(threads_.size()) + 1;
                threads_.emplace_back([this, id, seen = gen_] { loop(id, seen); });
            }
            job_ = &fn;
            parts_ = parts;
            pending_ = parts - 1;
            ++gen_;
        }
        cv_.notify_all();
        fn(0);
        std::unique_lock<std::mutex> lk(m_);
        done_.wait(lk, [&] { return pending_ == 0; });
        job_ = nullptr;
    }
    ~WorkerPool() {
        {
            std::lock_guard<std::mutex> lk(m_);
            stop_ = true;
            ++gen_;
        }
        cv_.notify_all();
        for (auto& t : threads_) t.join();
    }

private:
    void loop(unsigned id, uint64_t seen) {
        std::unique_lock<std::mutex> lk(m_);
        for (;;) {
            cv_.wait(lk, [&] { return gen_ != seen; });
            seen = gen_;
            if (stop_) return;
            if (id >= parts_) continue;
            const auto* job = job_;
            lk.unlock();
            (*job)(id);
            lk.lock();
            if (--pending_ == 0) done_.notify_one();
        }
    }
    std::mutex run_m_, m_;
    std::condition_variable cv_, done_;
    std::vector<std::thread> threads_;
    const std::function<void(unsigned)>* job_ = nullptr;
    unsigned parts_ = 0, pending_ = 0;
    uint64_t gen_ = 0;
    bool stop_ = false;
};

/// The process's one WorkerPool. A child made by fork() (a training script's data-loader
/// workers) has none of the parent's threads: it gets a new pool, the old one left as it was (never destroyed:
/// its destructor would wait for threads that do not exist there).
std::atomic<WorkerPool*> g_pool{nullptr};

WorkerPool& worker_pool() {
    static WorkerPool* const first = [] {
        ::pthread_atfork(nullptr, nullptr, [] { g_pool.store(new WorkerPool); });
        auto* p = new WorkerPool;
        g_pool.store(p);
        return p;
    }();
    (void)first;
    return *g_pool.load();
}

/// Run fn(part, first_block, end_block) over `parts` contiguous ranges of `blocks` blocks,
/// part 0 on the calling thread, the others on worker_pool()'s; rethrows the first exception.
template <class Fn>
void for_block_ranges(std::size_t blocks, unsigned parts, Fn fn) {
    std::vector<std::exception_ptr> err(parts);
    worker_pool().run(parts, [&](unsigned p) {
        try {
            fn(p, blocks * p / parts, blocks * (p + 1) / parts);
        } catch (...) {
            err[p] = std::current_exception();
        }
    });
    for (auto& e : err)
        if (e) std::rethrow_exception(e);
}

/// Threads for a chunk of n coordinates: one per 16k coordinates at most, so a range's
/// work stays well above the cost of waking a kept thread (docs/benchmarks.md,
/// "Measurements behind the code's choices").
unsigned parts_for(std::size_t n) {
    const std::size_t most = std::max<std::size_t>(1, n / 16384);
    return unsigned(std::min<std::size_t>(cpu_threads(), most));
}

}  // namespace

unsigned parallel_parts(std::size_t n) { return parts_for(n); }

void parallel_ranges(std::size_t n, const std::function<void(unsigned, std::size_t, std::size_t)>& fn) {
    for_block_ranges(n, parts_for(n), fn);
}

void parallel_items(std::size_t count, const std::function<void(unsigned, std::size_t, std::size_t)>& fn) {
    for_block_ranges(count, unsigned(std::min<std::size_t>(cpu_threads(), std::max<std::size_t>(count, 1))), fn);
}

namespace {

/// The cause of coordinate i's escape (src: the chunk's moments).
EscapeCause escape_cause(const float* const* src, int nm, std::size_t i, bool coded) {
    for (int k = 0; k < nm; ++k)
        if (!std::isfinite(src[k][i])) return EscapeCause::NonFinite;
    return coded ? EscapeCause::Certificate : EscapeCause::NoCode;
}

/// What one block range of encode_impl collects.
struct RangeOut {
    std::vector<uint32_t> escapes;
    double max_bound = 0;
    std::array<uint64_t, 3> causes{};
};

/// encode_impl's work on blocks [b0, b1): codes and params into out, escapes into r.
template <class Q>
void encode_blocks(const TensorSetup& s, const GuardConst& gc, const float* const* src, const ChunkIn& in,
                   std::size_t b0, std::size_t b1, ChunkOut& out, RangeOut& r) {
    const int nm = s.moments();
    const std::size_t n = in.n;
    auto w = std::make_unique<BlockWork<Q>>();
    for (std::size_t b = b0; b < b1; ++b) {
        const std::size_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
        const int bn = int(i1 - i0);
        // a whole block (all but a chunk's last) gets its own inlined copy of encode_block
        // with bn the constant kBlock: its loops then have a fixed trip count (no remainder
        // code); the same operations, so the same codes
        const BlockTrial<Q>& best = bn == kBlock ? encode_block<Q>(s, gc, src, in.theta, i0, kBlock, *w)
                                            : encode_block<Q>(s, gc, src, in.theta, i0, bn, *w);
        for (int k = 0; k < nm; ++k)
            std::copy(best.p[k], best.p[k] + Q::kParams, out.params[k].data() + b * Q::kParams);
        if (best.escapes == 0) {  // the common block: every coordinate keeps its codes (no branch per coordinate)
            // 8 lanes of partial maxima (these bounds are never NaN, so the order does not
            // matter): the loop vectorises
            double lm[8], mb = r.max_bound;
            for (double& x : lm) x = mb;
            int j = 0;
            for (; j + 8 <= bn; j += 8)
                for (int l = 0; l < 8; ++l) lm[l] = std::max(lm[l], best.bound[j + l]);
            for (; j < bn; ++j) lm[0] = std::max(lm[0], best.bound[j]);
            for (double x : lm) mb = std::max(mb, x);
            r.max_bound = mb;
            for (int k = 0; k < nm; ++k) {
                if constexpr (Q::kCodeBytes == 2) {  // little-endian uint16 codes: a copy (rans.h)
                    codes_to_bytes(best.code[k], std::size_t(bn), out.codes[k].data() + 2 * i0);
                } else {
                    for (int j = 0; j < bn; ++j) store_code(out.codes[k].data(), Q::kCodeBytes, i0 + std::size_t(j), best.code[k][j]);
                }
            }
            continue;
        }
        for (int j = 0; j < bn; ++j) {
            const std::size_t i = i0 + std::size_t(j);
            if (!best.keep[j]) {   // its codes 0 (out's buffers are reused, not zeroed)
                for (int k = 0; k < nm; ++k) store_code(out.codes[k].data(), Q::kCodeBytes, i, 0);
                r.escapes.push_back(uint32_t(i));
                ++r.causes[std::size_t(escape_cause(src, nm, i, best.code_ok[j]))];
                continue;
            }
            r.max_bound = std::max(r.max_bound, best.bound[j]);
            for (int k = 0; k < nm; ++k) store_code(out.codes[k].data(), Q::kCodeBytes, i, best.code[k][j]);
        }
    }
}
CKPT_ISA_CLONES(encode_blocks_isa, encode_blocks)

/// decode_impl's work on blocks [b0, b1) (see decode_chunk); `bad`: the first of them with
/// a used code outside the float range (block.h code_in_range), or left as it is.
template <class Q>
void decode_blocks(const TensorSetup& s, const GuardConst& gc, const std::array<const uint8_t*, 3>& codes,
                   const std::array<const int16_t*, 3>& params, std::size_t n, std::array<float*, 3>& out,
                   const float* theta, double* bounds, std::size_t b0, std::size_t b1, std::size_t& bad) {
    if constexpr (std::is_same_v<Q, VLog>) {
        if (!bounds) {  // restore: values only, a block at a time
            auto cells = std::make_unique<BlockCells[]>(3);
            for (std::size_t b = b0; b < b1; ++b)
                if (!vlog_decode_block(s, codes.data(), params.data(), b * kBlock,
                                       int(std::min(n, (b + 1) * kBlock) - b * kBlock), false, out.data(), cells.get()) &&
                    b < bad)
                    bad = b;
            return;
        }
    }
    if (bounds) {  // verify: a block at a time (the same bounds as decode_coord's)
        auto cells = std::make_unique<BlockCells[]>(3);
        double closed[kBlock];
        for (std::size_t b = b0; b < b1; ++b)
            if (!decode_block_bounds<Q>(s, gc, codes.data(), params.data(), b * kBlock,
                                        int(std::min(n, (b + 1) * kBlock) - b * kBlock), out.data(), theta, bounds,
                                        cells.get(), closed) &&
                b < bad)
                bad = b;
        return;
    }
    for (std::size_t i = b0 * kBlock; i < std::min(n, b1 * kBlock); ++i)
        if (!decode_coord<Q>(s, gc, codes.data(), params.data(), i, out.data(), theta, bounds) && i / kBlock < bad)
            bad = i / kBlock;
}
CKPT_ISA_CLONES(decode_blocks_isa, decode_blocks)

// The loops over blocks and coordinates; the bodies are block.h's (shared with cuda/).
template <class Q>
void encode_impl(const TensorSetup& s, const ChunkIn& in, ChunkOut& out) {
    const int nm = s.moments();
    const std::size_t n = in.n, blocks = (n + kBlock - 1) / kBlock;
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance, s.format6);
    const float* src[3] = {in.m, in.v, in.vmax};
    for (int k = 0; k < 3; ++k) {  // every byte is written by encode_blocks: a reused buffer is not zeroed
        out.codes[k].resize(k < nm ? n * Q::kCodeBytes : 0);
        out.params[k].resize(k < nm ? blocks * Q::kParams : 0);
    }
    out.escapes.clear();
    out.max_bound = 0;
    out.causes = {};
    const unsigned parts = parts_for(n);
    std::vector<RangeOut> ranges(parts);
    for_block_ranges(blocks, parts, [&](unsigned part, std::size_t b0, std::size_t b1) {
        encode_blocks_isa<Q>(s, gc, src, in, b0, b1, out, ranges[part]);
    });
    for (const RangeOut& r : ranges) {
        out.escapes.insert(out.escapes.end(), r.escapes.begin(), r.escapes.end());
        out.max_bound = std::max(out.max_bound, r.max_bound);
        for (std::size_t c = 0; c < 3; ++c) out.causes[c] += r.causes[c];
    }
}

template <class Q>
std::size_t decode_impl(const TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                        const std::array<const int16_t*, 3>& params, std::size_t n,
                        std::array<float*, 3> out, const float* theta, double* bounds) {
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance, s.format6);
    const std::size_t blocks = (n + kBlock - 1) / kBlock;
    const unsigned parts = parts_for(n);
    std::vector<std::size_t> bad(parts, SIZE_MAX);
    for_block_ranges(blocks, parts, [&](unsigned part, std::size_t b0, std::size_t b1) {
        decode_blocks_isa<Q>(s, gc, codes, params, n, out, theta, bounds, b0, b1, bad[part]);
    });
    return *std::min_element(bad.begin(), bad.end());
}

template <class Q>
void classify_impl(const TensorSetup& s, const ChunkIn& in, ChunkOut& out) {
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance, s.format6);
    const float* src[3] = {in.m, in.v, in.vmax};
    auto w = std::make_unique<BlockWork<Q>>();
    out.causes = {};
    std::size_t last_block = SIZE_MAX;
    const BlockTrial<Q>* best = nullptr;
    for (uint32_t i : out.escapes) {
        const std::size_t b = i / kBlock, i0 = b * kBlock;
        if (b != last_block) {
            best = &encode_block<Q>(s, gc, src, in.theta, i0, int(std::min<std::size_t>(kBlock, in.n - i0)), *w);
            last_block = b;
        }
        ++out.causes[std::size_t(escape_cause(src, s.moments(), i, best->code_ok[i - i0]))];
    }
}

}  // namespace

void classify_escapes(const TensorSetup& s, const ChunkIn& in, ChunkOut& out) {
    switch (s.kind) {
        case Kind::Log8: return classify_impl<Log8>(s, in, out);
        case Kind::BF16: return classify_impl<BF16>(s, in, out);
        case Kind::Blockwise8: return classify_impl<Blockwise8>(s, in, out);
        case Kind::VLog: return classify_impl<VLog>(s, in, out);
    }
}

std::size_t invalid_block_param(Kind kind, int k, const int16_t* params, std::size_t blocks, const char** rule) {
    const char* why = nullptr;
    std::size_t b = 0;
    switch (kind) {
        case Kind::BF16: return SIZE_MAX;  // no block parameters
        case Kind::Blockwise8:  // absmax: a finite float >= +0 (its sign bit clear)
            for (; b < blocks; ++b) {
                const float a = Blockwise8::absmax(params + 2 * b);
                if (!(std::isfinite(a) && !std::signbit(a))) { why = "an absmax that is a finite float >= +0"; break; }
            }
            break;
        case Kind::Log8:
            for (; b < blocks; ++b) {
                if (k == 0 && params[2 * b + 1] != 0) { why = "exp_avg's second parameter 0"; break; }
                if (k != 0 && params[2 * b + 1] < 1) { why = "a step >= 1"; break; }
            }
            break;
        case Kind::VLog:
            for (; b < blocks; ++b) {
                const int16_t p0 = params[2 * b], p1 = params[2 * b + 1];
                // max_exp_avg_sq has no grid of its own (params 0, 0: exp_avg_sq's grid)
                if (k == 2 && (p0 != 0 || p1 != 0)) { why = "max_exp_avg_sq's parameters (0, 0)"; break; }
                if (k == 0 && p1 != 0) { why = "exp_avg's second parameter 0"; break; }
                if (k != 2 && p0 == INT16_MIN) { why = "parameters in [-32767, 32767]"; break; }
                if (k == 1 && p1 < 1) { why = "a step >= 1"; break; }
            }
            break;
    }
    if (!why) return SIZE_MAX;
    if (rule) *rule = why;
    return b;
}

void encode_chunk_into(const TensorSetup& s, const ChunkIn& in, ChunkOut& out) {
    switch (s.kind) {
        case Kind::Log8: return encode_impl<Log8>(s, in, out);
        case Kind::BF16: return encode_impl<BF16>(s, in, out);
        case Kind::Blockwise8: return encode_impl<Blockwise8>(s, in, out);
        case Kind::VLog: return encode_impl<VLog>(s, in, out);
    }
    throw std::logic_error("codec kind");
}

ChunkOut encode_chunk(const TensorSetup& s, const ChunkIn& in) {
    ChunkOut out;
    encode_chunk_into(s, in, out);
    return out;
}

std::size_t decode_chunk(const TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                         const std::array<const int16_t*, 3>& params, std::size_t n,
                         std::array<float*, 3> out, const float* theta, double* bounds) {
    switch (s.kind) {
        case Kind::Log8: return decode_impl<Log8>(s, codes, params, n, out, theta, bounds);
        case Kind::BF16: return decode_impl<BF16>(s, codes, params, n, out, theta, bounds);
        case Kind::Blockwise8: return decode_impl<Blockwise8>(s, codes, params, n, out, theta, bounds);
        case Kind::VLog: return decode_impl<VLog>(s, codes, params, n, out, theta, bounds);
    }
    return SIZE_MAX;
}

}  // namespace ckpt::codec
