// The horizon "all" certificate (codec/guard.h closed_all, docs/design.md §1 "Every later
// update"): for originals anywhere in the rounding cells, every update t >= 1 after restore
// stays within the certificate for gradient sequences built to break it (ramps aligned
// with exp_avg, spikes after zero runs, alternating signs, noise), in exact (double)
// arithmetic and in FP32 as torch computes it; the first-update certificate is shown to
// fail on the same sequences. Also the step as torch counts it in a 16-bit step tensor.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/guard.h"
#include "chunk_roundtrip.h"

using namespace ckpt::codec;

namespace {

/// Gradient sequences of length T for a coordinate with original state (m, v): each built
/// to stress one part of the bound. `c` scales sqrt(v).
std::vector<std::vector<double>> sequences(double m, double v, double b1, double b2, int T, std::mt19937_64& rng) {
    std::vector<std::vector<double>> out;
    const double sv = std::sqrt(v) + 1e-30, sg = m < 0 ? -1.0 : 1.0;
    for (double c : {0.3, 1.0, 3.0, 10.0, 30.0})
        for (int peak : {1, 3, 10, 30, 100}) {  // the ramp aligned with exp_avg, peaking at step `peak`
            std::vector<double> g(std::size_t(T), 0.0);
            for (int s = 1; s <= std::min(peak, T); ++s)
                g[std::size_t(s - 1)] = sg * c * sv * std::pow(b1 / b2, double(peak - s)) * std::pow(b2, 0.5 * peak);
            out.push_back(g);
            std::vector<double> spike(std::size_t(T), 0.0);  // a zero run, then one gradient
            if (peak <= T) spike[std::size_t(peak - 1)] = sg * c * sv * std::pow(b2, 0.5 * peak);
            out.push_back(spike);
        }
    for (double c : {0.1, 1.0, 10.0}) {
        out.push_back(std::vector<double>(std::size_t(T), c * sv));
        out.push_back(std::vector<double>(std::size_t(T), -c * sv));
        std::vector<double> alt(static_cast<std::size_t>(T), 0.0), noise(static_cast<std::size_t>(T), 0.0);
        std::normal_distribution<double> N(0, c * sv);
        for (int s = 0; s < T; ++s) {
            alt[std::size_t(s)] = (s % 2 ? -1 : 1) * c * sv;
            noise[std::size_t(s)] = N(rng);
        }
        out.push_back(alt);
        out.push_back(noise);
    }
    return out;
}

/// max over t of |f_t - f~_t| (lr units) in double for the two states under gradients g;
/// n_t as torch counts the step (round_step), amsgrad's running max included.
double max_diff_exact(const AdamHyper& h, double m, double v, double vx, double mt, double vt, double vxt,
                      const std::vector<double>& g) {
    double n = h.step, worst = 0;
    for (double gs : g) {
        n = round_step(n + 1, h.step_bits);
        m = h.beta1 * m + (1 - h.beta1) * gs;
        mt = h.beta1 * mt + (1 - h.beta1) * gs;
        v = h.beta2 * v + (1 - h.beta2) * gs * gs;
        vt = h.beta2 * vt + (1 - h.beta2) * gs * gs;
        vx = std::max(vx, v);
        vxt = std::max(vxt, vt);
        const double bc1 = 1 - std::pow(h.beta1, n), sb2 = std::sqrt(1 - std::pow(h.beta2, n));
        const double d = std::sqrt(h.amsgrad ? vx : v) / sb2 + h.eps, dt = std::sqrt(h.amsgrad ? vxt : vt) / sb2 + h.eps;
        worst = std::max(worst, std::fabs(m / d - mt / dt) / bc1);
    }
    return worst;
}

/// The same in FP32 as torch 1.13 _single_tensor_adam steps a float32 parameter: the state
/// recursions in float, bias corrections in double, the update u = lr / bc1 * m / denom.
double max_diff_fp32(const AdamHyper& h, float m, float v, float vx, float mt, float vt, float vxt,
                     const std::vector<double>& g) {
    const float b1 = float(h.beta1), b2 = float(h.beta2), a1 = float(1 - h.beta1), a2 = float(1 - h.beta2);
    double n = h.step, worst = 0;
    for (double gd : g) {
        const float gs = float(gd);
        n = round_step(n + 1, h.step_bits);
        m = m * b1 + gs * a1;
        mt = mt * b1 + gs * a1;
        v = v * b2 + gs * gs * a2;
        vt = vt * b2 + gs * gs * a2;
        vx = std::max(vx, v);
        vxt = std::max(vxt, vt);
        const double bc1 = 1 - std::pow(h.beta1, n);
        const float sb2 = float(std::sqrt(1 - std::pow(h.beta2, n)));
        const float d = std::sqrt(h.amsgrad ? vx : v) / sb2 + float(h.eps);
        const float dt = std::sqrt(h.amsgrad ? vxt : vt) / sb2 + float(h.eps);
        const float ss = float(h.lr / bc1);
        worst = std::max(worst, std::fabs(double(ss * (m / d)) - double(ss * (mt / dt))) / h.lr);
    }
    return worst;
}

}  // namespace

TEST_CASE("round_step: torch's step + 1 in the step tensor's dtype") {
    CHECK(round_step(257, 8) == 256);          // BF16: a step of 256 stays 256
    CHECK(round_step(255, 8) == 255);          // spacing 1 below 256
    CHECK(round_step(259, 8) == 260);          // spacing 2 above: ties to even
    CHECK(round_step(129, 8) == 129);          // below 2^8 exact
    CHECK(round_step(2049, 11) == 2048);       // F16
    CHECK(round_step(2051, 11) == 2052);       // ties to even
    CHECK(round_step(16777217, 24) == 16777216);  // F32 at 2^24
    CHECK(round_step(16777217, 0) == 16777217);   // exact
    AdamHyper h;
    h.step = 256;
    h.step_bits = 8;  // the certificate's t is torch's: bias corrections at 256, not 257
    const GuardConst a = make_guard_const(h, 0.01);
    h.step = 255;
    h.step_bits = 0;
    const GuardConst b = make_guard_const(h, 0.01);
    CHECK(a.inv_bc1 == b.inv_bc1);
    CHECK(a.sqrt_bc2 == b.sqrt_bc2);
}

TEST_CASE("horizon_consts: suprema over every later update") {
    AdamHyper h;
    h.step = 100000;  // bias corrections ~1: k1 = k2m = b1/sqrt(b2) (t = 1), bs -> 1
    HorizonConsts k = horizon_consts(h);
    REQUIRE(k.ok);
    CHECK(k.k1 == doctest::Approx(0.9 / std::sqrt(0.999)).epsilon(1e-9));
    CHECK(k.k2m == doctest::Approx(0.9 / std::sqrt(0.999)).epsilon(1e-9));
    CHECK(k.bs <= 1 + 1e-12);
    CHECK(k.R == doctest::Approx(0.1 / std::sqrt(0.001 * (1 - 0.81 / 0.999))));
    h.step = 0;  // early: the suprema are over t and exceed the first update's factors
    k = horizon_consts(h);
    const GuardConst c1 = make_guard_const(h, 0.01);
    CHECK(k.k2m >= c1.inv_bc1 * c1.sqrt_bc2 * 0.9 / std::sqrt(0.999) * (1 - 1e-12));
    CHECK(k.bs >= c1.inv_bc1 * c1.sqrt_bc2 * (1 - 1e-12));
    h.beta1 = 0.999;
    h.beta2 = 0.99;  // beta1^2 >= beta2: no bound for every update
    CHECK_FALSE(horizon_consts(h).ok);
    h.beta1 = 0;  // no momentum: R = 1 / sqrt(1 - b2)
    k = horizon_consts(h);
    CHECK(k.ok);
    CHECK(k.R == doctest::Approx(1 / std::sqrt(0.01)));
}

TEST_CASE("horizon all: every later update within the certificate, originals at cell corners (exact arithmetic)") {
    std::mt19937_64 rng(41);
    std::uniform_real_distribution<double> U(0, 1);
    long kept = 0, sequences_run = 0, violations = 0, first_update_broken = 0;
    const double betas1[4] = {0.9, 0.9, 0.5, 0.0}, betas2[4] = {0.999, 0.99, 0.999, 0.999};
    for (int trial = 0; trial < 6000; ++trial) {
        AdamHyper h;
        h.beta1 = betas1[trial % 4];
        h.beta2 = betas2[(trial / 4) % 4];
        h.step = trial % 5 == 0 ? 0 : trial % 5 == 1 ? 7 : trial % 5 == 2 ? 300 : 5000;
        h.step_bits = trial % 3 == 0 ? 8 : 0;
        h.amsgrad = trial % 7 == 0;
        h.eps = trial % 2 ? 1e-8 : 1e-6;
        h.horizon = 0;
        const double tol = 0.02;
        const GuardConst all = make_guard_const(h, tol);
        AdamHyper h1 = h;
        h1.horizon = 1;
        const GuardConst first = make_guard_const(h1, tol);
        const double v = std::pow(10, -10 + 6 * U(rng));
        const double dv = v * 0.01 * U(rng), mt = (U(rng) - 0.5) * 4 * std::sqrt(v), dm = std::sqrt(v) * 0.004 * U(rng);
        const double vx = v * (1 + 0.5 * U(rng)), dvx = vx * 0.01 * U(rng);
        GuardInput in;
        in.amsgrad = h.amsgrad;
        in.m = {mt, mt - dm, mt + dm};
        in.v = {v, v - dv, v + dv};
        in.vmax = {vx, vx - dvx, vx + dvx};
        in.glo = -INFINITY;
        in.ghi = INFINITY;
        const double b = certify(all, in);
        if (!(b <= tol)) continue;
        ++kept;
        const double b1 = certify(first, in);
        CHECK(b >= b1 * (1 - 1e-12));  // every later update includes the first
        for (const auto& g : sequences(mt, v, h.beta1, h.beta2, 120, rng))
            for (double mo : {in.m.lo, in.m.hi})
                for (double vo : {in.v.lo, in.v.hi})
                    for (double xo : {in.vmax.lo, in.vmax.hi}) {
                        if (!h.amsgrad && xo != in.vmax.lo) continue;
                        const double d = max_diff_exact(h, mo, vo, xo, mt, v, vx, g);
                        ++sequences_run;
                        if (d > b) ++violations;
                        if (d > b1) ++first_update_broken;
                    }
    }
    MESSAGE(kept << " coordinates kept, " << sequences_run << " sequences, " << first_update_broken
                 << " broke the first-update certificate");
    CHECK(kept > 1000);
    CHECK(violations == 0);
    CHECK(first_update_broken > 0);  // the sequences do reach past the first update's bound
}

TEST_CASE("horizon all: the codec's kept coordinates hold for 200 FP32 steps as torch computes them") {
    std::mt19937_64 rng(4242);
    std::uniform_real_distribution<double> U(0, 1);
    long kept = 0, checked = 0, violations = 0;
    const Kind kinds[2] = {Kind::VLog, Kind::Log8};
    for (int trial = 0; trial < 8; ++trial) {
        TensorSetup s;
        s.kind = kinds[trial % 2];
        s.hyper.step = trial < 4 ? 200 : 3;
        s.hyper.amsgrad = trial % 4 == 3;
        s.hyper.horizon = 0;
        s.hyper.lr = 1e-3;
        s.tolerance = 0.01;
        s.domain.grad_bound = INFINITY;
        const std::size_t n = 512;
        std::vector<float> m(n), v(n), vm(n);
        for (std::size_t i = 0; i < n; ++i) {
            v[i] = float(1e-8 * std::pow(10, 3 * (U(rng) - 0.5)));
            m[i] = float((U(rng) - 0.5) * 3 * std::sqrt(double(v[i])));
            vm[i] = float(v[i] * (1 + U(rng)));
        }
        const ChunkRoundtrip rt = encode_decode(s, m, v, vm);
        const auto& dec = rt.dec;
        const auto& bounds = rt.bounds;
        const auto& esc = rt.esc;
        for (std::size_t i = 0; i < n; i += 4) {
            if (esc[i]) continue;
            ++kept;
            REQUIRE(bounds[i] <= s.tolerance);
            for (const auto& g : sequences(m[i], v[i], s.hyper.beta1, s.hyper.beta2, 200, rng)) {
                ++checked;
                if (max_diff_fp32(s.hyper, m[i], v[i], vm[i], dec[0][i], dec[1][i], dec[2][i], g) > bounds[i]) ++violations;
            }
        }
    }
    MESSAGE(kept << " kept coordinates, " << checked << " FP32 sequences of 200 steps");
    CHECK(kept > 500);
    CHECK(violations == 0);
}
