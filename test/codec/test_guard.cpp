// Soundness of the guard: for >= 10^6 random and adversarial (m, v[, vmax]) coordinates,
// every coordinate the codec keeps has its true sup |u - u~| / lr, evaluated in FP32 the
// way torch computes it and for originals anywhere in the rounding cells (cell corners),
// at or below its certificate.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/guard.h"
#include "chunk_roundtrip.h"
#include "codec/vlog.h"

using namespace ckpt::codec;

namespace {

/// The update in lr units as torch 1.13 _single_tensor_adam computes it in FP32.
float torch_update(const AdamHyper& h, float m, float v, float vmax, float g) {
    const double t = h.step + 1;
    const float b1 = float(h.beta1), b2 = float(h.beta2);
    const float mm = m * b1 + g * float(1 - h.beta1);
    const float vv = v * b2 + g * g * float(1 - h.beta2);
    const float vm = h.amsgrad ? std::max(vmax, vv) : vv;
    const double bc1 = 1 - std::pow(h.beta1, t), bc2s = std::sqrt(1 - std::pow(h.beta2, t));
    const float denom = std::sqrt(vm) / float(bc2s) + float(h.eps);
    return float(1.0 / bc1) * (mm / denom);
}

/// Gradients to probe in [lo, hi]: ends, zero, a log grid around sqrt(v), random.
std::vector<float> probes(double lo, double hi, double scale, std::mt19937_64& rng) {
    std::vector<float> g;
    auto add = [&](double x) { if (x >= lo && x <= hi && std::isfinite(x)) g.push_back(float(x)); };
    add(lo); add(hi); add(0);
    for (double k = -4; k <= 6; k += 0.125) { add(scale * std::pow(10, k)); add(-scale * std::pow(10, k)); }
    std::uniform_real_distribution<double> u(std::isfinite(lo) ? lo : -1e3, std::isfinite(hi) ? hi : 1e3);
    for (int i = 0; i < 8; ++i) add(u(rng));
    return g;
}

}  // namespace

TEST_CASE("guard is sound for every kept coordinate, all codecs, random + adversarial") {
    std::mt19937_64 rng(12345);
    std::uniform_real_distribution<double> U(0, 1);
    long checked = 0, kept = 0, violations = 0, triples = 0, vlog_triples = 0;
    const Kind kinds[5] = {Kind::Log8, Kind::VLog, Kind::BF16, Kind::VLog, Kind::Blockwise8};
    for (int trial = 0; triples < 2'500'000 || vlog_triples < 1'000'000; ++trial) {
        TensorSetup s;
        s.kind = kinds[trial % 5];
        s.hyper.beta1 = trial % 5 == 0 ? 0.8 : 0.9;
        s.hyper.beta2 = trial % 7 == 0 ? 0.99 : 0.999;
        s.hyper.eps = trial % 4 == 0 ? 1e-6 : 1e-8;
        s.hyper.step = double(1 + (trial * 37) % 3000);
        s.hyper.amsgrad = trial % 6 == 0;
        s.tolerance = trial % 2 ? 0.01 : 0.003;
        s.domain.grad_bound = trial % 3 == 1 ? INFINITY : std::pow(10, -3 + 3 * U(rng));
        const std::size_t n = 1024;
        std::vector<float> m(n), v(n), vm(n);
        const double vscale = std::pow(10, -12 + 8 * U(rng));
        for (std::size_t i = 0; i < n; ++i) {
            v[i] = float(vscale * std::pow(10, 3 * (U(rng) - 0.5)));
            const double rho = std::pow(10, -3 + 3 * U(rng)) * (U(rng) < 0.5 ? -1 : 1);
            m[i] = float(rho * std::sqrt(double(v[i])));
            vm[i] = float(v[i] * (1 + U(rng)));
            if (i % 97 == 0) m[i] = 0;
            if (i % 89 == 0) { m[i] = 0; v[i] = 0; vm[i] = 0; }
        }
        const ChunkRoundtrip rt = encode_decode(s, m, v, vm);
        const auto& dec = rt.dec;
        const auto& bounds = rt.bounds;
        const auto& esc = rt.esc;
        for (std::size_t i = 0; i < n; ++i) {
            ++checked;
            if (esc[i]) continue;
            ++kept;
            REQUIRE(bounds[i] <= s.tolerance);
            const double G = s.domain.grad_bound;
            for (float g : probes(-G, G, std::sqrt(double(v[i])) + 1e-30, rng)) {
                const float ut = torch_update(s.hyper, dec[0][i], dec[1][i], dec[2][i], g);
                const float u = torch_update(s.hyper, m[i], v[i], vm[i], g);
                ++triples;
                vlog_triples += s.kind == Kind::VLog;
                if (std::fabs(double(u) - ut) > bounds[i]) ++violations;
            }
        }
    }
    CHECK(violations == 0);
    CHECK(kept > checked / 4);  // the test must exercise the kept path, not only escapes
    CHECK(triples >= 1'000'000);
    CHECK(vlog_triples >= 1'000'000);
    MESSAGE("checked " << checked << " coordinates, kept " << kept << ", " << triples << " (m, v, g) triples");
}

TEST_CASE("certificate holds for originals at the rounding-cell corners") {
    // The certificate is a function of the codes: any original inside the cells must pass.
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> U(0, 1);
    AdamHyper h;
    h.step = 99;
    const GuardConst gc = make_guard_const(h, 0.01);
    long violations = 0, kept = 0;
    for (int t = 0; t < 20000; ++t) {
        const double v = std::pow(10, -10 + 6 * U(rng));
        const double dv = v * 0.02 * U(rng), mt = (U(rng) - 0.5) * 2 * std::sqrt(v);
        const double dm = std::fabs(mt) * 0.03 * U(rng);
        GuardInput in;
        in.m = {mt, mt - dm, mt + dm};
        in.v = {v, v - dv, v + dv};
        in.glo = t % 2 ? -INFINITY : -1;
        in.ghi = t % 2 ? INFINITY : 1;
        const double b = certify(gc, in);
        if (!(b <= 0.01)) continue;
        ++kept;
        for (double mo : {in.m.lo, in.m.hi})
            for (double vo : {in.v.lo, in.v.hi})
                for (double gk = -6; gk <= 8; gk += 0.1)
                    for (double sg : {-1.0, 1.0}) {
                        const float g = float(sg * std::sqrt(v) * std::pow(10, gk / 2));
                        if (g < in.glo || g > in.ghi) continue;
                        const float du = torch_update(h, float(mo), float(vo), 0, g) -
                                         torch_update(h, float(mt), float(v), 0, g);
                        if (std::fabs(du) > b) ++violations;
                    }
    }
    CHECK(kept > 1000);
    CHECK(violations == 0);
}

TEST_CASE("infinite gradient bound: difference vanishes in the tail, bound stays finite") {
    AdamHyper h;
    h.step = 10;
    const GuardConst gc = make_guard_const(h, 0.01);
    GuardInput in;
    in.m = {1e-3, 0.999e-3, 1.001e-3};
    in.v = {1e-6, 0.999e-6, 1.001e-6};
    in.glo = -INFINITY;
    in.ghi = INFINITY;
    const double b = certify(gc, in);
    CHECK(std::isfinite(b));
    CHECK(b <= 0.01);
    // exact zeros are exact: zero error
    GuardInput z;
    z.glo = -INFINITY;
    z.ghi = INFINITY;
    CHECK(certify(gc, z) == doctest::Approx(0).epsilon(1e-12));
}

TEST_CASE("each stage of certify bounds the sup on its own; the fast-fail point is a lower bound") {
    // closed_bound and the refined partition (no early stop) must each be >= the exact
    // sup over the cell corners and a dense gradient grid; the point values certify uses to
    // fail fast must be <= the partition's bound.
    std::mt19937_64 rng(99);
    std::uniform_real_distribution<double> U(0, 1);
    long checked = 0, closed_finite = 0;
    for (int t = 0; t < 4000; ++t) {
        AdamHyper h;
        h.step = double(1 + t % 500);
        h.beta2 = t % 3 ? 0.999 : 0.95;
        h.amsgrad = t % 5 == 0;
        const GuardConst gc = make_guard_const(h, 0.01);
        const double v = std::pow(10, -14 + 10 * U(rng));
        const double rv = 0.05 * U(rng), rm = 0.05 * U(rng);
        const double mt = (U(rng) - 0.5) * 4 * std::sqrt(v), dmh = std::fabs(mt) * rm + 1e-3 * std::sqrt(v) * U(rng);
        GuardInput in;
        in.amsgrad = h.amsgrad;
        in.m = {mt, mt - dmh, mt + dmh};
        in.v = {v, v * (1 - rv), v * (1 + rv)};
        const double vx = v * (1 + U(rng));
        in.vmax = {vx, vx * (1 - rv), vx * (1 + rv)};
        in.glo = t % 2 ? -INFINITY : -std::pow(10, -4 + 4 * U(rng));
        in.ghi = t % 2 ? INFINITY : -in.glo;
        const double dm = dmh, dv = std::max(v * rv * gc.b2, h.amsgrad ? vx * rv : 0.0);
        const double closed = closed_bound(gc, in, dm, dv);
        const double sigma = std::sqrt(std::max(in.v.hi, h.amsgrad ? in.vmax.hi : 0.0));
        const double part = std::max(side_bound(gc, in, dm, dv, sigma, +1, INFINITY),
                                     side_bound(gc, in, dm, dv, sigma, -1, INFINITY));
        double sup = 0;
        for (double mo : {in.m.lo, in.m.hi})
            for (double vo : {in.v.lo, in.v.hi})
                for (double xo : {in.vmax.lo, in.vmax.hi})
                    for (double gk = -8; gk <= 10; gk += 0.02)
                        for (double sg : {-1.0, 1.0}) {
                            const double g = sg * std::sqrt(v) * std::pow(10, gk / 2);
                            if (g < in.glo || g > in.ghi) continue;
                            sup = std::max(sup, std::fabs(update_lr(gc, mo, vo, xo, h.amsgrad, g) -
                                                          update_lr(gc, mt, v, vx, h.amsgrad, g)));
                        }
        ++checked;
        REQUIRE(part >= sup * (1 - 1e-9));
        if (std::isfinite(closed)) {
            ++closed_finite;
            REQUIRE(closed >= sup * (1 - 1e-9));
        }
        for (double g : {0.0, 0.3 * sigma, -2 * sigma, 30 * sigma}) {
            if (g < in.glo || g > in.ghi) continue;
            REQUIRE(cell_bound(gc, in, dm, dv, g, g) <= part * (1 + 1e-12));
        }
    }
    CHECK(closed_finite == checked);  // v.lo > 0 everywhere here
}

TEST_CASE("FP32 edges: overflow, subnormal exp_avg_sq and small beta2 stay sound in FP32") {
    // Coordinates at the end of float32 range (exp_avg_sq up to 3e38, gradients up to 1e30
    // with G = inf, where b2*v + (1-b2)*g^2 overflows in one state and not the other) and at
    // its start (exp_avg_sq of a few subnormal ulps, where fl(b2*v) rounds absolutely), for
    // beta2 in {0.5, 0.9, 0.999}: every kept coordinate's FP32 update differs by at most its
    // certificate; the gate (guard.h fp32_gate) escapes the ones it cannot show. Subnormal
    // states are kept only where eps * S_1 >= 2^-50 (format 6: torch's absolute roundings move
    // D >= eps by under one FP32 ulp), here the eps = 1e-8 trials, else they escape (eps = 0).
    std::mt19937_64 rng(2024);
    std::uniform_real_distribution<double> U(0, 1);
    long kept = 0, violations = 0, triples = 0, escaped_edge = 0, kept_subnormal = 0;
    const Kind kinds[4] = {Kind::Log8, Kind::BF16, Kind::Blockwise8, Kind::VLog};
    for (int trial = 0; trial < 48; ++trial) {
        TensorSetup s;
        s.kind = kinds[trial % 4];
        s.hyper.beta2 = (trial / 4) % 3 == 0 ? 0.5 : (trial / 4) % 3 == 1 ? 0.9 : 0.999;
        s.hyper.eps = trial % 2 ? 0.0 : 1e-8;
        s.hyper.step = 10;
        s.tolerance = 0.01;
        s.domain.grad_bound = INFINITY;
        const bool high = trial % 4 < 2;
        const std::size_t n = 512;
        std::vector<float> m(n), v(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (high) v[i] = float(std::pow(10, 28 + 10.5 * U(rng)));       // 1e28 .. 3e38
            else v[i] = float(1.401298464324817e-45 * std::floor(1 + 900 * U(rng)));  // subnormal
            if (i % 7 == 0) v[i] = float(high ? 1e30 : 2e-38);              // near the gate edges
            m[i] = float((U(rng) - 0.5) * 5 * std::sqrt(double(v[i])));
        }
        ChunkIn in{m.data(), v.data(), nullptr, nullptr, n};
        const ChunkOut out = encode_chunk(s, in);
        std::vector<double> bounds(n);
        std::array<std::vector<float>, 3> dec;
        for (auto& d : dec) d.assign(n, 0);
        decode_chunk(s, {out.codes[0].data(), out.codes[1].data(), nullptr}, {out.params[0].data(), out.params[1].data(), nullptr},
                     n, {dec[0].data(), dec[1].data(), nullptr}, nullptr, bounds.data());
        std::vector<bool> esc(n, false);
        for (uint32_t e : out.escapes) esc[e] = true;
        for (std::size_t i = 0; i < n; ++i) {
            const bool sub = !high && double(v[i]) * s.hyper.beta2 < 0x1p-126;
            const bool edge = high ? v[i] >= 0x1p100 : sub && s.hyper.eps == 0;
            if (esc[i]) { escaped_edge += edge; continue; }
            CHECK_MESSAGE(!edge, "a coordinate outside the FP32 gate was kept");
            ++kept;
            kept_subnormal += sub;
            const double sv = std::sqrt(double(v[i]));
            for (double gk = -3; gk <= 12; gk += 0.05)
                for (double sg : {-1.0, 1.0}) {
                    const float g = float(sg * sv * std::pow(10, gk));
                    const float ut = torch_update(s.hyper, dec[0][i], dec[1][i], 0, g);
                    const float u = torch_update(s.hyper, m[i], v[i], 0, g);
                    ++triples;
                    if (std::isnan(u) && std::isnan(ut)) continue;
                    if (!(std::fabs(double(u) - ut) <= bounds[i])) ++violations;
                }
            for (float g : {0.0f, 6e20f, 5.8e20f, 1.8e19f, 3e38f, -6e20f}) {
                const float ut = torch_update(s.hyper, dec[0][i], dec[1][i], 0, g);
                const float u = torch_update(s.hyper, m[i], v[i], 0, g);
                ++triples;
                if (std::isnan(u) && std::isnan(ut)) continue;
                if (!(std::fabs(double(u) - ut) <= bounds[i])) ++violations;
            }
        }
    }
    CHECK(violations == 0);
    CHECK(escaped_edge > 0);
    CHECK(kept_subnormal > 0);
    MESSAGE("FP32 edges: kept " << kept << " (" << kept_subnormal << " subnormal), escaped at the gate " << escaped_edge
                                << ", " << triples << " triples");
}

TEST_CASE("vlog: originals anywhere in its own cells, code boundaries included, stay within the certificate") {
    // vlog's steps are planned to use the tolerance almost fully, so the cell ends matter:
    // for each kept coordinate, originals at the float nearest each end of its exp_avg and
    // exp_avg_sq cells (recomputed from the codes by VLog::cell), against the decoded state.
    std::mt19937_64 rng(99);
    std::uniform_real_distribution<double> U(0, 1);
    long kept = 0, violations = 0, triples = 0;
    for (int trial = 0; trial < 24; ++trial) {
        TensorSetup s;
        s.kind = Kind::VLog;
        s.hyper.step = double(5 + 400 * trial);
        s.hyper.beta2 = trial % 3 == 0 ? 0.99 : 0.999;
        s.tolerance = trial % 2 ? 0.01 : 0.001;
        s.domain.grad_bound = trial % 4 == 1 ? INFINITY : 1.0;
        const std::size_t n = 512;
        std::vector<float> m(n), v(n);
        for (std::size_t i = 0; i < n; ++i) {
            v[i] = float(1e-8 * std::pow(10, 6 * (U(rng) - 0.5)));  // 6 decades in a block
            m[i] = float((U(rng) - 0.5) * 4 * std::sqrt(double(v[i])));
        }
        const ChunkIn in{m.data(), v.data(), nullptr, nullptr, n};
        const ChunkOut out = encode_chunk(s, in);
        std::vector<double> bounds(n);
        std::vector<float> dm(n), dv(n);
        decode_chunk(s, {out.codes[0].data(), out.codes[1].data(), nullptr}, {out.params[0].data(), out.params[1].data(), nullptr},
                     n, {dm.data(), dv.data(), nullptr}, nullptr, bounds.data());
        std::vector<bool> esc(n, false);
        for (uint32_t e : out.escapes) esc[e] = true;
        for (std::size_t i = 0; i < n; ++i) {
            if (esc[i]) continue;
            ++kept;
            const int16_t* pv = out.params[1].data() + (i / kBlock) * 2;
            const int16_t* pm = out.params[0].data() + (i / kBlock) * 2;
            const uint16_t cv = uint16_t(out.codes[1][2 * i] | (out.codes[1][2 * i + 1] << 8));
            const uint16_t cm = uint16_t(out.codes[0][2 * i] | (out.codes[0][2 * i + 1] << 8));
            const Cell c1 = VLog::cell(cv, Role::ExpAvgSq, pv, 0);
            const Cell c0 = VLog::cell(cm, Role::ExpAvg, pm, std::sqrt(c1.dec));
            auto inside = [](double lo, double hi, double x, bool low) {  // float nearest the end, inside the cell
                float f = float(low ? lo : hi);
                if (low && double(f) < lo) f = std::nextafter(f, float(x));
                if (!low && double(f) > hi) f = std::nextafter(f, float(x));
                return f;
            };
            for (bool ml : {true, false})
                for (bool vl : {true, false}) {
                    const float mo = inside(c0.lo, c0.hi, c0.dec, ml), vo = inside(c1.lo, c1.hi, c1.dec, vl);
                    if (!(vo >= 0)) continue;
                    for (double gk = -6; gk <= 8; gk += 0.25)
                        for (double sg : {-1.0, 1.0}) {
                            const float g = float(sg * std::sqrt(double(vo)) * std::pow(10, gk / 2));
                            if (std::fabs(g) > s.domain.grad_bound) continue;
                            const float du = torch_update(s.hyper, mo, vo, 0, g) - torch_update(s.hyper, dm[i], dv[i], 0, g);
                            ++triples;
                            if (std::fabs(du) > bounds[i]) ++violations;
                        }
                }
        }
    }
    CHECK(violations == 0);
    CHECK(kept > 10000);
    CHECK(triples > 1'000'000);
}
