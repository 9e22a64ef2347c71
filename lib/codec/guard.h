// The guard: a sound bound on the first restored Adam/AdamW update error.
// Method: seed 003's shared-gradient bound (docs/design.md §1), restated for rounding cells.
//
// With f(g) = (1/bc1) * m'(g) / (sqrt(vm(g)/bc2) + eps)  (the update in lr units; torch
// 1.13 _single_tensor_adam), m' = b1*m + (1-b1)*g, v' = b2*v + (1-b2)*g^2,
// vm = max(vmax, v') with amsgrad, the difference to the decoded state splits as
//   f - f~ = (1/bc1) * [ b1*(m - m~)/D  +  m~'(g) * (D~ - D)/(D*D~) ]
//   D~ - D = (vm~ - vm) / (sqrt(bc2) * (sqrt(vm~) + sqrt(vm)))
// where m - m~ and vm~ - vm are bounded independently of g. Each factor is monotone in
// |g| except m~'(g), which is linear, so on a gradient cell [a, b] every factor is bounded
// at the cell's smallest |g| or its ends. The bound is taken over a linear-logarithmic
// partition of the gradient domain; an unbounded tail uses |m~'|/(sqrt(vm)+sqrt(vm~)) <=
// b1|m~|/(...) + (1-b1)/(2 sqrt(1-b2)), so G = inf is sound.
//
// The original moments are unknown to the guard: it only knows the rounding cell
// [lo, hi] each decoded value came from, so the certificate holds for every original in
// the cells and ckpt-verify can re-derive it from the stored codes alone.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "codec/hd.h"

namespace ckpt::codec {

/// Adam/AdamW hyper-parameters of one parameter tensor, in torch's units.
struct AdamHyper {
    double lr = 1e-3;            ///< learning rate (the tolerance is in units of lr)
    double beta1 = 0.9, beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0;     ///< used only for the Adam L2 domain shift
    bool amsgrad = false;
    bool maximize = false;       ///< domain is symmetric, so it does not change the bound
    double step = 0;             ///< completed steps s; the guarded update is t = s + 1
    /// Significant bits of the step tensor's dtype (24 F32, 11 F16, 8 BF16; 0: exact, a
    /// Python int or an integer/F64 tensor): torch adds 1 in that dtype (round_step).
    int step_bits = 0;
    /// Updates certified after restore: 1 (the first only) or 0 (every update t >= 1, for
    /// any gradient sequence; docs/design.md §1, "Every later update").
    int horizon = 1;
    /// --bound param (container format 6): the certificate also covers the parameter torch
    /// writes at the first update after restore, not only the update (block.h param_term).
    bool bound_param = false;
};

/// x rounded to nearest, ties to even, in a float type of `bits` significant bits (24
/// float32, 11 float16, 8 bfloat16; normal range); bits = 0: x itself.
inline double round_to_bits(double x, int bits) {
    if (bits <= 0 || !std::isfinite(x) || x == 0) return x;
    int e = 0;
    const double f = std::frexp(x, &e);  // x = f 2^e, |f| in [0.5, 1)
    return std::ldexp(std::nearbyint(std::ldexp(f, bits)), e - bits);
}

/// torch's `step_t += 1` for a step held with `bits` significant bits (a BF16 step of 256
/// stays 256): x = the step + 1, rounded as the step tensor's dtype rounds it.
inline double round_step(double x, int bits) { return round_to_bits(x, bits); }

/// Values derived once per tensor from AdamHyper (double, host or device).
struct GuardConst {
    double b1, b2, eps, inv_bc1, sqrt_bc2, tail;  ///< tail = (1-b1)/(2 sqrt(1-b2))
    double tolerance;   ///< tau, in lr units
    double lr;          ///< learning rate (absolute FP32 margins and the overflow gate)
    double fp32_rel;    ///< relative FP32 rounding margin applied to max|f| (see margin())
    /// sup over g of |d f / d ln v| for m = 0: the guard's v-term per unit relative error of
    /// v. Maximum of (1-b1) c b2 / (2 (b2 + (1-b2) c^2)^1.5) at c^2 = b2 / (2 (1-b2)),
    /// times sqrt(bc2)/bc1. Encoders use it to pick the exp_avg_sq step.
    double v_sens;
    /// log8's largest exp_avg_sq step (1/64 octaves) whose guard v-term stays within ~55%
    /// of the tolerance; precomputed here (std::exp2 is host-only) so that the block
    /// encoder runs unchanged on the device.
    int log8_v_step_cap;
    /// (1-b1) / (sqrt(2 (1-b2)) * 1.5^1.5): the g-term of closed_bound().
    double closed_g;
    double inv_lr;      ///< 1 / lr (fp32_gate's absolute margin)
    /// Horizon "all" (AdamHyper::horizon 0): closed_all's per-tensor constants, suprema over
    /// every later update t >= 1 (horizon_consts). all = 0: the first update only.
    int all;
    double h_k1;        ///< sup_t B1_t r^t S_t / S_1: the exp_avg term per dm / D(0)
    double h_k2m;       ///< sup_t B1_t S_t r^t: the exp_avg_sq term's |m~| part
    double h_g;         ///< sup_t B1_t S_t * R / (sqrt(2) 1.5^1.5): its gradient part (no amsgrad)
    double h_g_ams;     ///< sup_t B1_t S_t * R: its gradient part with amsgrad; also update_bound_all's
    /// closed_all's eps form of the exp_avg_sq term (format 6; docs/design.md §1): per
    /// dv / eps, e_m |m~| / V + e_g / sqrt(V) with e_m = B1_1 b1 / 8, e_g = B1_1 R / 16
    /// (R B1_1 / 8 with amsgrad). +inf (unused) before format 6, with eps = 0 or b1^2 >= b2.
    double h_e_m, h_e_g;
    /// vlog_plan's sensitivity constants (block.h): the first-update closed form's
    /// 0.5 b1/bc1, 0.5 sqrt(bc2)/bc1, b1/sqrt(b2), closed_g, b1 (amsgrad) and closed_g
    /// (amsgrad), or closed_all's counterparts.
    double plan_ka, plan_kb, plan_b1s, plan_g, plan_b1, plan_g_ams;
    /// vlog_plan's sensitivity of closed_all's eps form per relative half-width of the
    /// exp_avg_sq cell: plan_em |m| + plan_eg sqrt(V) (h_e_m / eps, h_e_g / eps); +inf unused.
    double plan_em, plan_eg;
    /// 1 where fp32_gate admits an inexact subnormal denominator state (format 6, eps * S_1 >=
    /// 2^-50: torch's FP32 roundings of such a state move sqrt(v) by at most ~2^-74, under one
    /// FP32 ulp of D >= eps; docs/design.md §1, "FP32"), else 0.
    double sub_v_ok;
};

/// closed_all's suprema over t >= 1 (docs/design.md §1, "Every later update"), with
/// n_t the step of update t (n_1 = round_step(s + 1), n_{t+1} = round_step(n_t + 1)),
/// B1_t = 1 / (1 - b1^n_t), S_t = sqrt(1 - b2^n_t), r = b1 / sqrt(b2) and
/// R = (1-b1) / sqrt((1-b2)(1 - b1^2/b2)) (Cauchy-Schwarz: |sum of the m increments| <=
/// R sqrt(their v increments)). ok = false when b1^2 >= b2 with b1 > 0 (R is unbounded:
/// no certificate for every update).
struct HorizonConsts { double k1, k2m, bs, R; bool ok; };
inline HorizonConsts horizon_consts(const AdamHyper& h) {
    const double b1 = h.beta1, b2 = h.beta2;
    HorizonConsts k{0, 0, 0, 0, true};
    if (b1 > 0 && !(b1 * b1 < b2)) { k.ok = false; return k; }
    k.R = b1 == 0 ? 1 / std::sqrt(1 - b2) : (1 - b1) / std::sqrt((1 - b2) * (1 - b1 * b1 / b2));
    const double r = b1 == 0 ? 0.0 : b1 / std::sqrt(b2);
    double n = round_step(h.step + 1, h.step_bits);
    const double B1_1 = 1 / (1 - std::pow(b1, n)), S_1 = std::sqrt(1 - std::pow(b2, n));
    double rt = 1;  // r^t
    bool m_done = false, b_done = false;
    for (long t = 1; !(m_done && b_done); ++t) {
        const double p1 = std::pow(b1, n), B1 = 1 / (1 - p1), S = std::sqrt(1 - std::pow(b2, n));
        rt *= r;
        k.k1 = std::max(k.k1, B1 * rt * S / S_1);
        k.k2m = std::max(k.k2m, B1 * S * rt);
        if (!b_done) k.bs = std::max(k.bs, B1 * S);
        // later terms: B1_t <= B1_1 and S_t <= 1, so r^t's decay ends the exp_avg suprema
        m_done = B1_1 * rt * r / S_1 <= k.k1 && B1_1 * rt * r <= k.k2m;
        const double next = round_step(n + 1, h.step_bits);
        if (!b_done && next == n) b_done = true;  // the step no longer moves: every later term is this one
        else if (!b_done && p1 < 1e-15) {         // B1_t S_t <= B1_t <= B1 for every later t
            k.bs = std::max(k.bs, B1);
            b_done = true;
        }
        n = next;
        if (t > 100000000) { k.ok = false; break; }  // unreachable for b1 < 1 (p1 < 1e-15 by then)
    }
    return k;
}

/// log8's largest exp_avg_sq step, 1/64 octaves (~30% apart); Log8::kMaxStep.
constexpr int kLog8MaxStep = 24;

/// Build GuardConst. bc1 = 1-b1^t, bc2 = 1-b2^t with t = step+1 (torch's bias correction).
/// format6: TensorSetup::format6 (closed_all's eps form).
inline GuardConst make_guard_const(const AdamHyper& h, double tolerance, bool format6 = true) {
    const double t = round_step(h.step + 1, h.step_bits);
    GuardConst c{};
    c.b1 = h.beta1;
    c.b2 = h.beta2;
    c.eps = h.eps;
    c.inv_bc1 = 1.0 / (1.0 - std::pow(h.beta1, t));
    c.sqrt_bc2 = std::sqrt(1.0 - std::pow(h.beta2, t));
    c.tail = (1.0 - h.beta1) / (2.0 * std::sqrt(1.0 - h.beta2));
    c.tolerance = tolerance;
    c.lr = h.lr;
    // Each FP32 run of the update rounds |u| by at most ~8 ulp (sqrt, div, add, mul,
    // addcdiv); two runs are compared, so 16 ulp; we take 64 ulp = 4x headroom.
    c.fp32_rel = 64.0 * 5.9604644775390625e-08;
    const double cc = std::sqrt(h.beta2 / (2 * (1 - h.beta2)));
    c.v_sens = (1 - h.beta1) * cc * h.beta2 / (2 * std::pow(1.5 * h.beta2, 1.5)) * c.sqrt_bc2 * c.inv_bc1;
    c.closed_g = (1 - h.beta1) / (std::sqrt(2 * (1 - h.beta2)) * 1.8371173070873836);
    c.inv_lr = 1 / h.lr;
    c.plan_ka = 0.5 * h.beta1 * c.inv_bc1;
    c.plan_kb = 0.5 * c.sqrt_bc2 * c.inv_bc1;
    c.plan_b1s = h.beta1 / std::sqrt(h.beta2);
    c.plan_g = c.closed_g;
    c.plan_b1 = h.beta1;
    c.plan_g_ams = c.closed_g;
    c.all = h.horizon == 0;
    c.h_k1 = c.h_k2m = c.h_g = c.h_g_ams = 0;
    c.h_e_m = c.h_e_g = c.plan_em = c.plan_eg = INFINITY;
    c.sub_v_ok = format6 && h.eps * c.sqrt_bc2 >= 0x1p-50 ? 1.0 : 0.0;
    if (c.all) {
        // make_guard_const runs per chunk: the suprema (a loop over steps, up to ~10^4 for
        // beta1 near 1 at an early step) once per tensor, remembered by each thread
        thread_local struct { double b1 = -1, b2 = -1, step = -1; int bits = -1; HorizonConsts k{}; } last;
        if (!(last.b1 == h.beta1 && last.b2 == h.beta2 && last.step == h.step && last.bits == h.step_bits)) {
            last.k = horizon_consts(h);
            last.b1 = h.beta1;
            last.b2 = h.beta2;
            last.step = h.step;
            last.bits = h.step_bits;
        }
        const HorizonConsts k = last.k;
        // no bound (b1^2 >= b2): a huge finite factor, so exact coordinates (dm = dv = 0)
        // still certify at 0 and every other one escapes
        const double huge = 1e300;
        c.h_k1 = k.ok ? k.k1 : huge;
        c.h_k2m = k.ok ? k.k2m : huge;
        c.h_g = k.ok ? k.bs * k.R / (1.4142135623730951 * 1.8371173070873836) : huge;
        c.h_g_ams = k.ok ? k.bs * k.R : huge;
        c.plan_ka = 0.5 * c.h_k1;
        c.plan_kb = 0.5;
        c.plan_b1s = c.h_k2m;
        c.plan_g = c.h_g;
        c.plan_b1 = c.h_k2m * std::sqrt(h.beta2);
        c.plan_g_ams = c.h_g_ams;
        c.v_sens = 0.5 * c.h_g;  // closed_all's exp_avg_sq term at m = 0 per unit relative error
        if (format6 && k.ok && h.eps > 0) {
            // B1_t = 1 / (1 - b1^n_t) does not grow with t (n_t does not fall): its sup is B1_1
            const double B1_1 = 1 / (1 - std::pow(h.beta1, round_step(h.step + 1, h.step_bits)));
            c.h_e_m = B1_1 * h.beta1 / 8;
            c.h_e_g = h.amsgrad ? B1_1 * k.R / 8 : B1_1 * k.R / 16;
            c.plan_em = c.h_e_m / h.eps;
            c.plan_eg = c.h_e_g / h.eps;
        }
    }
    int cap = 1;
    while (cap < kLog8MaxStep && c.v_sens * (std::exp2((cap + 1) / 128.0) - 1) <= 0.55 * c.tolerance) ++cap;
    c.log8_v_step_cap = cap;
    return c;
}

/// One decoded moment value and the rounding cell its original lies in (lo <= x <= hi).
struct Cell {
    double dec = 0, lo = 0, hi = 0;
};

/// Per-coordinate guard inputs: decoded values with cells, and the gradient domain
/// [glo, ghi] (may be infinite) after the L2 shift.
struct GuardInput {
    Cell m, v, vmax;  ///< vmax only read when amsgrad
    bool amsgrad = false;
    double glo = -1, ghi = 1;
};

/// The smallest denominator state at g = 0 over the cells, shared by fp32_gate,
/// update_bound and closed_bound (certify computes it once): v0 = max(b2 v.lo, vmax.lo)
/// (vmax with amsgrad), sv0 = sqrt(v0), d0 = sv0 / sqrt(bc2) + eps.
struct Denom0 {
    double v0, sv0, d0;
};
CKPT_HD_FORCE Denom0 denom0(const GuardConst& c, const GuardInput& in) {
    const double vb = c.b2 * in.v.lo;
    const double v0 = in.amsgrad && in.vmax.lo > vb ? in.vmax.lo : vb;
    const double sv0 = sqrt(v0);
    return {v0, sv0, sv0 / c.sqrt_bc2 + c.eps};
}

/// Bound of sup |f - f~| over the gradient cell [a, b] (a <= b, may be +-inf), lr units.
CKPT_HD double cell_bound(const GuardConst& c, const GuardInput& in, double dm, double dv,
                          double a, double b) {
    const double gmin = (a <= 0 && b >= 0) ? 0.0 : (a > 0 ? a : -b);
    const double q = (1 - c.b2) * gmin * gmin;
    double vlo = c.b2 * in.v.lo + q, vt = c.b2 * in.v.dec + q;
    if (in.amsgrad) {
        vlo = vlo > in.vmax.lo ? vlo : in.vmax.lo;
        vt = vt > in.vmax.dec ? vt : in.vmax.dec;
    }
    const double s = sqrt(vlo), st = sqrt(vt);
    const double dlo = s / c.sqrt_bc2 + c.eps, dt = st / c.sqrt_bc2 + c.eps;
    const double t1 = dm == 0 ? 0.0 : c.b1 * dm / dlo;
    double t2 = 0;
    if (dv != 0) {
        double ratio;  // sup of |m~'(g)| / (sqrt(vm) + sqrt(vm~)) over the cell
        const bool finite = a > -INFINITY && b < INFINITY;
        if (finite) {
            const double ea = fabs(c.b1 * in.m.dec + (1 - c.b1) * a);
            const double eb = fabs(c.b1 * in.m.dec + (1 - c.b1) * b);
            ratio = (ea > eb ? ea : eb) / (s + st);
        } else {
            ratio = c.b1 * fabs(in.m.dec) / (s + st) + c.tail;
        }
        t2 = ratio * dv / (c.sqrt_bc2 * dlo * dt);
    }
    return (t1 + t2) * c.inv_bc1;
}

/// Upper bound of max |f| over the domain for original and decoded state (lr units):
/// b1 |m| / D(0) + (1-b1) |g| / D(g) <= b1 |m| / D(0) + (1-b1) sqrt(bc2) / sqrt(1-b2).
CKPT_HD_FORCE double update_bound(const GuardConst& c, const GuardInput& in, const Denom0& z) {
    const double d0 = z.d0;
    const double mabs = fabs(in.m.lo) > fabs(in.m.hi) ? fabs(in.m.lo) : fabs(in.m.hi);
    return (c.b1 * mabs / d0 + 2 * c.tail * c.sqrt_bc2) * c.inv_bc1;
}
CKPT_HD double update_bound(const GuardConst& c, const GuardInput& in) { return update_bound(c, in, denom0(c, in)); }

/// Closed-form bound of sup |f - f~| over the whole real line (so over any domain), lr
/// units, before margin; +inf when exp_avg_sq's cell reaches 0. With s(g)^2 = C + E g^2,
/// C = b2 * v.lo, E = 1 - b2 (a lower bound of both denominator states, also with
/// amsgrad), cell_bound's terms at one g are bounded by
///   t1 <= b1 dm / D(0),   D * D~ * (s + s~) >= 2 s^3 / bc2, so
///   t2 <= (b1 |m~| + (1-b1)|g|) * dv * sqrt(bc2) / (2 s^3),
/// and sup_g 1/s^3 = C^-1.5, sup_g |g|/s^3 = 1 / (sqrt(2E) 1.5^1.5 C) (at g^2 = C/(2E)).
/// The sum of separate suprema is looser than the partition (up to ~2x when sqrt(v) >> eps,
/// more when eps dominates) but costs two square roots; it lets most coordinates skip the
/// partition.
CKPT_HD_FORCE double closed_bound(const GuardConst& c, const GuardInput& in, double dm, double dv, const Denom0& z) {
    const double C = c.b2 * in.v.lo;
    // v0 = C unless amsgrad's vmax is larger; without amsgrad denom0 computed v0 as this
    // very product, so sv0 is sqrt(C) bit for bit (NaN too), and no second root is taken
    // (a vectorised select would compute both sides)
    const double sC = !in.amsgrad ? z.sv0 : z.v0 == C ? z.sv0 : sqrt(C);
    const double t1 = c.b1 * dm / z.d0;
    const double t2 = 0.5 * c.sqrt_bc2 * dv * (c.b1 * fabs(in.m.dec) / (C * sC) + c.closed_g / C);
    return C > 0 ? (t1 + t2) * c.inv_bc1 : INFINITY;  // a select, not a branch (certify_closed vectorises)
}
CKPT_HD double closed_bound(const GuardConst& c, const GuardInput& in, double dm, double dv) {
    return closed_bound(c, in, dm, dv, denom0(c, in));
}

/// Horizon "all": a bound of sup |f_t - f~_t| over every update t >= 1 after restore and
/// every gradient sequence (any domain, G = inf included), lr units, before margin; +inf
/// when the denominator state's cell reaches 0. Proof: docs/design.md §1, "Every later
/// update". Both runs see the same gradients, so m_t - m~_t = b1^t (m - m~) and
/// v_t - v~_t = b2^t (v - v~); with A_t >= 0 the gradients' part of v_t, every
/// denominator state is >= X = b2^t v.lo + A_t and |m~_t| <= b1^t |m~| + R sqrt(A_t).
/// Then, without amsgrad (C = b2 v.lo, dv = b2 dv0 as certify_closed's),
///   t1 <= h_k1 dm / D(0),
///   t2 <= 0.5 dv (h_k2m sqrt(b2) |m~| / C^1.5 + h_g / C)   (h_g: the sup over A_t, at A_t = b2^t v.lo / 2);
/// with amsgrad the running max is >= V = max(b2 v.lo, vmax.lo) (denom0's v0) at every t
/// and moves by at most dv = max(b2 dv0, dvmax), so t2 <= 0.5 dv (h_k2m |m~| / V^1.5 +
/// h_g_ams / V). dm = 0 or dv = 0 drops its term (an exact state, also where D(0) = 0).
CKPT_HD_FORCE double closed_all(const GuardConst& c, const GuardInput& in, double dm, double dv, const Denom0& z) {
    const double t1 = dm != 0 ? c.h_k1 * dm / z.d0 : 0.0;
    const double V = in.amsgrad ? z.v0 : c.b2 * in.v.lo;  // z.v0 is that product bit for bit without amsgrad
    const double k2 = in.amsgrad ? c.h_k2m : c.h_k2m * sqrt(c.b2);
    const double g = in.amsgrad ? c.h_g_ams : c.h_g;
    const double t2x = 0.5 * dv * (k2 * fabs(in.m.dec) / (V * z.sv0) + g / V);
    const double t2e = dv * (c.plan_em * fabs(in.m.dec) / V + c.plan_eg / z.sv0);  // h_e / eps; +inf or NaN when unused
    const double t2 = t2e < t2x ? t2e : t2x;
    const double t2s = dv != 0 ? (V > 0 ? t2 : INFINITY) : 0.0;
    return t1 + t2s;
}

/// Horizon "all": an upper bound of max |f_t| over every t and gradient sequence for the
/// original and the decoded state (lr units): h_k1 |m| / D(0) + sup_t B1_t S_t R.
CKPT_HD_FORCE double update_bound_all(const GuardConst& c, const GuardInput& in, const Denom0& z) {
    const double mabs = fabs(in.m.lo) > fabs(in.m.hi) ? fabs(in.m.lo) : fabs(in.m.hi);
    return c.h_k1 * mabs / z.d0 + c.h_g_ams;
}

/// Adaptive refinement of the gradient cell [a, b]: its cell_bound when that is <= stop,
/// otherwise the max over kSplit equal sub-cells, refined the same way down to kDepth
/// levels (kSplit^kDepth leaves). Returns a value > stop (the failing leaf's bound; NaN
/// stays NaN) as soon as a leaf at the last level is above stop. Sound: the leaves cover
/// [a, b] (adjacent sub-cells share their end points bit for bit) and each leaf's
/// cell_bound bounds its sub-cell. Iterative with a fixed stack, for the device.
CKPT_HD double refine_bound(const GuardConst& c, const GuardInput& in, double dm, double dv, double a,
                            double b, double stop) {
    constexpr int kSplit = 4, kDepth = 4;
    struct Item { double a, b; int depth; };
    Item stack[kDepth * (kSplit - 1) + 1];
    int n = 0;
    stack[n++] = {a, b, 0};
    double worst = 0;
    while (n > 0) {
        const Item it = stack[--n];
        const double cb = cell_bound(c, in, dm, dv, it.a, it.b);
        if (cb <= stop) {
            if (cb > worst) worst = cb;
            continue;
        }
        if (it.depth == kDepth || !(it.b - it.a < INFINITY) || !(it.b > it.a)) return cb;
        const double w = (it.b - it.a) / kSplit;
        for (int k = kSplit - 1; k >= 0; --k) {
            const double lo = k == 0 ? it.a : it.a + k * w;
            const double hi = k == kSplit - 1 ? it.b : it.a + (k + 1) * w;
            stack[n++] = {lo, hi, it.depth + 1};
        }
    }
    return worst;
}

/// Max of refine_bound over one side of the domain (g >= 0 when sign = +1, g <= 0 when
/// sign = -1), intersected with [glo, ghi]. Coarse cells: width sigma/4 up to 2*sigma, then
/// growing by 1.6x up to 1e5*sigma, then the unbounded (or clipped) tail. Returns early
/// once the bound exceeds `stop`.
CKPT_HD double side_bound(const GuardConst& c, const GuardInput& in, double dm, double dv,
                          double sigma, double sign, double stop) {
    double worst = 0, x = 0;  // x: |g| at the cell start
    const double lin = sigma * 0.5, lin_end = 2 * sigma, tail = sigma * 1e5;
    const double lim = sign > 0 ? in.ghi : -in.glo;  // |g| reach on this side
    const double other = sign > 0 ? -in.glo : in.ghi; // domain may start past 0
    while (x < lim) {
        double y = x < lin_end ? x + lin : x * 2;
        if (x >= tail) y = INFINITY;
        if (y > lim) y = lim;
        // Cell [x, y] on this side, clipped to the domain start when it does not contain 0.
        double a = sign > 0 ? x : -y, b = sign > 0 ? y : -x;
        if (a < in.glo) a = in.glo;
        if (b > in.ghi) b = in.ghi;
        if (a <= b && !(other < 0 && y < -other)) {
            const double cb = refine_bound(c, in, dm, dv, a, b, stop);
            if (!(cb <= worst)) worst = cb;  // NaN propagates as a failure
            if (!(worst <= stop)) return worst;
        }
        x = y;
    }
    return worst;
}

/// FP32 range gate and absolute margin (docs/design.md, "The FP32 margin"). The relative
/// margin (fp32_rel) holds while every FP32 intermediate of torch's update is a normal
/// number and nothing overflows. Returns +inf when that cannot be shown for this
/// coordinate (it then escapes), otherwise the absolute margin in lr units that covers
/// roundings in the subnormal range:
///  - overflow: with |m|, v, vmax < 2^100 and lr/bc1 <= 2, the state terms fl(b1 m) and
///    fl(b2 v) are below half an ulp of any float sum that could overflow (ulp >= 2^104
///    there), so both states round such sums to the same float (or the same inf); the
///    update itself stays below lr * update_bound < 2^100;
///  - subnormals: fl(b2 v) and vmax must be normal (>= 2^-126) unless the cell is one
///    exact value; then v', sqrt and the divisions round relatively. m' and the final
///    update may still round in the subnormal range, by at most 2^-150 each: in lr units
///    that is <= inv_bc1 2^-149 / D_min + 2^-149 / lr, taken 8x here.
/// fp32_gate's conditions on the tensor alone (lr and bias correction).
CKPT_HD_FORCE bool fp32_gate_tensor(const GuardConst& c) { return c.lr * c.inv_bc1 <= 2 && c.lr > 0; }
/// fp32_gate's per-coordinate part: every condition a select of doubles (no branches and
/// no booleans, so a loop of certify_closed over a block vectorises).
CKPT_HD_FORCE double fp32_gate_coord(const GuardConst& c, const GuardInput& in, const Denom0& z) {
    const double big = 0x1p100, tiny = 0x1p-126;
    const double ma = max_hd(fabs(in.m.lo), fabs(in.m.hi));
    const double dmin = z.d0;
    // the conditions as one product of 0/1 flags, then one select: a chain of selects on
    // the margin gets jump-threaded into many-way branches that GCC cannot if-convert
    double ok = flag_hd(ma < big) * flag_hd(fabs(in.m.dec) < big) * flag_hd(in.v.hi < big);
    ok *= flag_hd(!(in.v.hi > in.v.lo) | (c.b2 * in.v.lo >= tiny) | (c.sub_v_ok != 0)) * flag_hd(dmin > 0);
    if (in.amsgrad)  // uniform over a tensor
        ok *= flag_hd(in.vmax.hi < big) * flag_hd(!(in.vmax.hi > in.vmax.lo) | (in.vmax.lo >= tiny) | (c.sub_v_ok != 0));
    const double m = 8 * 0x1p-149 * (c.inv_bc1 / dmin + c.inv_lr);
    return ok != 0 ? m : INFINITY;
}
CKPT_HD double fp32_gate(const GuardConst& c, const GuardInput& in) {
    return fp32_gate_tensor(c) ? fp32_gate_coord(c, in, denom0(c, in)) : INFINITY;
}

/// certify's first stage: the cells' half-widths dm, dv (dv in units of b2 v), the FP32
/// margin and the closed-form certificate with margin and slack. gate_failed: fp32_gate's
/// per-coordinate part or the overflow check failed (certify returns +inf then; the caller
/// checks fp32_gate_tensor). Branch-free (selects only) so a loop over a block's
/// coordinates vectorises (block.h certify_trial).
/// Every certificate stage multiplies by this: it covers double rounding inside the bound.
constexpr double kCertSlack = 1 + 1e-9;

struct ClosedStage {
    double dm, dv, margin, closed;
    double gate_failed;  ///< 1 or 0 (a double, for the vectoriser)
};
template <bool kAll>
CKPT_HD_FORCE ClosedStage certify_closed_h(const GuardConst& c, const GuardInput& in) {
    ClosedStage r;
    r.dm = max_hd(in.m.dec - in.m.lo, in.m.hi - in.m.dec);
    const double dv = max_hd(in.v.dec - in.v.lo, in.v.hi - in.v.dec) * c.b2;
    r.dv = in.amsgrad ? max_hd(dv, max_hd(in.vmax.dec - in.vmax.lo, in.vmax.hi - in.vmax.dec)) : dv;
    const Denom0 z = denom0(c, in);  // one square root for the three bounds below
    // identical decoded state computes identically: no FP32 margin is needed then
    const double abs_margin = fp32_gate_coord(c, in, z);
    const double ub = kAll ? update_bound_all(c, in, z) : update_bound(c, in, z);
    // single selects on combined conditions (see fp32_gate_coord)
    const double inexact = flag_hd((r.dm != 0) | (r.dv != 0));  // exact: no gate, no margin
    const double passed = flag_hd(abs_margin < INFINITY) * flag_hd(c.lr * ub < 0x1p100);
    const double margin = c.fp32_rel * ub + abs_margin;
    r.gate_failed = inexact * (1 - passed);
    r.margin = inexact != 0 ? margin : 0.0;
    r.closed = ((kAll ? closed_all(c, in, r.dm, r.dv, z) : closed_bound(c, in, r.dm, r.dv, z)) + r.margin) * kCertSlack;
    return r;
}
/// certify_closed_h for the tensor's horizon (GuardConst::all).
CKPT_HD_FORCE ClosedStage certify_closed(const GuardConst& c, const GuardInput& in) {
    return c.all ? certify_closed_h<true>(c, in) : certify_closed_h<false>(c, in);
}

/// Certificate: an upper bound of sup_{g in domain} |u(g) - u~(g)| / lr including the
/// FP32 margin, or a value above the tolerance (+inf/NaN when no bound exists). Order:
/// closed_bound (passes ~90% of log8 coordinates), one cell over the whole domain, a
/// point lower bound that fails hopeless coordinates fast, then the adaptively refined
/// linear-logarithmic partition (side_bound / refine_bound).
CKPT_HD double certify(const GuardConst& c, const GuardInput& in) {
    const ClosedStage k = certify_closed(c, in);
    const bool exact = k.dm == 0 && k.dv == 0;
    if (k.gate_failed != 0 || (!exact && !fp32_gate_tensor(c))) return INFINITY;
    const double dm = k.dm, dv = k.dv, margin = k.margin, closed = k.closed;
    const double slack = kCertSlack;
    if (closed <= c.tolerance || c.all) return closed;  // horizon all: the closed form is the certificate
    const double whole = (cell_bound(c, in, dm, dv, in.glo, in.ghi) + margin) * slack;
    if (whole <= c.tolerance) return whole;
    double best = whole < closed ? whole : closed;
    double vs = in.v.hi;
    if (in.amsgrad && in.vmax.hi > vs) vs = in.vmax.hi;
    double sigma = sqrt(vs);
    if (!(sigma > 1e-30)) sigma = 1e-30;
    // Every partition cell's bound is >= cell_bound at any single g of the cell, so a point
    // value above the tolerance proves that no partition certifies: fail fast. Points: the
    // domain's g nearest 0 (where the exp_avg term peaks) and +-g* = sqrt(C / (2E)) (where
    // the exp_avg_sq term peaks), clipped to the domain.
    {
        const double gs = sqrt(c.b2 * in.v.hi / (2 * (1 - c.b2)));
        const double pts[3] = {0.0, gs, -gs};
        double lower = 0;
        for (double g : pts) {
            g = g < in.glo ? in.glo : g > in.ghi ? in.ghi : g;
            if (g == g && g > -INFINITY && g < INFINITY) {
                const double pb = cell_bound(c, in, dm, dv, g, g);
                if (pb > lower) lower = pb;
            }
        }
        lower = (lower + margin) * slack;
        if (lower > c.tolerance) return lower;
    }
    const double stop = c.tolerance / slack - margin;
    const double hi = side_bound(c, in, dm, dv, sigma, +1, stop);
    const double lo = hi <= stop ? side_bound(c, in, dm, dv, sigma, -1, stop) : hi;
    const double r = ((hi > lo ? hi : lo) + margin) * slack;
    if (r < best) best = r;
    return best;
}

/// The exact-arithmetic update in lr units, f(g) = u(g)/lr (for dense-grid checks).
CKPT_HD double update_lr(const GuardConst& c, double m, double v, double vmax, bool amsgrad, double g) {
    const double mm = c.b1 * m + (1 - c.b1) * g;
    double vv = c.b2 * v + (1 - c.b2) * g * g;
    if (amsgrad && vmax > vv) vv = vmax;
    return c.inv_bc1 * mm / (sqrt(vv) / c.sqrt_bc2 + c.eps);
}

}  // namespace ckpt::codec
