// GPU vs CPU: encode_chunk_gpu / decode_chunk_gpu must equal encode_chunk / decode_chunk
// byte for byte (codes, block params, escapes, max bound, decoded values, certificates)
// on seeded Adam-like moments plus adversarial values: NaN, +-inf, zeros, -0.0,
// subnormals, negative exp_avg_sq, and values on and one float next to the CPU codec's
// decoded grid. Chunks span several device slices (double buffering) and ragged blocks.
// Without a device this binary prints the reason and exits 77 (CTest: skipped).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "codec/block.h"
#include "cuda/gpu_codec.h"

using namespace ckpt::codec;
using ckpt::gpu::decode_chunk_gpu;
using ckpt::gpu::encode_chunk_gpu_ex;

namespace {

// Runs before doctest's main: no device -> exit 77 with the reason.
const bool g_have_gpu = [] {
    std::string why;
    if (!ckpt::gpu::gpu_available(&why)) {
        std::printf("test_cuda_gpu: SKIPPED: no CUDA device (%s)\n", why.c_str());
        std::fflush(stdout);
        std::_Exit(77);
    }
    return true;
}();

struct Moments {
    std::vector<float> m, v, vmax, theta;
};

uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

Moments make(std::size_t n, uint64_t seed, bool adversarial) {
    std::mt19937_64 g(seed);
    std::normal_distribution<double> z(0, 1);
    Moments x;
    x.m.resize(n); x.v.resize(n); x.vmax.resize(n); x.theta.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double scale = std::pow(10.0, -4 + 2 * ((i / 4096) % 3));  // tensors of different scale
        const double v = scale * scale * std::exp(2 * z(g));
        x.v[i] = float(v);
        x.m[i] = float(0.3 * std::sqrt(v) * z(g));
        x.vmax[i] = float(v * (1 + std::fabs(z(g))));
        x.theta[i] = float(0.05 * z(g));
    }
    if (!adversarial) return x;
    const float specials[] = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 1e-45f, -1e-45f, 1.17549435e-38f,
                              3.4028235e38f, -3.4028235e38f, 1e30f, 1e-30f, -1e-8f, 65504.0f, 6.1e-5f};
    for (std::size_t i = 0; i < n; i += 7) {
        const float s = specials[g() % (sizeof specials / sizeof *specials)];
        switch (g() % 4) {
            case 0: x.m[i] = s; break;
            case 1: x.v[i] = s; break;
            case 2: x.vmax[i] = s; break;
            default: x.theta[i] = s; break;
        }
    }
    for (std::size_t b = 0; b < n; b += 3 * kBlock) {  // whole blocks of zeros / one value
        const std::size_t e = std::min(n, b + kBlock);
        for (std::size_t i = b; i < e; ++i) {
            if ((b / kBlock) % 2) { x.m[i] = 0; x.v[i] = 0; x.vmax[i] = 0; }
            else { x.v[i] = 1e-6f; x.vmax[i] = 1e-6f; }
        }
    }
    return x;
}

TensorSetup setup(Kind k, int variant) {
    TensorSetup s;
    s.kind = k;
    s.hyper.step = double(10 + 97 * variant);
    s.hyper.amsgrad = variant % 2 == 1;
    s.hyper.beta2 = variant % 3 == 2 ? 0.95 : 0.999;
    s.tolerance = variant % 4 == 3 ? 0.002 : 0.01;
    s.domain.grad_bound = variant % 3 == 1 ? INFINITY : 1.0;
    if (variant % 5 == 2) {  // Adam L2 (union with AdamW)
        s.domain.l2 = true;
        s.domain.weight_decay = 0.01;
        s.domain.theta_bound = 2.0;
    }
    s.type = variant % 7 == 5 ? MomentType::F16 : variant % 7 == 6 ? MomentType::BF16 : MomentType::F32;
    return s;
}

ChunkIn chunk(const Moments& x, const TensorSetup& s, std::size_t n, bool theta) {
    ChunkIn in;
    in.m = x.m.data();
    in.v = x.v.data();
    in.vmax = s.hyper.amsgrad ? x.vmax.data() : nullptr;
    in.theta = theta ? x.theta.data() : nullptr;
    in.n = n;
    return in;
}

bool same_double(double a, double b) { return std::memcmp(&a, &b, 8) == 0; }

/// Moments moved onto the CPU codec's decoded grid (and one float either side).
void to_cell_edges(Moments& x, const TensorSetup& s, const ChunkOut& co, std::size_t n, uint64_t seed) {
    std::mt19937_64 g(seed);
    const int nm = s.moments();
    std::vector<float> dec[3];
    std::array<float*, 3> out{};
    for (int k = 0; k < nm; ++k) { dec[k].resize(n); out[k] = dec[k].data(); }
    decode_chunk(s, {co.codes[0].data(), co.codes[1].data(), nm == 3 ? co.codes[2].data() : nullptr},
                 {co.params[0].data(), co.params[1].data(), nm == 3 ? co.params[2].data() : nullptr}, n, out,
                 nullptr, nullptr);
    for (std::size_t i = 0; i < n; i += 3) {
        const int k = int(g() % nm);
        std::vector<float>& dst = k == 0 ? x.m : k == 1 ? x.v : x.vmax;
        const float d = dec[k][i];
        if (!std::isfinite(d) || d == 0) continue;
        // the decoded value, one float away, or (exp_avg_sq / max_exp_avg_sq) an end of
        // the code's rounding cell, where rounding flips between neighbouring codes
        const int pick = int(g() % 5);
        if (pick < 3) {
            dst[i] = pick == 0 ? d : std::nextafter(d, pick == 1 ? INFINITY : -INFINITY);
            continue;
        }
        if (k == 0) continue;
        const int cb = code_bytes(s.kind), pb = params_per_block(s.kind);
        const uint16_t code = load_code(co.codes[k].data(), cb, i);
        const int16_t* p = co.params[k].data() + (i / kBlock) * pb;
        const Role r = role_of(k);
        const Cell c = s.kind == Kind::Log8 ? Log8::cell(code, r, p, 0.0)
                       : s.kind == Kind::VLog ? VLog::cell(code, r, p, 0.0)
                       : s.kind == Kind::BF16 ? BF16::cell(code, r, p, 0.0) : Blockwise8::cell(code, r, p, 0.0);
        dst[i] = float(pick == 3 ? c.lo : c.hi);
    }
}

void compare(const TensorSetup& s, const Moments& x, std::size_t n, bool theta) {
    const ChunkIn in = chunk(x, s, n, theta);
    const ChunkOut c = encode_chunk(s, in);
    ckpt::gpu::EscapeBits bits;
    const ChunkOut g = encode_chunk_gpu_ex(s, in, &bits);
    const int nm = s.moments();
    for (int k = 0; k < 3; ++k) {
        CHECK(c.codes[k] == g.codes[k]);
        CHECK(c.params[k] == g.params[k]);
    }
    CHECK(c.escapes == g.escapes);
    CHECK(same_double(c.max_bound, g.max_bound));
    const float* src[3] = {in.m, in.v, in.vmax};
    for (int k = 0; k < nm; ++k) {
        REQUIRE(bits[k].size() == g.escapes.size());
        for (std::size_t e = 0; e < g.escapes.size(); ++e)
            if (bits[k][e] != float_bits(src[k][g.escapes[e]])) { CHECK(bits[k][e] == float_bits(src[k][g.escapes[e]])); break; }
    }
    // decode, with and without certificates
    std::vector<float> dc[3], dg[3];
    std::array<float*, 3> oc{}, og{};
    for (int k = 0; k < nm; ++k) {
        dc[k].assign(n, 1.0f); dg[k].assign(n, 2.0f);
        oc[k] = dc[k].data(); og[k] = dg[k].data();
    }
    std::vector<double> bc(n, 1.0), bg(n, 2.0);
    const std::array<const uint8_t*, 3> cp = {c.codes[0].data(), c.codes[1].data(), nm == 3 ? c.codes[2].data() : nullptr};
    const std::array<const int16_t*, 3> pp = {c.params[0].data(), c.params[1].data(), nm == 3 ? c.params[2].data() : nullptr};
    CHECK(decode_chunk(s, cp, pp, n, oc, in.theta, bc.data()) == SIZE_MAX);  // encoder output: in range
    CHECK(decode_chunk_gpu(s, cp, pp, n, og, in.theta, bg.data()) == SIZE_MAX);
    for (int k = 0; k < nm; ++k) CHECK(std::memcmp(dc[k].data(), dg[k].data(), n * 4) == 0);
    CHECK(std::memcmp(bc.data(), bg.data(), n * 8) == 0);
    CHECK(decode_chunk_gpu(s, cp, pp, n, og, nullptr, nullptr) == SIZE_MAX);
    for (int k = 0; k < nm; ++k) CHECK(std::memcmp(dc[k].data(), dg[k].data(), n * 4) == 0);
    // issue 52: a forged block (the last one with a nonzero exp_avg_sq code) whose nonzero
    // codes decode outside the float range: both backends name it (its slice offset included)
    const int cb = code_bytes(s.kind), pb = params_per_block(s.kind);
    std::size_t last = SIZE_MAX;
    for (std::size_t i = 0; i < n; ++i)
        if (load_code(c.codes[1].data(), cb, i) != 0) last = i;
    REQUIRE(last != SIZE_MAX);
    const std::size_t b = last / kBlock;
    std::vector<uint8_t> fc1 = c.codes[1];
    std::vector<int16_t> fp1 = c.params[1];
    if (s.kind == Kind::BF16) {
        store_code(fc1.data(), cb, last, 0x7f80);  // +inf
    } else if (s.kind == Kind::Blockwise8) {
        std::memset(fp1.data() + b * std::size_t(pb), 0, 4);  // absmax 0: every nonzero code to 0 with an empty cell
    } else {
        fp1[b * std::size_t(pb)] = INT16_MIN;  // log8 e_top / vlog anchor: every nonzero code to +0
    }
    const std::array<const uint8_t*, 3> fcp = {cp[0], fc1.data(), cp[2]};
    const std::array<const int16_t*, 3> fpp = {pp[0], fp1.data(), pp[2]};
    CHECK(decode_chunk(s, fcp, fpp, n, oc, in.theta, bc.data()) == b);
    CHECK(decode_chunk(s, fcp, fpp, n, oc, nullptr, nullptr) == b);
    CHECK(decode_chunk_gpu(s, fcp, fpp, n, og, in.theta, bg.data()) == b);
    CHECK(decode_chunk_gpu(s, fcp, fpp, n, og, nullptr, nullptr) == b);
}

}  // namespace

TEST_CASE("GPU encode/decode equal the CPU byte for byte: seeded moments, all codecs and settings") {
    const Kind kinds[4] = {Kind::VLog, Kind::Log8, Kind::BF16, Kind::Blockwise8};
    const Moments x = make(700001, 42, false);  // > 2 device slices, ragged last block
    for (Kind k : kinds)
        for (int variant = 0; variant < 7; ++variant) {
            CAPTURE(kind_name(k));
            CAPTURE(variant);
            const TensorSetup s = setup(k, variant);
            compare(s, x, variant == 0 ? x.m.size() : 100000 + 13 * variant, s.domain.l2);
        }
}

TEST_CASE("GPU equals CPU on adversarial values and cell edges") {
    const Kind kinds[4] = {Kind::VLog, Kind::Log8, Kind::BF16, Kind::Blockwise8};
    for (Kind k : kinds)
        for (int variant = 0; variant < 14; ++variant) {
            CAPTURE(kind_name(k));
            CAPTURE(variant);
            const TensorSetup s = setup(k, variant);
            Moments x = make(300007, 1000 + variant, true);
            const std::size_t n = x.m.size();
            compare(s, x, n, variant % 2 == 0);
            const ChunkOut co = encode_chunk(s, chunk(x, s, n, false));
            to_cell_edges(x, s, co, n, 77 + variant);
            compare(s, x, n, variant % 2 == 0);
        }
}

TEST_CASE("GPU handles empty and tiny chunks") {
    const Moments x = make(130, 5, true);
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(63), std::size_t(64), std::size_t(65), std::size_t(130)})
        compare(setup(Kind::Log8, 1), x, n, false);
}
