// Edge coverage for GCC builds (GCC has no -fsanitize=fuzzer): code compiled with
// -fsanitize-coverage=trace-pc calls __sanitizer_cov_trace_pc at every basic block; this shim
// hashes (previous block, this block) into 64 Ki 8-bit counters that libFuzzer's engine
// (clang's libclang_rt.fuzzer, linked after this file with --allow-multiple-definition so
// this definition wins over libFuzzer's "trace-pc is not supported" stub) reads as features.
// trace-cmp callbacks (-fsanitize-coverage=trace-cmp) go to libFuzzer directly.
#include <cstddef>
#include <cstdint>

extern "C" void __sanitizer_cov_8bit_counters_init(uint8_t* begin, uint8_t* end);

namespace {
constexpr std::size_t kCounters = 1 << 16;
alignas(64) uint8_t counters[kCounters];
thread_local uintptr_t prev_block = 0;
struct Register {
    Register() { __sanitizer_cov_8bit_counters_init(counters, counters + kCounters); }
} register_counters;
}  // namespace

extern "C" __attribute__((no_sanitize_coverage, no_sanitize_address, no_sanitize_undefined))
void __sanitizer_cov_trace_pc() {
    const auto pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
    const uintptr_t cur = (pc ^ (pc >> 15)) * 0x9E3779B97F4A7C15ull;
    counters[((cur >> 20) ^ prev_block) & (kCounters - 1)]++;
    prev_block = (cur >> 21) & (kCounters - 1);
}

// GCC's trace-cmp also reports floating-point comparisons, which libFuzzer does not take.
extern "C" __attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_cmpf(float, float) {}
extern "C" __attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_cmpd(double, double) {}
