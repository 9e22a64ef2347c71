// Exact properties of the three quantizers: zero and sign exactness, cells contain the
// encoded value, nearest-code rounding, escapes for non-finite values, the bnb map.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>

#include "codec/bf16.h"
#include "codec/blockwise8.h"
#include "codec/codec.h"
#include "codec/log8.h"

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

TEST_CASE("log8 encode: cell contains x, nearest code, zeros and signs exact") {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> U(-1, 1);
    float x[256], v[256];
    for (int i = 0; i < 256; ++i) { x[i] = U(rng) * 1e-3f; v[i] = 1e-6f; }
    x[3] = 0.0f;
    x[4] = -0.0f;
    int32_t p[2];
    Log8::choose(x, v, 256, Role::ExpAvg, 0.01, p);
    CHECK(p[1] >= 1);
    for (int i = 0; i < 256; ++i) {
        uint16_t c;
        REQUIRE(Log8::encode(x[i], Role::ExpAvg, p, &c));
        const Cell cell = Log8::cell(c, Role::ExpAvg, p);
        CHECK(cell.lo <= x[i]);
        CHECK(x[i] <= cell.hi);
        if (x[i] == 0) {
            CHECK(cell.dec == 0);
            CHECK(std::signbit(cell.dec) == std::signbit(x[i]));
            CHECK(cell.lo == 0);
            CHECK(cell.hi == 0);
        }
        // nearest: the neighbours are no closer
        const int k = c & 0x7f;
        if (k > 1 && k < 127) {
            const double d = std::fabs(std::fabs(x[i]) - Log8::mag(k, p, 127));
            CHECK(d <= std::fabs(std::fabs(x[i]) - Log8::mag(k - 1, p, 127)));
            CHECK(d <= std::fabs(std::fabs(x[i]) - Log8::mag(k + 1, p, 127)));
        }
    }
    uint16_t c;
    CHECK_FALSE(Log8::encode(std::numeric_limits<float>::quiet_NaN(), Role::ExpAvg, p, &c));
    CHECK_FALSE(Log8::encode(INFINITY, Role::ExpAvgSq, p, &c));
    CHECK_FALSE(Log8::encode(-1e-7f, Role::ExpAvgSq, p, &c));  // negative second moment
    CHECK_FALSE(Log8::encode(1.0f, Role::ExpAvg, p, &c));      // above the top cell
}

TEST_CASE("bf16 is round-to-nearest-even and cells are half-ulp") {
    uint16_t c;
    REQUIRE(BF16::encode(1.0f + 1.0f / 256, Role::ExpAvg, nullptr, &c));  // tie -> even (1.0)
    CHECK(c == 0x3f80);
    REQUIRE(BF16::encode(1.0f + 3.0f / 256, Role::ExpAvg, nullptr, &c));  // tie -> even (up)
    CHECK(c == 0x3f82);
    const Cell cell = BF16::cell(0x3f80, Role::ExpAvg, nullptr);
    CHECK(cell.dec == 1.0);
    CHECK(cell.hi == 1.0 + 1.0 / 256);
    CHECK(cell.lo == 1.0 - 1.0 / 512);
    CHECK_FALSE(BF16::encode(1e-45f, Role::ExpAvg, nullptr, &c));  // would flush to zero
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
