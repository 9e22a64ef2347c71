// Exact properties of the quantizers (log8, vlog, bf16, blockwise8): zero and sign
// exactness, cells contain the encoded value, nearest-code rounding, escapes for
// non-finite values, the bnb map, thread-count independence.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "codec/bf16.h"
#include "codec/block.h"
#include "codec/blockwise8.h"
#include "codec/codec.h"
#include "codec/log8.h"
#include "codec/vlog.h"

using namespace ckpt::codec;

TEST_CASE("log8 grid is exact powers 2^(e/64)") {
    CHECK(Log8::value(0) == 1.0);
    CHECK(Log8::value(64) == 2.0);
    CHECK(Log8::value(-128) == 0.25);
    CHECK(Log8::value(32) == double(float(std::sqrt(2.0))));
    CHECK(Log8::log64_floor(2.0) == 64);
    CHECK(Log8::log64_ceil(2.0) == 64);
    CHECK(Log8::log64_ceil(2.01) == 65);
    CHECK(Log8::log64_floor(1e-45) < -9000);  // subnormals work
}

TEST_CASE("log8 exp_avg_sq: cell contains x, nearest code, zero exact, escapes") {
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> U(0, 1);
    float v[256];
    for (int i = 0; i < 256; ++i) v[i] = float(1e-8 * std::pow(10, 2 * U(rng)));
    v[3] = 0.0f;
    AdamHyper h;
    h.step = 1000;
    const GuardConst gc = make_guard_const(h, 0.01);
    int16_t p[2];
    Log8::choose(v, 256, Role::ExpAvgSq, nullptr, gc, p);
    CHECK(p[1] >= 1);
    for (int i = 0; i < 256; ++i) {
        uint16_t c;
        REQUIRE(Log8::encode(v[i], Role::ExpAvgSq, p, 0, &c));
        const Cell cell = Log8::cell(c, Role::ExpAvgSq, p, 0);
        CHECK(cell.lo <= v[i]);
        CHECK(v[i] <= cell.hi);
        if (v[i] == 0) { CHECK(c == 0); CHECK(cell.dec == 0); CHECK(cell.hi == 0); }
        if (c > 1 && c < 255) {  // nearest: the neighbours are no closer
            const double d = std::fabs(v[i] - Log8::mag(c, p, 255));
            CHECK(d <= std::fabs(v[i] - Log8::mag(c - 1, p, 255)));
            CHECK(d <= std::fabs(v[i] - Log8::mag(c + 1, p, 255)));
        }
    }
    uint16_t c;
    CHECK_FALSE(Log8::encode(INFINITY, Role::ExpAvgSq, p, 0, &c));
    CHECK_FALSE(Log8::encode(std::numeric_limits<float>::quiet_NaN(), Role::ExpAvgSq, p, 0, &c));
    CHECK_FALSE(Log8::encode(-1e-7f, Role::ExpAvgSq, p, 0, &c));  // negative second moment
    CHECK_FALSE(Log8::encode(1.0f, Role::ExpAvgSq, p, 0, &c));    // above the top cell
}

TEST_CASE("log8 exp_avg: linear in m / sqrt(v~), signs and zeros exact") {
    AdamHyper h;
    h.step = 1000;
    const GuardConst gc = make_guard_const(h, 0.01);
    float m[4] = {3e-4f, -2e-4f, 0.0f, -0.0f};
    const double scale[4] = {1e-3, 1e-3, 1e-3, 1e-3};
    int16_t p[2];
    Log8::choose(m, 4, Role::ExpAvg, scale, gc, p);
    const double step = Log8::value(p[0]);
    CHECK(step * 127.5 >= 0.3);  // the largest |m|/sqrt(v~) fits
    for (int i = 0; i < 4; ++i) {
        uint16_t c;
        REQUIRE(Log8::encode(m[i], Role::ExpAvg, p, scale[i], &c));
        const Cell cell = Log8::cell(c, Role::ExpAvg, p, scale[i]);
        CHECK(cell.lo <= m[i]);
        CHECK(m[i] <= cell.hi);
        CHECK(std::signbit(cell.dec) == std::signbit(m[i]));
        CHECK(cell.hi - cell.lo == doctest::Approx(step * 1e-3));
        if (m[i] == 0) CHECK(cell.dec == 0);
    }
    uint16_t c;
    // the top edge: (K + 1/2) steps is the last coded magnitude, just past it has no code
    const float below = float(126.9 * step * 1e-3), past = float(127.6 * step * 1e-3);
    REQUIRE(Log8::encode(below, Role::ExpAvg, p, 1e-3, &c));
    CHECK(c == 127);
    CHECK_FALSE(Log8::encode(past, Role::ExpAvg, p, 1e-3, &c));
    CHECK_FALSE(Log8::encode(-past, Role::ExpAvg, p, 1e-3, &c));
    CHECK_FALSE(Log8::encode(1e-2f, Role::ExpAvg, p, 1e-3, &c));  // |m|/sqrt(v) past the top code
    CHECK_FALSE(Log8::encode(1e-9f, Role::ExpAvg, p, 0.0, &c));   // nonzero m with v~ = 0
}

TEST_CASE("bf16 is round-to-nearest-even and cells are half-ulp") {
    uint16_t c;
    REQUIRE(BF16::encode(1.0f + 1.0f / 256, Role::ExpAvg, nullptr, 0, &c));  // tie -> even (1.0)
    CHECK(c == 0x3f80);
    REQUIRE(BF16::encode(1.0f + 3.0f / 256, Role::ExpAvg, nullptr, 0, &c));  // tie -> even (up)
    CHECK(c == 0x3f82);
    const Cell cell = BF16::cell(0x3f80, Role::ExpAvg, nullptr, 0);
    CHECK(cell.dec == 1.0);
    CHECK(cell.hi == 1.0 + 1.0 / 256);
    CHECK(cell.lo == 1.0 - 1.0 / 512);
    CHECK_FALSE(BF16::encode(1e-45f, Role::ExpAvg, nullptr, 0, &c));  // would flush to zero
}

TEST_CASE("blockwise8 dynamic map matches bitsandbytes' shape") {
    const DynamicMap s(true), u(false);
    CHECK(s.v[0] == float(-(1 + (1 - 0.9 / 64)) / 2));  // last linspace cell of exponent 0
    CHECK(s.v[255] == 1.0f);
    CHECK(u.v[0] == 0.0f);
    CHECK(u.v[255] == 1.0f);
    int zeros = 0;
    for (float f : s.v) zeros += f == 0;
    CHECK(zeros == 1);
    for (int k = 1; k < 256; ++k) { CHECK(s.v[k - 1] < s.v[k]); CHECK(u.v[k - 1] < u.v[k]); }
}

TEST_CASE("encode_chunk and decode_chunk give identical results for any CPU thread count") {
    std::mt19937_64 rng(5);
    std::lognormal_distribution<double> L(-14, 3);
    std::normal_distribution<double> N(0, 1);
    const std::size_t n = 5 * 16384 + 77;  // several thread ranges and a partial last block
    std::vector<float> m(n), v(n);
    for (std::size_t i = 0; i < n; ++i) {
        v[i] = float(L(rng));
        m[i] = float(0.3 * N(rng) * std::sqrt(double(v[i])));
    }
    for (Kind kind : {Kind::Log8, Kind::VLog}) {
    TensorSetup s;
    s.kind = kind;
    s.hyper.step = 50;
    const ChunkIn in{m.data(), v.data(), nullptr, nullptr, n};
    std::vector<ChunkOut> outs;
    std::vector<std::vector<double>> bounds;
    for (unsigned t : {1u, 3u}) {
        set_cpu_threads(t);
        outs.push_back(encode_chunk(s, in));
        const ChunkOut& o = outs.back();
        std::vector<float> dm(n), dv(n);
        bounds.emplace_back(n);
        decode_chunk(s, {o.codes[0].data(), o.codes[1].data(), nullptr}, {o.params[0].data(), o.params[1].data(), nullptr},
                     n, {dm.data(), dv.data(), nullptr}, nullptr, bounds.back().data());
    }
    set_cpu_threads(0);
    for (int k = 0; k < 2; ++k) {
        CHECK(outs[0].codes[k] == outs[1].codes[k]);
        CHECK(outs[0].params[k] == outs[1].params[k]);
    }
    CHECK(outs[0].escapes == outs[1].escapes);
    CHECK(outs[0].causes == outs[1].causes);
    // log8: the log-normal tails make escapes in several ranges; vlog has no fixed range
    if (kind == Kind::Log8) CHECK(!outs[0].escapes.empty());
    else CHECK(outs[0].causes[std::size_t(EscapeCause::NoCode)] == 0);
    CHECK(outs[0].max_bound == outs[1].max_bound);
    CHECK(bounds[0] == bounds[1]);
    }
}

TEST_CASE("vlog grid: exact 2^(e/1024), log2_hd, zigzag") {
    CHECK(VLog::value(0) == 1.0);
    CHECK(VLog::value(1024) == 2.0);
    CHECK(VLog::value(-2048) == 0.25);
    CHECK(VLog::value(512) == double(float(std::sqrt(2.0))));
    for (int j = 0; j <= 1024; ++j) CHECK(std::fabs(VLog::table(j) / std::exp2(j / 1024.0) - 1) <= 6e-8);
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> E(-140, 120);
    double worst = 0;
    for (int i = 0; i < 100000; ++i) {
        const double x = std::exp2(E(rng));
        worst = std::max(worst, std::fabs(log2_hd(x) - std::log2(x)));
    }
    CHECK(worst < 1e-5);
    CHECK(log2_hd(1e-45) < -149);  // subnormal floats
    for (int32_t j : {0, 1, -1, 2, -2, 32767, -32767}) CHECK(VLog::unzigzag(VLog::zigzag(j)) == j);
    CHECK(VLog::zigzag(-1) == 1);
    CHECK(VLog::zigzag(1) == 2);
}

TEST_CASE("vlog exp_avg_sq: nearest code whatever the range, cell contains x, zero exact, escapes") {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> U(0, 1);
    for (int16_t step : {int16_t(1), int16_t(7), int16_t(300)}) {
        const int16_t p[2] = {int16_t(-26 * 64), step};  // anchor 2^-26
        for (int i = 0; i < 20000; ++i) {
            const float x = float(std::exp2(-26 + 24 * (U(rng) - 0.5)));  // 24 octaves around the anchor
            uint16_t c;
            REQUIRE(VLog::encode(x, Role::ExpAvgSq, p, 0, &c));
            const Cell cell = VLog::cell(c, Role::ExpAvgSq, p, 0);
            CHECK(cell.lo < x);
            CHECK(x <= cell.hi);
            const int64_t j = VLog::unzigzag(uint32_t(c) - 1);
            const double d = std::fabs(x - VLog::vval(p, j));
            CHECK(d <= std::fabs(x - VLog::vval(p, j - 1)));
            CHECK(d <= std::fabs(x - VLog::vval(p, j + 1)));
        }
        uint16_t c;
        REQUIRE(VLog::encode(0.0f, Role::ExpAvgSq, p, 0, &c));
        CHECK(c == 0);
        CHECK(VLog::cell(0, Role::ExpAvgSq, p, 0).dec == 0.0);
        CHECK_FALSE(VLog::encode(-0.0f, Role::ExpAvgSq, p, 0, &c));
        CHECK_FALSE(VLog::encode(-1e-7f, Role::ExpAvgSq, p, 0, &c));
        CHECK_FALSE(VLog::encode(INFINITY, Role::ExpAvgSq, p, 0, &c));
        CHECK_FALSE(VLog::encode(std::numeric_limits<float>::quiet_NaN(), Role::ExpAvgSq, p, 0, &c));
    }
    const int16_t fine[2] = {0, 1};  // 1/1024 octave: +-32 octaves reach
    uint16_t c;
    CHECK(VLog::encode(float(std::exp2(31.9)), Role::ExpAvgSq, fine, 0, &c));
    CHECK_FALSE(VLog::encode(float(std::exp2(33)), Role::ExpAvgSq, fine, 0, &c));  // past the index range
}

TEST_CASE("vlog exp_avg: linear in m / sqrt(v~), -0 exact, sign bit") {
    const int16_t p[2] = {-7 * 1024, 0};  // step 2^-7 sqrt(v~)
    const double scale = 1e-3, d = std::exp2(-7) * scale;
    for (double q : {0.0, 0.49, 0.51, 3.2, 1000.4, -2.6}) {
        const float x = float(q * d);
        uint16_t c = 0;
        REQUIRE(VLog::encode(x, Role::ExpAvg, p, scale, &c));
        const Cell cell = VLog::cell(c, Role::ExpAvg, p, scale);
        CHECK(cell.lo <= x);
        CHECK(x <= cell.hi);
        CHECK(std::fabs(cell.dec - std::nearbyint(q) * d) <= 1e-7 * std::fabs(q * d) + 1e-30);
    }
    uint16_t c;
    REQUIRE(VLog::encode(-0.0f, Role::ExpAvg, p, scale, &c));
    CHECK(c == 1);
    CHECK(std::signbit(VLog::cell(c, Role::ExpAvg, p, scale).dec));
    CHECK_FALSE(VLog::encode(float(40000 * d), Role::ExpAvg, p, scale, &c));  // |q| past 32767
    CHECK_FALSE(VLog::encode(1e-9f, Role::ExpAvg, p, 0.0, &c));               // nonzero m with v~ = 0
}

TEST_CASE("vlog escapes much less than log8 on a 12-decade exp_avg_sq block, and says why") {
    // The wide-range pattern (Adam + L2 on rarely seen embedding rows): |m|/sqrt(v) ~ 2.9 and
    // exp_avg_sq over 12 decades inside each block. log8's fixed 255 codes cannot cover it.
    std::mt19937_64 rng(17);
    std::uniform_real_distribution<double> U(0, 1);
    const std::size_t n = 4096;
    std::vector<float> m(n), v(n);
    for (std::size_t i = 0; i < n; ++i) {
        v[i] = float(std::pow(10, -20 + 12 * U(rng)));
        m[i] = float((i % 3 ? 0.3 : 2.9) * (U(rng) < 0.5 ? -1 : 1) * std::sqrt(double(v[i])));
    }
    v[5] = std::numeric_limits<float>::quiet_NaN();
    const ChunkIn in{m.data(), v.data(), nullptr, nullptr, n};
    std::array<std::size_t, 2> esc{};
    for (int k = 0; k < 2; ++k) {
        TensorSetup s;
        s.kind = k == 0 ? Kind::Log8 : Kind::VLog;
        s.hyper.step = 1000;
        const ChunkOut o = encode_chunk(s, in);
        esc[std::size_t(k)] = o.escapes.size();
        CHECK(o.causes[0] + o.causes[1] + o.causes[2] == o.escapes.size());
        CHECK(o.causes[std::size_t(EscapeCause::NonFinite)] == 1);
        if (k == 1) CHECK(o.causes[std::size_t(EscapeCause::NoCode)] == 0);
    }
    CHECK(esc[0] > n / 10);
    CHECK(esc[1] <= n / 200);  // <= 0.5 %
}

namespace {
/// One block of Adam-like moments (seeded): exp_avg_sq over six decades, |exp_avg| below
/// sqrt(exp_avg_sq) / 2.
void adam_like_block(uint64_t seed, std::vector<float>& m, std::vector<float>& v) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> U(0, 1);
    m.resize(kBlock);
    v.resize(kBlock);
    for (std::size_t j = 0; j < std::size_t(kBlock); ++j) {
        v[j] = float(std::pow(10, -12 + 6 * U(rng)));
        m[j] = float((U(rng) - 0.5) * std::sqrt(double(v[j])));
    }
}
}  // namespace

TEST_CASE("vlog plan: float sensitivities, double for a block where float overflows") {
    // vlog_sens<float> rounds A and B differently from double; where b1 |m| / sqrt(b2 v)
    // overflows a float (B = +inf), vlog_plan must repeat the block in double.
    TensorSetup s;
    s.kind = Kind::VLog;
    s.hyper.step = 1000;
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance);
    std::vector<float> m, v;
    adam_like_block(23, m, v);
    const float* src[3] = {m.data(), v.data(), nullptr};
    auto w = std::make_unique<BlockWork<VLog>>(), ref = std::make_unique<BlockWork<VLog>>();
    for (int overflow = 0; overflow < 2; ++overflow) {
        CAPTURE(overflow);
        if (overflow) {  // |m| / sqrt(v) = 1e45: above float's range, not double's
            m[9] = 1e30f;
            v[9] = 1e-30f;
        }
        double dm = 0, delta = 0;
        REQUIRE(vlog_plan(s, gc, src, 0, kBlock, 0.9 * s.tolerance, *w, dm, delta));
        CHECK((dm > 0 && dm < INFINITY && delta > 0 && delta < INFINITY));
        // what the plan's sensitivities must be: float's, or double's after an overflow
        REQUIRE(vlog_sens<float>(gc, src, 0, kBlock, *ref));
        CHECK((ref->sens[1][9] == INFINITY) == (overflow == 1));
        if (overflow) vlog_sens<double>(gc, src, 0, kBlock, *ref);
        int live = 0;
        for (int j = 0; j < kBlock; ++j) {
            if (!w->live[j]) continue;  // dropped by the plan: zeroed
            ++live;
            CHECK(w->sens[0][j] == ref->sens[0][j]);
            CHECK(w->sens[1][j] == ref->sens[1][j]);
            CHECK(std::isfinite(w->sens[1][j]));
        }
        CHECK(live >= kBlock - 4);  // the plan drops at most 4 coordinates
    }
}

TEST_CASE("vlog plan: a tensor whose constants are no floats (beta2 = 0) is planned in double, from nothing stale") {
    TensorSetup s;
    s.kind = Kind::VLog;
    s.hyper.step = 10;
    s.hyper.beta2 = 0;  // legal in torch: b1 / sqrt(b2) is inf, so float refuses and double plans
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance);
    std::vector<float> m, v;
    adam_like_block(29, m, v);
    const float* src[3] = {m.data(), v.data(), nullptr};
    auto w = std::make_unique<BlockWork<VLog>>();
    CHECK(!vlog_sens<float>(gc, src, 0, kBlock, *w));
    double dm[2], delta[2];
    bool ok[2], live[2][kBlock];
    for (int fill = 0; fill < 2; ++fill) {  // whatever the scratch held before, the same plan
        for (int j = 0; j < kBlock; ++j) {
            w->sens[0][j] = w->sens[1][j] = fill ? std::nan("") : 1.0;
            w->live[j] = fill == 0;
        }
        ok[fill] = vlog_plan(s, gc, src, 0, kBlock, 0.9 * s.tolerance, *w, dm[fill], delta[fill]);
        std::copy(w->live, w->live + kBlock, live[fill]);
    }
    CHECK(ok[0] == ok[1]);
    CHECK(std::memcmp(&dm[0], &dm[1], sizeof(double)) == 0);
    CHECK(std::memcmp(&delta[0], &delta[1], sizeof(double)) == 0);
    CHECK(std::equal(live[0], live[0] + kBlock, live[1]));
}

TEST_CASE("vlog decoded() is cell().dec for every code kind") {
    const int16_t pv[2] = {-20 * 64, 37}, pm[2] = {-6 * 1024, 0};
    for (uint32_t c = 0; c <= 65535; c += 7) {
        const uint16_t code = uint16_t(c);
        CHECK(VLog::decoded(code, Role::ExpAvgSq, pv, 0) == VLog::cell(code, Role::ExpAvgSq, pv, 0).dec);
        const double a = VLog::decoded(code, Role::ExpAvg, pm, 3e-3), b = VLog::cell(code, Role::ExpAvg, pm, 3e-3).dec;
        CHECK(a == b);
        CHECK(std::signbit(a) == std::signbit(b));
    }
}

TEST_CASE("vlog row prediction is exactly inverted, whatever the codes and block grids") {
    std::mt19937_64 rng(23);
    for (int trial = 0; trial < 200; ++trial) {
        const std::size_t n = 1 + rng() % 3000, row = 1 + rng() % 200, blocks = (n + 63) / 64;
        std::vector<int16_t> params(2 * blocks);
        for (std::size_t b = 0; b < blocks; ++b) {
            params[2 * b] = int16_t(int(rng() % 65535) - 32767);           // any anchor
            params[2 * b + 1] = int16_t(trial % 3 == 0 ? 32767 : 1 + rng() % 400);  // any step
        }
        std::vector<uint16_t> codes(n);
        for (auto& c : codes) c = trial % 5 == 0 ? uint16_t(rng() % 65536) : rng() % 9 == 0 ? 0 : uint16_t(1 + rng() % 300);
        std::vector<uint16_t> sent = codes;
        vlog_rows(sent.data(), n, params.data(), row, true);
        for (std::size_t q = 0; q < n; ++q) CHECK((sent[q] == 0) == (codes[q] == 0));  // zeros stay zeros
        vlog_rows(sent.data(), n, params.data(), row, false);
        CHECK(sent == codes);
    }
    // a smooth per-column profile: the offsets are small
    const std::size_t row = 128, n = 128 * 64;
    std::vector<int16_t> params(2 * (n / 64));
    for (std::size_t b = 0; b < n / 64; ++b) { params[2 * b] = int16_t(-1000 + int(b)); params[2 * b + 1] = 20; }
    std::vector<uint16_t> codes(n);
    for (std::size_t q = 0; q < n; ++q) codes[q] = uint16_t(1 + VLog::zigzag(int32_t((q % row) % 40) - 20));
    vlog_rows(codes.data(), n, params.data(), row, true);
    for (std::size_t q = row; q < n; ++q) CHECK(codes[q] == 1);  // index 0 offset from the row above
}

namespace {
/// formats/container.md's row prediction, written as the format states it (int64, modulo
/// 65535, plain division): the oracle for vlog_rows' int32 / reciprocal arithmetic.
void rows_reference(uint16_t* codes, std::size_t n, const int16_t* params, std::size_t row) {
    if (row == 0 || row >= n) return;
    auto index = [](uint16_t c) -> int64_t {
        if (c == 0) return 0;
        const uint32_t z = uint32_t(c) - 1;
        return (z & 1) ? -int64_t((z + 1) >> 1) : int64_t(z >> 1);
    };
    for (std::size_t q = n; q-- > row;) {
        if (codes[q] == 0 || codes[q - row] == 0) continue;
        const int64_t sa = params[2 * ((q - row) / 64) + 1], sb = params[2 * (q / 64) + 1];
        const int64_t e = index(codes[q - row]) * sa, s = sb > 0 ? sb : 1;
        int64_t j = (e >= 0 ? e + s / 2 : e - s / 2) / s;
        j = std::clamp<int64_t>(j, -32767, 32767);
        int64_t r = ((index(codes[q]) - j) % 65535 + 65535) % 65535;
        if (r > 32767) r -= 65535;
        codes[q] = uint16_t(1 + (r >= 0 ? 2 * r : -2 * r - 1));
    }
}
}  // namespace

TEST_CASE("vlog row prediction equals the format's definition (steps of any sign and size)") {
    for (int32_t j = -32767; j <= 32767; ++j) {  // the branch-free zigzag is the format's
        const uint32_t z = VLog::zigzag(j);
        REQUIRE(z == uint32_t(j >= 0 ? 2 * j : -2 * j - 1));
        REQUIRE(VLog::unzigzag(z) == j);
    }
    std::mt19937_64 rng(29);
    for (int trial = 0; trial < 400; ++trial) {
        const std::size_t n = 1 + rng() % 4000, row = 1 + rng() % 300, blocks = (n + 63) / 64;
        std::vector<int16_t> params(2 * blocks);
        for (std::size_t b = 0; b < blocks; ++b) {
            params[2 * b] = int16_t(int(rng() % 65535) - 32767);
            const int kind = int(rng() % 6);  // equal neighbours, huge, hostile (<= 0), divisor edge cases
            params[2 * b + 1] = kind == 0 ? (b ? params[2 * b - 1] : int16_t(7)) : kind == 1 ? int16_t(32767 - rng() % 3)
                                : kind == 2 ? int16_t(-int(rng() % 32769)) : kind == 3 ? int16_t(1 + rng() % 3)
                                                                              : int16_t(1 + rng() % 32767);
        }
        std::vector<uint16_t> codes(n);
        for (auto& c : codes) c = trial % 4 == 0 ? uint16_t(rng() % 65536) : rng() % 9 == 0 ? 0 : uint16_t(65535 - rng() % 300);
        std::vector<uint16_t> a = codes, b = codes;
        vlog_rows(a.data(), n, params.data(), row, true);
        rows_reference(b.data(), n, params.data(), row);
        REQUIRE(a == b);
        vlog_rows(a.data(), n, params.data(), row, false);
        REQUIRE(a == codes);
    }
}

TEST_CASE("block decodes (restore's values, verify's bounds) give decode_coord's bit for bit (any codes, params, type)") {
    std::mt19937_64 rng(31);
    std::size_t flagged = 0;
    for (int trial = 0; trial < 80; ++trial) {
        TensorSetup s;
        s.kind = trial % 4 == 3 ? Kind::Log8 : Kind::VLog;
        s.hyper.amsgrad = trial % 2 == 1;
        s.hyper.step = double(rng() % 1000);
        s.type = trial % 3 == 0 ? MomentType::F32 : trial % 3 == 1 ? MomentType::F16 : MomentType::BF16;
        const int cb = code_bytes(s.kind), pb = params_per_block(s.kind);
        const std::size_t n = 1 + rng() % 2000, blocks = (n + 63) / 64;
        std::array<std::vector<uint8_t>, 3> codes;
        std::array<std::vector<int16_t>, 3> params;
        for (int k = 0; k < 3; ++k) {
            codes[k].resize(std::size_t(cb) * n);
            for (auto& b : codes[k]) b = uint8_t(rng());
            if (cb == 2 && trial % 8 < 4)  // small indices (cells that certify), and exact zeros
                for (std::size_t i = 0; i < n; ++i) { codes[k][2 * i] = uint8_t(rng() % 9); codes[k][2 * i + 1] = 0; }
            params[k].resize(std::size_t(pb) * blocks + 1);
            for (auto& p : params[k]) p = int16_t(rng());
            if (s.kind == Kind::VLog && trial % 8 < 4)  // plausible grids: anchors near 2^-20, steps 1..40
                for (std::size_t b = 0; b < blocks; ++b) {
                    params[k][2 * b] = int16_t(-1280 + int(rng() % 64));
                    params[k][2 * b + 1] = int16_t(1 + rng() % 40);
                    if (k == 0) params[k][2 * b] = int16_t(-8000 - int(rng() % 2000));
                }
        }
        const std::array<const uint8_t*, 3> cp{codes[0].data(), codes[1].data(), codes[2].data()};
        const std::array<const int16_t*, 3> pp{params[0].data(), params[1].data(), params[2].data()};
        // 0: decode_chunk without bounds, 1: with bounds, 2: decode_coord one coordinate at a
        // time (with bounds), 3: the same without; each path's first block with a used code
        // outside the float range (the same answer on every path)
        std::array<std::vector<float>, 4> out;
        std::array<std::vector<double>, 4> bounds;
        std::array<std::size_t, 4> bad;
        for (int path = 0; path < 4; ++path) {
            out[path].assign(3 * n, 0.0f);
            bounds[path].assign(n, 0.0);
            std::array<float*, 3> o{out[path].data(), out[path].data() + n, s.moments() == 3 ? out[path].data() + 2 * n : nullptr};
            if (path < 2) {
                bad[path] = decode_chunk(s, cp, pp, n, o, nullptr, path == 1 ? bounds[path].data() : nullptr);
            } else {
                const GuardConst gc = make_guard_const(s.hyper, s.tolerance);
                bad[path] = SIZE_MAX;
                double* bp = path == 2 ? bounds[path].data() : nullptr;
                for (std::size_t i = 0; i < n; ++i) {
                    const bool ok = s.kind == Kind::VLog ? decode_coord<VLog>(s, gc, cp.data(), pp.data(), i, o.data(), nullptr, bp)
                                                         : decode_coord<Log8>(s, gc, cp.data(), pp.data(), i, o.data(), nullptr, bp);
                    if (!ok) bad[path] = std::min(bad[path], i / 64);
                }
            }
        }
        for (int path = 1; path < 4; ++path) CHECK(bad[path] == bad[0]);
        flagged += bad[0] != SIZE_MAX;
        REQUIRE(std::memcmp(out[3].data(), out[2].data(), out[3].size() * sizeof(float)) == 0);
        REQUIRE(std::memcmp(out[0].data(), out[2].data(), out[0].size() * sizeof(float)) == 0);
        REQUIRE(std::memcmp(out[1].data(), out[2].data(), out[1].size() * sizeof(float)) == 0);
        REQUIRE(std::memcmp(bounds[1].data(), bounds[2].data(), n * sizeof(double)) == 0);
        if (trial % 8 < 4 && s.kind == Kind::VLog) {  // the closed stage was exercised
            std::size_t certified = 0;
            for (double b : bounds[1]) certified += b <= s.tolerance;
            CHECK(certified > 0);
        }
    }
    CHECK(flagged > 10);  // random parameters put some used codes outside the float range
}

namespace {
/// decode_chunk's flag for one chunk of n coordinates of `kind` (exp_avg and exp_avg_sq),
/// with and without bounds (both must agree).
std::size_t decode_flag(Kind kind, const std::array<std::vector<uint8_t>, 3>& codes, const std::array<std::vector<int16_t>, 3>& params,
                        std::size_t n) {
    TensorSetup s;
    s.kind = kind;
    s.hyper.step = 100;
    std::vector<float> out(2 * n);
    std::vector<double> bounds(n);
    const std::array<const uint8_t*, 3> cp{codes[0].data(), codes[1].data(), nullptr};
    const std::array<const int16_t*, 3> pp{params[0].data(), params[1].data(), nullptr};
    const std::size_t a = decode_chunk(s, cp, pp, n, {out.data(), out.data() + n, nullptr}, nullptr, nullptr);
    const std::size_t b = decode_chunk(s, cp, pp, n, {out.data(), out.data() + n, nullptr}, nullptr, bounds.data());
    CHECK(a == b);
    return a;
}
}  // namespace

TEST_CASE("a used code decoding outside the float range is flagged on every codec; encoder output never is") {
    // issue 52: a vlog anchor of -32768 (or log8 exponents of -32768, a blockwise8 absmax of
    // 0) decodes every nonzero code of the block to +0 with an empty cell, which the
    // certificate called exact: decode_chunk names the block, the reader refuses it
    std::mt19937_64 rng(52);
    std::lognormal_distribution<double> L(-18, 3);
    std::normal_distribution<double> N(0, 1);
    const std::size_t n = 640;
    std::vector<float> m(n), v(n);
    for (std::size_t i = 0; i < n; ++i) {
        v[i] = i % 37 == 0 ? 0.0f : float(L(rng));
        m[i] = i % 41 == 0 ? 0.0f : float(N(rng) * std::sqrt(double(v[i])));
    }
    v[100] = 1e-40f;  // subnormal values: codes in range too
    m[101] = -1e-44f;
    for (Kind kind : {Kind::VLog, Kind::Log8, Kind::BF16, Kind::Blockwise8}) {
        CAPTURE(kind_name(kind));
        TensorSetup s;
        s.kind = kind;
        s.hyper.step = 100;
        const ChunkOut o = encode_chunk(s, ChunkIn{m.data(), v.data(), nullptr, nullptr, n});
        std::array<std::vector<uint8_t>, 3> codes{o.codes[0], o.codes[1], {}};
        std::array<std::vector<int16_t>, 3> params{o.params[0], o.params[1], {}};
        for (auto& p : params) p.push_back(0);  // never empty (bf16 has no parameters)
        CHECK(decode_flag(kind, codes, params, n) == SIZE_MAX);
        auto forged = [&](int k, std::size_t block, int idx, int16_t value) {
            auto p = params;
            p[std::size_t(k)][2 * block + std::size_t(idx)] = value;
            return decode_flag(kind, codes, p, n);
        };
        if (kind == Kind::VLog) {
            CHECK(forged(1, 3, 0, INT16_MIN) == 3);  // the anchor: every nonzero code to +0
            CHECK(forged(1, 4, 0, -32767) == 4);
            CHECK(forged(1, 5, 0, 32767) == 5);     // and to inf
            CHECK(forged(1, 6, 1, 32767) == 6);     // a step of 32 octaves: the outer codes over- or underflow
            // exp_avg's exponent spans 2^-32 .. 2^32 (in range for any sqrt(v~) here): no flag,
            // a consistent forgery that only --original sees
            CHECK(forged(0, 2, 0, -32767) == SIZE_MAX);
        } else if (kind == Kind::Log8) {
            CHECK(forged(1, 3, 0, INT16_MIN) == 3);  // e_top: every nonzero code to +0
            CHECK(forged(1, 4, 0, 32767) == 4);      // and to inf
            CHECK(forged(0, 2, 0, INT16_MIN) == 2);  // exp_avg's exponent: nonzero magnitudes to +-0
        } else if (kind == Kind::Blockwise8) {
            for (int k = 0; k < 2; ++k) {
                const float bad[] = {0.0f, 1e-45f, -1.0f, INFINITY, std::numeric_limits<float>::quiet_NaN()};
                for (float a : bad) {
                    auto p = params;
                    std::memcpy(&p[std::size_t(k)][2 * 7], &a, 4);
                    CHECK(decode_flag(kind, codes, p, n) == 7);
                }
            }
        } else {  // bf16: codes of inf, NaN and negative second moments
            for (uint16_t c : {uint16_t(0x7f80), uint16_t(0x7fc1), uint16_t(0xff80), uint16_t(0xbf80)}) {
                auto cd = codes;
                cd[1][2 * 200] = uint8_t(c);
                cd[1][2 * 200 + 1] = uint8_t(c >> 8);
                CHECK(decode_flag(kind, cd, params, n) == 200 / 64);
                cd = codes;  // exp_avg: inf and NaN (negative values are fine)
                cd[0][2 * 300] = uint8_t(c);
                cd[0][2 * 300 + 1] = uint8_t(c >> 8);
                CHECK(decode_flag(kind, cd, params, n) == ((c & 0x7fff) == 0x3f80 ? SIZE_MAX : 300 / 64));
            }
        }
    }
}

TEST_CASE("block parameters the format reserves or bounds are refused (invalid_block_param)") {
    const char* rule = nullptr;
    const int16_t vlog_m[] = {-5000, 0, 300, 0, INT16_MIN, 0};
    CHECK(invalid_block_param(Kind::VLog, 0, vlog_m, 2) == SIZE_MAX);
    CHECK(invalid_block_param(Kind::VLog, 0, vlog_m, 3, &rule) == 2);  // exponent -32768: outside the encoder's range
    const int16_t vlog_m2[] = {-5000, 0, 300, 1};
    CHECK(invalid_block_param(Kind::VLog, 0, vlog_m2, 2, &rule) == 1);  // the reserved second parameter
    CHECK(std::string(rule) == "exp_avg's second parameter 0");
    const int16_t vlog_v[] = {-1000, 12, 32767, 1, INT16_MIN, 5};
    CHECK(invalid_block_param(Kind::VLog, 1, vlog_v, 2) == SIZE_MAX);
    CHECK(invalid_block_param(Kind::VLog, 1, vlog_v, 3) == 2);
    const int16_t vmax[] = {0, 0, 0, 1};
    CHECK(invalid_block_param(Kind::VLog, 2, vmax, 1) == SIZE_MAX);
    CHECK(invalid_block_param(Kind::VLog, 2, vmax, 2, &rule) == 1);
    CHECK(std::string(rule) == "max_exp_avg_sq's parameters (0, 0)");
    const int16_t log8_m[] = {-400, 0, -400, 2};
    CHECK(invalid_block_param(Kind::Log8, 0, log8_m, 1) == SIZE_MAX);
    CHECK(invalid_block_param(Kind::Log8, 0, log8_m, 2) == 1);
    const int16_t log8_v[] = {-900, 3, -900, 0};
    CHECK(invalid_block_param(Kind::Log8, 2, log8_v, 2, &rule) == 1);
    CHECK(std::string(rule) == "a step >= 1");
    int16_t bw[4];
    const float am[2] = {0.5f, -0.0f};
    std::memcpy(bw, am, 8);
    CHECK(invalid_block_param(Kind::Blockwise8, 0, bw, 1) == SIZE_MAX);
    CHECK(invalid_block_param(Kind::Blockwise8, 0, bw, 2) == 1);  // -0.0: the sign bit
}

namespace {
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
}  // namespace

TEST_CASE("vlog block quantisers give encode_v's and encode_m_value's codes and cells (any values, grids, type)") {
    std::mt19937_64 rng(41);
    std::uniform_real_distribution<double> U(0, 1);
    const float kNaN = std::numeric_limits<float>::quiet_NaN();
    std::size_t settled_by_fallback = 0, kept = 0;
    for (int trial = 0; trial < 600; ++trial) {
        const MomentType type = trial % 3 == 0 ? MomentType::F32 : trial % 3 == 1 ? MomentType::F16 : MomentType::BF16;
        const int16_t steps[] = {1, 2, 7, 40, 300, 4096, 32767};
        // anchor 2^(16 a / 1024); one trial in 10 at the anchor's ends (every value overflows or underflows)
        const int16_t p[2] = {int16_t(trial % 10 == 9 ? (trial % 20 == 9 ? 32767 : -32767) : int(rng() % 4001) - 2000),
                              steps[rng() % 7]};
        const int bn = 1 + int(rng() % 64);
        float x[2][64], m[64];
        double lg[2][64], scale[64];
        for (int k = 0; k < 2; ++k)
            for (int j = 0; j < bn; ++j) {
                const double c = p[0] / 64.0;  // the anchor's octave
                const int64_t jj = int64_t(U(rng) * 80 - 40);
                switch (rng() % 8) {
                    case 0: x[k][j] = float(std::exp2(c + (U(rng) - 0.5) * 60)); break;  // wide, past range ends
                    case 1: x[k][j] = float((VLog::vval(p, jj) + VLog::vval(p, jj + 1)) / 2); break;  // on a cell end
                    case 2: x[k][j] = std::nextafter(float((VLog::vval(p, jj) + VLog::vval(p, jj + 1)) / 2), INFINITY); break;
                    case 3: x[k][j] = float(VLog::vval(p, jj)); break;
                    case 5: {  // the index range's ends (+-32767, +-32766), on the grid and just past a cell end
                        const int64_t e = (rng() % 2 ? 1 : -1) * int64_t(VLog::kMaxIndex - int(rng() % 2));
                        const float g = float(VLog::vval(p, e)), h = float((VLog::vval(p, e) + VLog::vval(p, e + 1)) / 2);
                        x[k][j] = rng() % 2 ? g : std::nextafter(h, INFINITY);
                        break;
                    }
                    case 4: {
                        const float specials[] = {0.0f, -0.0f, -1e-7f, INFINITY, kNaN, 1e-45f, 3e38f, 1e-40f};
                        x[k][j] = specials[rng() % 8];
                        break;
                    }
                    default: x[k][j] = float(std::exp2(c + (U(rng) - 0.5) * 4)); break;
                }
                lg[k][j] = x[k][j] > 0 && std::isfinite(x[k][j]) ? log2_hd(x[k][j]) : 0.0;
            }
        // exp_avg_sq (k = 1) and max_exp_avg_sq relative to it (k = 2)
        bool keep[64], keep_ref[64];
        uint16_t code[3][64], code_ref[3][64];
        BlockCells cells;
        double settled[64];
        for (int j = 0; j < bn; ++j) keep[j] = keep_ref[j] = true;
        for (int k = 1; k <= 2; ++k) {
            vlog_code_v_block(type, x[k - 1], lg[k - 1], p, bn, k, code[1], keep, code[k], cells, settled);
            for (int j = 0; j < bn; ++j) {
                if (!keep_ref[j]) continue;
                const float v = x[k - 1][j];
                uint16_t& c = code_ref[k][j];
                Cell ref{};
                if (v > 0 && std::isfinite(v)) {
                    keep_ref[j] = VLog::encode_v(v, lg[k - 1][j], p, &c, &ref);
                    ref.dec = round_to(type, ref.dec);
                    if (k == 2 && keep_ref[j]) {
                        const int64_t d = VLog::unzigzag(uint32_t(c) - 1) - VLog::index_of(code_ref[1][j]);
                        keep_ref[j] = d >= -VLog::kMaxIndex && d <= VLog::kMaxIndex;
                        c = uint16_t(1 + VLog::zigzag(int32_t(keep_ref[j] ? d : 0)));
                    }
                } else {
                    keep_ref[j] = VLog::encode(v, Role::ExpAvgSq, p, 0, &c);
                }
                REQUIRE(keep[j] == keep_ref[j]);
                if (!keep[j]) continue;
                ++kept;
                settled_by_fallback += settled[j] == 0;
                CHECK(code[k][j] == c);
                CHECK(same_bits(cells.dec[j], ref.dec));
                CHECK(same_bits(cells.lo[j], ref.lo));
                CHECK(same_bits(cells.hi[j], ref.hi));
            }
        }
        // exp_avg in units d = unit * scale[j]
        const double unit = VLog::value(int(rng() % 20001) - 10000);
        for (int j = 0; j < bn; ++j) {
            const double r = U(rng);
            scale[j] = r < 0.05 ? 0.0 : r < 0.1 ? INFINITY : std::exp2((U(rng) - 0.5) * 40);
            const double d = unit * scale[j];
            const double q = std::floor(U(rng) * 40000);
            switch (rng() % 6) {
                case 0: m[j] = float(q * d); break;
                case 1: m[j] = float(-(q + 0.5) * d); break;  // on a cell end
                case 2: {
                    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, kNaN, 1e-45f};
                    m[j] = specials[rng() % 6];
                    break;
                }
                default: m[j] = float((U(rng) - 0.5) * 20 * d); break;
            }
            keep[j] = keep_ref[j] = rng() % 8 != 0;
        }
        vlog_code_m_block(type, m, unit, scale, bn, keep, code[0], cells, settled);
        for (int j = 0; j < bn; ++j) {
            if (!keep_ref[j]) { CHECK_FALSE(keep[j]); continue; }
            const double d = unit * scale[j];
            keep_ref[j] = VLog::encode_m_value(m[j], d, &code_ref[0][j]);
            REQUIRE(keep[j] == keep_ref[j]);
            if (!keep[j]) continue;
            ++kept;
            settled_by_fallback += settled[j] == 0;
            Cell ref = VLog::m_cell(code_ref[0][j], d);
            ref.dec = round_to(type, ref.dec);
            CHECK(code[0][j] == code_ref[0][j]);
            CHECK(same_bits(cells.dec[j], ref.dec));
            CHECK(same_bits(cells.lo[j], ref.lo));
            CHECK(same_bits(cells.hi[j], ref.hi));
        }
    }
    CHECK(kept > 20000);
    CHECK(settled_by_fallback > 100);  // both passes were exercised
    CHECK(settled_by_fallback < kept / 4);
}

TEST_CASE("vlog anchor: the rounded mean of log2 over the positive finite values (any block length)") {
    // Powers of two: log2_float is exact, so every summation order gives the same exact
    // sum and the anchor must be the serial mean's (GCC 12.2 -O3 once vectorised it wrongly).
    // Sums stay exact, so a changed lane order cannot show here; it is the same code on
    // every host and device (the ISA test compares whole containers' params).
    std::mt19937_64 rng(8);
    const float specials[] = {0.0f, -0.0f, -2.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()};
    for (int trial = 0; trial < 5000; ++trial) {
        const int n = 1 + int(rng() % 64);
        float x[64];
        double lg[64];
        int64_t sum = 0, cnt = 0;
        for (int j = 0; j < n; ++j) {
            if (rng() % 4 == 0) {
                x[j] = specials[rng() % 6];
            } else {
                const int e = int(rng() % 200) - 130;
                x[j] = std::ldexp(1.0f, e);
                sum += e;
                ++cnt;
            }
            // garbage where the value is not positive finite: the anchor must not add it
            lg[j] = x[j] > 0 && std::isfinite(x[j]) ? log2_float(x[j]) : 1e6;
        }
        // round half away from zero of 64 sum / cnt, exactly (integers)
        const int64_t num = 64 * sum, ref = cnt == 0 ? 0 : (num >= 0 ? (2 * num + cnt) / (2 * cnt) : -((-2 * num + cnt) / (2 * cnt)));
        CHECK(VLog::anchor(x, lg, n) == ref);
    }
    // the same through the library's encoder, as compiled there (-O3), at every ISA level
    auto ref_anchor = [](const int64_t sum, const int64_t cnt) {
        const int64_t num = 64 * sum;
        return cnt == 0 ? 0 : (num >= 0 ? (2 * num + cnt) / (2 * cnt) : -((-2 * num + cnt) / (2 * cnt)));
    };
    const std::size_t n = 64 * 40 + 17;
    std::vector<float> m(n), v(n);
    std::vector<int64_t> sum(n / 64 + 1), cnt(n / 64 + 1);
    for (std::size_t i = 0; i < n; ++i) {
        if (rng() % 4 == 0) {
            v[i] = specials[rng() % 6];
        } else {
            const int e = int(rng() % 60) - 50;
            v[i] = std::ldexp(1.0f, e);
            sum[i / 64] += e;
            ++cnt[i / 64];
        }
        m[i] = 0.01f * std::sqrt(std::fabs(v[i]));
    }
    TensorSetup s;
    s.kind = Kind::VLog;
    s.hyper.step = 50;
    const ChunkIn in{m.data(), v.data(), nullptr, nullptr, n};
    const Isa before = active_isa();
    for (Isa i : {Isa::Baseline, Isa::AVX2, Isa::AVX512}) {
        if (!isa_supported(i)) continue;
        set_isa(i);
        const ChunkOut o = encode_chunk(s, in);
        for (std::size_t b = 0; b * 64 < n; ++b) CHECK(o.params[1][2 * b] == ref_anchor(sum[b], cnt[b]));
    }
    set_isa(before);
}

TEST_CASE("block_max and block_max_affine give a serial scan's maxima bit for bit (NaN, inf, -0, ties)") {
    std::mt19937_64 rng(12);
    std::lognormal_distribution<double> L(0, 3);
    const double specials[] = {NAN, -NAN, INFINITY, -INFINITY, -0.0, 0.0, -1.0, 1e-300, 5e-324};
    for (int trial = 0; trial < 2000; ++trial) {
        const int n = 4 * int(1 + rng() % 16);
        double A[64], B[64];
        for (int j = 0; j < n; ++j) {
            A[j] = rng() % 5 == 0 ? specials[rng() % 9] : L(rng);
            B[j] = rng() % 5 == 0 ? specials[rng() % 9] : L(rng);
            if (rng() % 7 == 0 && j > 0) A[j] = A[j - 1], B[j] = B[j - 1];  // ties
        }
        if (trial % 3 == 0)  // the plan's use: A, B >= 0 and finite
            for (int j = 0; j < n; ++j) {
                if (!(A[j] >= 0) || !(A[j] < INFINITY)) A[j] = 0;
                if (!(B[j] >= 0) || !(B[j] < INFINITY)) B[j] = 0;
            }
        double m = 0;  // the serial scan: strict compares from +0
        for (int j = 0; j < n; ++j) m = A[j] > m ? A[j] : m;
        const double got = block_max(A, n);
        CHECK(std::memcmp(&got, &m, 8) == 0);
        const double r[5] = {0.5 * L(rng), L(rng), 1.0, 2 * L(rng), INFINITY};
        double out[5];
        block_max_affine<5>(A, B, n, r, out);
        for (int k = 0; k < 5; ++k) {
            double w = 0;
            for (int j = 0; j < n; ++j) {
                const double c = A[j] * r[k] + B[j];
                w = c > w ? c : w;
            }
            CHECK(std::memcmp(&out[k], &w, 8) == 0);
        }
    }
}

TEST_CASE("every instruction-set level gives the same codes, params, escapes, bounds and values (every codec)") {
    std::mt19937_64 rng(9);
    std::lognormal_distribution<double> L(-14, 4);
    std::normal_distribution<double> N(0, 1);
    const std::size_t n = 3 * 16384 + 77;
    std::vector<float> m(n), v(n), vmax(n), theta(n);
    for (std::size_t i = 0; i < n; ++i) {
        v[i] = i % 97 == 0 ? 0.0f : float(L(rng));
        vmax[i] = float(double(v[i]) * (1 + (i % 3) * 0.5 * std::fabs(N(rng))));
        m[i] = i % 89 == 0 ? -0.0f : float((i % 5 == 0 ? 3 : 0.3) * N(rng) * std::sqrt(double(v[i])));
        theta[i] = float(N(rng));
    }
    m[5] = INFINITY;
    v[6] = std::numeric_limits<float>::quiet_NaN();
    std::vector<Isa> levels;
    for (Isa i : {Isa::Baseline, Isa::AVX2, Isa::AVX512})
        if (isa_supported(i)) levels.push_back(i);
    MESSAGE("instruction-set levels compared: " << levels.size());
    const Isa before = active_isa();
    for (int c = 0; c < 8; ++c) {
        TensorSetup s;
        s.kind = c % 4 == 0 ? Kind::Log8 : c % 4 == 1 ? Kind::BF16 : c % 4 == 2 ? Kind::Blockwise8 : Kind::VLog;
        s.hyper.step = 50;
        s.hyper.amsgrad = c >= 4;
        s.hyper.weight_decay = c >= 4 ? 0.01 : 0.0;
        s.domain.l2 = c >= 4;
        s.domain.weight_decay = s.hyper.weight_decay;
        s.type = c == 7 ? MomentType::F16 : MomentType::F32;
        const ChunkIn in{m.data(), v.data(), s.hyper.amsgrad ? vmax.data() : nullptr, theta.data(), n};
        const int nm = s.moments();
        std::vector<ChunkOut> outs;
        std::vector<std::vector<double>> bounds;
        std::vector<std::vector<float>> values[2];  // with bounds (verify) and without (restore)
        for (Isa i : levels) {
            set_isa(i);
            outs.push_back(encode_chunk(s, in));
            const ChunkOut& o = outs.back();
            const std::array<const uint8_t*, 3> cp{o.codes[0].data(), o.codes[1].data(), nm == 3 ? o.codes[2].data() : nullptr};
            const std::array<const int16_t*, 3> pp{o.params[0].data(), o.params[1].data(), nm == 3 ? o.params[2].data() : nullptr};
            bounds.emplace_back(n);
            for (int path = 0; path < 2; ++path) {
                values[path].emplace_back(3 * n);
                float* d = values[path].back().data();
                decode_chunk(s, cp, pp, n, {d, d + n, nm == 3 ? d + 2 * n : nullptr}, theta.data(),
                             path == 0 ? bounds.back().data() : nullptr);
            }
        }
        for (std::size_t l = 1; l < levels.size(); ++l) {
            for (int k = 0; k < nm; ++k) {
                CHECK(outs[l].codes[k] == outs[0].codes[k]);
                CHECK(outs[l].params[k] == outs[0].params[k]);
            }
            CHECK(outs[l].escapes == outs[0].escapes);
            CHECK(outs[l].causes == outs[0].causes);
            CHECK(std::memcmp(&outs[l].max_bound, &outs[0].max_bound, sizeof(double)) == 0);
            CHECK(std::memcmp(bounds[l].data(), bounds[0].data(), n * sizeof(double)) == 0);
            for (int path = 0; path < 2; ++path)
                CHECK(std::memcmp(values[path][l].data(), values[path][0].data(), 3 * n * sizeof(float)) == 0);
        }
        CHECK(!outs[0].escapes.empty());  // the non-finite coordinates at least
    }
    set_isa(before);
}
