// The per-block encoder and the per-coordinate decoder, shared by the CPU loops in
// codec.cpp and the CUDA kernels in cuda/ (docs/design.md §4): both run exactly these lines, so
// the CPU tests exercise the device math and the container bytes are identical.
// Everything here is CKPT_HD; GuardConst carries every value that needs a host-only
// function (pow, exp2), computed once per tensor by make_guard_const on the host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "codec/bf16.h"
#include "codec/blockwise8.h"
#include "codec/codec.h"
#include "codec/guard.h"
#include "codec/hd.h"
#include "codec/log8.h"
#include "codec/vlog.h"

namespace ckpt::codec {

/// Moment index k -> role (codes, params and escapes are stored in this order).
CKPT_HD Role role_of(int k) { return k == 0 ? Role::ExpAvg : k == 1 ? Role::ExpAvgSq : Role::MaxExpAvgSq; }

/// IEEE binary16 round-to-nearest-even of a double, as a double (overflow -> inf, NaN
/// stays NaN). Plain IEEE operations only: the same result as a cast through _Float16 on
/// the host (checked in test/cuda) and on the device.
CKPT_HD double round_half(double x) {
    if (!(x == x)) return x;
    const double a = fabs(x);
    double r;
    if (a >= 65520.0) {
        r = INFINITY;  // half-way above 65504 rounds to even = 2^16: overflow
    } else if (a < 6.103515625e-05) {  // below 2^-14: subnormal quantum 2^-24
        r = rint(a * 16777216.0) / 16777216.0;
    } else {
        int ex;
        frexp(a, &ex);  // a = f * 2^ex, f in [0.5, 1): 11 significant bits -> quantum 2^(ex-11)
        r = ldexp(rint(ldexp(a, 11 - ex)), ex - 11);
    }
    return signbit(x) ? -r : r;
}

/// Round a decoded value to the moment's storage type (what torch will see).
CKPT_HD double round_to_type(MomentType t, double x) {
    if (t == MomentType::F32) return x;
    const float f = float(x);
    if (t == MomentType::BF16) {
        if (!isfinite(f)) return f;
        return BF16::from_code(BF16::rne(f));
    }
    return double(float(round_half(x)));
}

/// Gradient domain [lo, hi] of chunk coordinate i (see codec.h gradient_domain).
CKPT_HD void gradient_domain_hd(const DomainRule& d, const float* theta, std::size_t i, double& lo, double& hi) {
    const double G = d.grad_bound;
    if (!isfinite(G)) { lo = -INFINITY; hi = INFINITY; return; }
    lo = INFINITY; hi = -INFINITY;
    if (d.plain) { lo = -G; hi = G; }
    if (d.l2) {
        const double s = theta ? d.weight_decay * double(theta[i]) : 0.0;
        const double w = theta ? 0.0 : fabs(d.weight_decay) * d.theta_bound;
        lo = fmin_hd(lo, s - w - G);
        hi = fmax_hd(hi, s + w + G);
    }
    lo -= fabs(lo) * 1e-6;
    hi += fabs(hi) * 1e-6;
}

template <class Q>
CKPT_HD Cell cell_of(const TensorSetup& s, uint16_t code, Role r, const int16_t* p, double scale) {
    Cell c = Q::cell(code, r, p, scale);
    c.dec = round_to_type(s.type, c.dec);
    return c;
}

/// The decoded value of one code (cell_of's .dec, without the cell where the codec can).
template <class Q>
CKPT_HD double decoded_of(const TensorSetup& s, uint16_t code, Role r, const int16_t* p, double scale) {
    return cell_of<Q>(s, code, r, p, scale).dec;
}
template <>
CKPT_HD double decoded_of<VLog>(const TensorSetup& s, uint16_t code, Role r, const int16_t* p, double scale) {
    return round_to_type(s.type, VLog::decoded(code, r, p, scale));
}

/// Whether a used code's cell (Q::cell's, before round_to_type) lies in the float range:
/// its value finite and, where the codec's used codes never decode to 0
/// (!Q::kUsedMayDecodeZero), nonzero; a second moment not negative; the cell ordered and not
/// the single point 0. A code outside it comes only from corrupted or forged block
/// parameters (the encoders never write one): e.g. a vlog anchor of -32768 decodes every
/// nonzero code of its block to +0 with an empty cell, which a certificate would call exact.
/// Verify and restore refuse such a block (codec.h decode_chunk).
template <class Q>
CKPT_HD_FORCE bool code_in_range(const Cell& c, Role r) {
    const double a = fabs(c.dec);
    const bool nonzero = a > 0 || (Q::kUsedMayDecodeZero && c.lo < c.hi);
    return (a < INFINITY) & (c.lo <= c.hi) & nonzero & (r == Role::ExpAvg || !(c.dec < 0));
}

CKPT_HD uint16_t load_code(const uint8_t* codes, int cb, std::size_t i) {
    return cb == 1 ? codes[i] : uint16_t(codes[2 * i] | (codes[2 * i + 1] << 8));
}
CKPT_HD void store_code(uint8_t* codes, int cb, std::size_t i, uint16_t c) {
    if (cb == 1) codes[i] = uint8_t(c);
    else { codes[2 * i] = uint8_t(c); codes[2 * i + 1] = uint8_t(c >> 8); }
}

/// The guard input of one coordinate from its cells.
CKPT_HD GuardInput guard_input(const TensorSetup& s, const Cell* c, const float* theta, std::size_t i) {
    GuardInput g;
    g.amsgrad = s.hyper.amsgrad;
    g.m = c[0];
    g.v = c[1];
    if (g.amsgrad) g.vmax = c[2];
    gradient_domain_hd(s.domain, theta, i, g.glo, g.ghi);
    return g;
}

/// The spacing of float32 values in the binade of x >= 0 (2^-149 below 2^-126; +inf from 2^128).
CKPT_HD double ulp32_at(double x) {
    if (!(x < 0x1p128)) return INFINITY;
    int e = 0;
    frexp(x, &e);  // x = f 2^e, f in [0.5, 1): float32's ulp in that binade is 2^(e - 24)
    return x < 0x1p-126 ? 0x1p-149 : ldexp(1.0, e - 24);
}

/// --bound param (AdamHyper::bound_param): what a coordinate's certificate adds for the
/// parameter torch writes at the first update after restore, lr units. torch rounds
/// theta_w - u once (theta_w: theta, or AdamW's theta (1 - lr wd), the same in both runs);
/// two roundings of values at most bound * lr apart, each by half an ulp, at a magnitude
/// below 2 max(|theta|, |u|), |u| <= lr * ub (guard.h update_bound / update_bound_all over the
/// cells): ulp32(2 max(|theta|, lr ub)) / lr. |theta|: the coordinate's parameter, or the
/// domain's theta_bound (--param-bound, tied candidates) where the file has none.
CKPT_HD double param_term(const TensorSetup& s, const GuardConst& gc, const Cell* c, const float* theta, std::size_t i) {
    const GuardInput in = guard_input(s, c, theta, i);
    const Denom0 z = denom0(gc, in);
    const double ub = gc.all ? update_bound_all(gc, in, z) : update_bound(gc, in, z);
    const double th = theta ? fabs(double(theta[i])) : s.domain.theta_bound;
    return ulp32_at(2 * (th > gc.lr * ub ? th : gc.lr * ub)) / gc.lr;
}

/// exp_avg is coded relative to sqrt of the decoded denominator state at g = 0:
/// exp_avg_sq, or max(exp_avg_sq, max_exp_avg_sq) with amsgrad; where that state is exactly
/// 0, relative to 2^-75 when `floor` (TensorSetup::format6: a positive float's root is at
/// least 2^-74.5, so the floor changes nothing else), so that exp_avg gets codes there too.
CKPT_HD double m_scale(bool floor, double v, double vmax) {
    const double r = sqrt(v > vmax ? v : vmax);
    return r > 0 || !floor ? r : 0x1p-75;
}

static_assert(kBlock <= 64, "VLog::anchor buffers one block of at most 64 values");

/// One parameter trial of a block: params per moment, codes, which coordinates keep
/// their codes and their certificates.
template <class Q>
struct BlockTrial {
    int16_t p[3][Q::kParams > 0 ? Q::kParams : 1];
    uint16_t code[3][kBlock];
    bool keep[kBlock];
    bool code_ok[kBlock];  ///< every moment had a code (a failed keep was the certificate)
    double bound[kBlock];
    int escapes;
    int range_escapes;  ///< escapes because a moment had no code (outside the block's range)
};

/// One moment's cells of a block, structure of arrays (so loops over them vectorise).
struct BlockCells {
    double dec[kBlock], lo[kBlock], hi[kBlock];
    CKPT_HD_FORCE Cell get(int j) const { return {dec[j], lo[j], hi[j]}; }
    CKPT_HD_FORCE void set(int j, const Cell& c) { dec[j] = c.dec; lo[j] = c.lo; hi[j] = c.hi; }
};

/// Scratch of encode_block (about 10 KB; one per CPU thread or GPU thread).
template <class Q>
struct BlockWork {
    BlockTrial<Q> trial[2];
    double scale[kBlock];
    BlockCells cells[3];
    double sens[2][kBlock];   ///< vlog: the closed form's sensitivities to the two steps; certify_trial's scratch
    double lg[3][kBlock];     ///< vlog: log2_hd of the positive finite second moments
    bool live[kBlock];        ///< vlog: coordinates the steps must certify
    double settled[kBlock];   ///< vlog: the quantisers' branch-free pass settled the code (1) or not (0)
};

/// Code moment k of the block's coordinates that are still kept in trial t under t->p[k]
/// (exp_avg relative to w.scale), filling w.cells[k]; a value without a code drops its
/// coordinate from t->keep.
template <class Q>
CKPT_HD void code_role(const TensorSetup& s, const float* const* src, std::size_t i0, int bn, int k, BlockTrial<Q>* t,
                       BlockWork<Q>& w) {
    for (int j = 0; j < bn; ++j) {
        if (!t->keep[j]) continue;
        const double sc = k == 0 ? w.scale[j] : 0.0;
        t->keep[j] = Q::encode(src[k][i0 + j], role_of(k), t->p[k], sc, &t->code[k][j]);
        if (t->keep[j]) w.cells[k].set(j, cell_of<Q>(s, t->code[k][j], role_of(k), t->p[k], sc));
    }
}

/// w.scale[j] for exp_avg from the decoded second moments of the kept coordinates.
template <class Q>
CKPT_HD void set_scales(const TensorSetup& s, int bn, const BlockTrial<Q>* t, BlockWork<Q>& w) {
    const bool ams = s.moments() == 3;
    for (int j = 0; j < bn; ++j) {  // branch-free (a dropped coordinate's stale cell is computed, then discarded)
        const double r = m_scale(s.format6, w.cells[1].dec[j], ams ? w.cells[2].dec[j] : 0.0);
        w.scale[j] = t->keep[j] ? r : 0.0;
    }
}

/// certify_closed over the first bn coordinates of a block's cells: closed[j] = its
/// certificate where the closed stage alone certifies (<= tol), else -1. A loop without
/// branches (amsgrad is a template flag; stale cells of dropped coordinates compute
/// garbage that the caller ignores), so it vectorises.
template <bool kVmax, bool kAll>
CKPT_HD_FORCE void closed_stage_block(const GuardConst& gc, const BlockCells* cells, int bn, double tol, double* closed) {
    if (!fp32_gate_tensor(gc)) {  // the gate fails every inexact coordinate: certify() decides each
        for (int j = 0; j < bn; ++j) closed[j] = -1.0;
        return;
    }
    // a local copy: a field of gc read only under a condition (fp32_rel, say) is a load
    // that may trap for the if-converter, which then leaves the loop scalar
    const GuardConst c = gc;
    for (int j = 0; j < bn; ++j) {
        GuardInput g;
        g.amsgrad = kVmax;
        g.m = cells[0].get(j);
        g.v = cells[1].get(j);
        if (kVmax) g.vmax = cells[2].get(j);
        const ClosedStage k = certify_closed_h<kAll>(c, g);
        closed[j] = ((k.gate_failed == 0) & (k.closed <= tol)) ? k.closed : -1.0;
    }
}

/// certify() of the first bn coordinates of a block's cells (chunk coordinates i0 + j),
/// bound[j] for every j with which[j] (every j when which is null). certify()'s closed
/// stage runs first over the whole block (closed_stage_block: branch-free, vectorised, no
/// gradient domain needed), certify() itself only where that does not certify: the same
/// bound as certify() alone. `closed`: scratch of one block row.
CKPT_HD void certify_cells(const TensorSetup& s, const GuardConst& gc, const BlockCells* cells, const float* theta,
                           std::size_t i0, int bn, const bool* which, double* bound, double* closed) {
    const bool ams = s.moments() == 3;
    if (gc.all) {  // template flags: each loop stays branch-free
        if (ams) closed_stage_block<true, true>(gc, cells, bn, s.tolerance, closed);
        else closed_stage_block<false, true>(gc, cells, bn, s.tolerance, closed);
    } else {
        if (ams) closed_stage_block<true, false>(gc, cells, bn, s.tolerance, closed);
        else closed_stage_block<false, false>(gc, cells, bn, s.tolerance, closed);
    }
    for (int j = 0; j < bn; ++j) {
        if (which && !which[j]) continue;
        if (closed[j] >= 0) { bound[j] = closed[j]; continue; }
        const Cell c[3] = {cells[0].get(j), cells[1].get(j), ams ? cells[2].get(j) : Cell{}};
        bound[j] = certify(gc, guard_input(s, c, theta, i0 + std::size_t(j)));
    }
    if (s.hyper.bound_param)  // an exact coordinate (bound 0) writes the same parameter in both runs
        for (int j = 0; j < bn; ++j) {
            if ((which && !which[j]) || !(bound[j] > 0)) continue;
            const Cell c[3] = {cells[0].get(j), cells[1].get(j), ams ? cells[2].get(j) : Cell{}};
            bound[j] += param_term(s, gc, c, theta, i0 + std::size_t(j));
        }
}

/// Certify every coordinate of trial t that has codes (certify_cells); counts range and
/// total escapes.
template <class Q>
CKPT_HD void certify_trial(const TensorSetup& s, const GuardConst& gc, const float* theta, std::size_t i0, int bn,
                           BlockTrial<Q>* t, BlockWork<Q>& w) {
    t->escapes = 0;
    t->range_escapes = 0;
    // w.sens as scratch: vlog_plan's sensitivities are used up by now
    certify_cells(s, gc, w.cells, theta, i0, bn, t->keep, t->bound, w.sens[0]);
    // branch-free (bound[j] of a coordinate without codes is stale, never used): the
    // certificates' verdicts as bytes (a loop that vectorises), then the flags 8 at a time
    bool ok[kBlock];
    for (int j = 0; j < bn; ++j) ok[j] = t->bound[j] <= s.tolerance;
    int j = 0;
    for (; j + 8 <= bn; j += 8) {
        const uint64_t k0 = load_flags8(t->keep + j), k1 = k0 & load_flags8(ok + j);
        store_flags8(t->code_ok + j, k0);
        store_flags8(t->keep + j, k1);
        t->range_escapes += 8 - count_flags8(k0);
        t->escapes += 8 - count_flags8(k1);
    }
    for (; j < bn; ++j) {
        t->range_escapes += !t->keep[j];
        t->code_ok[j] = t->keep[j];
        t->keep[j] = t->keep[j] & ok[j];
        t->escapes += !t->keep[j];
    }
}

/// Encode and certify the block of bn (<= kBlock) coordinates starting at chunk index
/// i0. src[k] (k = 0 exp_avg, 1 exp_avg_sq, 2 max_exp_avg_sq) and theta (may be null) are
/// chunk-based. Moments are coded in the order max_exp_avg_sq, exp_avg_sq, exp_avg; the
/// exp_avg_sq / max_exp_avg_sq params are choose()'s, then (only while the best trial has
/// a value outside its range) the codec's alternatives; exp_avg follows the decoded v. Returns the best
/// trial (fewest escapes, earliest on ties), which lives in `w`.
template <class Q>
CKPT_HD const BlockTrial<Q>& encode_block(const TensorSetup& s, const GuardConst& gc, const float* const* src,
                                          const float* theta, std::size_t i0, int bn, BlockWork<Q>& w) {
    const int nm = s.moments();
    BlockTrial<Q>* best = &w.trial[0];
    BlockTrial<Q>* t = &w.trial[1];
    best->escapes = bn + 1;
    best->range_escapes = 1;
    // Alternatives only widen ranges (and cells): they are tried only while the best trial
    // has a value outside its range; a certificate failure alone is final.
    for (int trial = 0; trial < 2 * Q::kVariants && best->range_escapes > 0; ++trial) {
        const int variant = trial / 2, mvariant = trial % 2;  // v step, exp_avg step
        bool any = variant == 0;
        for (int k = nm - 1; k >= 1; --k) {
            Q::choose(src[k] + i0, bn, role_of(k), nullptr, gc, t->p[k]);
            if (variant > 0) any = Q::vary(t->p[k], variant) || any;
        }
        if (!any || (mvariant && Q::kVariants == 1)) continue;
        for (int j = 0; j < bn; ++j) t->keep[j] = true;
        for (int k = nm - 1; k >= 0; --k) {
            if (k == 0) {
                set_scales(s, bn, t, w);
                Q::choose(src[0] + i0, bn, role_of(0), w.scale, gc, t->p[0]);
                if (mvariant) Q::vary(t->p[0], -1);
            }
            code_role(s, src, i0, bn, k, t, w);
        }
        certify_trial(s, gc, theta, i0, bn, t, w);
        if (t->escapes < best->escapes) {
            BlockTrial<Q>* x = best;
            best = t;
            t = x;
        }
    }
    return *best;
}

/// vlog_plan's sensitivities A[j], B[j] and w.live of a block's first bn coordinates
/// without max_exp_avg_sq (see vlog_plan), in arithmetic of type T. With vmax = 0,
/// sqrt(C) = sqrt(b2) sqrt(v): one root and two divisions. float first: twice the lanes,
/// and its roots and divisions are cheaper (lm10m: the plan 21.5 -> 17 TSC cycles per
/// coordinate); the plan only picks the steps, each coordinate's certificate then checks
/// them. float rounds A and B differently, which moves a step in about 1 block in 20,000.
/// In float, returns false (nothing written) when a constant is not a finite float, or a0
/// is 0 (double always writes, true). Otherwise a live coordinate's A and B are > 0 and
/// finite, except B = +inf where b1 |m| / sqrt(b2 v) overflows (> 2^128, which real states
/// never reach) and 0 where a constant underflowed: vlog_plan repeats such a block in
/// double. Every ISA level and the device compute the same IEEE operations.
template <class T, class Q>
CKPT_HD_FORCE bool vlog_sens(const GuardConst& gc, const float* const* src, std::size_t i0, int bn, BlockWork<Q>& w) {
    double* A = w.sens[0];
    double* B = w.sens[1];
    // locals: the stores into A and B could alias gc for the compiler (no hoisting otherwise)
    const double sb2 = sqrt(gc.b2);
    const T ka = T(gc.plan_ka), kb = T(gc.plan_kb), eps = T(gc.eps);
    const T a0 = T(sb2 / gc.sqrt_bc2), b1s = T(gc.plan_b1s), closed_g = T(gc.plan_g);
    const T em = T(gc.plan_em), egs = T(gc.plan_eg * sb2);  // closed_all's eps form (+inf: unused)
    if constexpr (std::is_same<T, float>::value) {  // double always computes (the old code's bits)
        const T big = T(INFINITY);
        if (!((ka < big) & (kb < big) & (eps < big) & (a0 < big) & (b1s < big) & (closed_g < big) & (a0 > 0))) return false;
    }
    for (int j = 0; j < bn; ++j) {  // branch-free (see vlog_plan)
        const T m = T(src[0][i0 + j]), v = T(src[1][i0 + j]);
        const bool live = (int(isfinite(m)) & int(isfinite(v)) & int(v > 0)) != 0;
        const T r = T(1) / sqrt(v);
        const T a = ka / (a0 + eps * r);
        const T bx = kb * (b1s * fabs(m) * r + closed_g);
        const T be = em * fabs(m) + egs * (v * r);  // sqrt(V) = sqrt(b2) sqrt(v); NaN or inf when unused
        const T b = be < bx ? be : bx;
        w.live[j] = live;
        A[j] = live ? double(a) : 0.0;
        B[j] = live ? double(b) : 0.0;
    }
    return true;
}

/// The exponent p = kPlanMA / kPlanMB of vlog_plan's objective dm^p delta^(2 - p): p = 1
/// (each halving of a step costs one bit per value) gives each coordinate's constraint
/// equally to the two moments; p = 2/3 gives a third to exp_avg (2/3 of its error, 4/3 of
/// exp_avg_sq's, log2(9/8) = 0.17 bits a coordinate more): exp_avg's error moves each
/// later update the same way until b1^t forgets it, so it is what a resumed run drifts by
/// most (docs/benchmarks.md, "Resume drift").
constexpr int kPlanMA = 2, kPlanMB = 3;

/// vlog's step plan for a block: from the closed form (guard.h closed_bound) each live
/// coordinate's certificate is about A*dm + B*delta, with dm the exp_avg step (units of
/// sqrt(v~)) and delta the relative half-width of the exp_avg_sq cell:
///   A = b1 sqrt(max(v, vmax)) / (2 D(0) bc1),  B = sqrt(bc2) (b1 |m| / sqrt(C) + closed_g) * max(1, vmax/C) / (2 bc1)
/// with C = b2 v. The plan maximises dm^p delta^(2-p) (kPlanMA) subject to
/// A_j dm + B_j delta <= budget for every live j, over dm/delta ratios
/// r0 p / (2 - p) times 2^(k/2), |k| <= 2, r0 = max B / max A; a coordinate whose constraint alone costs the block more bits
/// than its escape is dropped (it escapes unless it certifies anyway). Writes the steps
/// into p; returns false when no coordinate constrains the block.
template <class Q>
CKPT_HD bool vlog_plan(const TensorSetup& s, const GuardConst& gc, const float* const* src, std::size_t i0, int bn,
                       double budget, BlockWork<Q>& w, double& dm, double& delta) {
    const int nm = s.moments();
    double* A = w.sens[0];
    double* B = w.sens[1];
    // locals: the stores into A and B could alias gc for the compiler (no hoisting otherwise)
    const double b1 = gc.plan_b1, b2 = gc.b2, eps = gc.eps, sqrt_bc2 = gc.sqrt_bc2, closed_g = gc.plan_g_ams;
    const double ka = gc.plan_ka, kb = gc.plan_kb;
    // A coordinate that is not live gets A = B = 0: it then never is a block's worst
    // constraint (they start at 0 and compare strictly), so no loop below asks `live`
    // (branch-free, so they vectorise; `&`, not `&&`, which is control flow); dropping a
    // coordinate zeroes it too. A dead coordinate computes garbage (NaN, inf), then 0.
    if (nm == 3) {
        for (int j = 0; j < bn; ++j) {
            const double m = src[0][i0 + j], v = src[1][i0 + j], vx = src[2][i0 + j];
            const bool live = (int(isfinite(m)) & int(isfinite(v)) & int(isfinite(vx)) & int(v > 0) & int(vx >= 0)) != 0;
            const double C = b2 * v, v0 = C > vx ? C : vx;
            const double d0 = sqrt(v0) / sqrt_bc2 + eps;
            const double a = ka * sqrt(v > vx ? v : vx) / d0;
            const double bx = kb * (b1 * fabs(m) / sqrt(C) + closed_g) * (vx > C ? vx / C : 1.0);
            const double be = gc.plan_em * fabs(m) + gc.plan_eg * sqrt(v0);  // closed_all's eps form
            const double b = be < bx ? be : bx;
            w.live[j] = live;
            A[j] = live ? a : 0.0;
            B[j] = live ? b : 0.0;
        }
    } else if (!vlog_sens<float>(gc, src, i0, bn, w)) {  // float unless a constant is not a float
        vlog_sens<double>(gc, src, i0, bn, w);
    }
    // the rows past bn up to a multiple of 8 are zeroed, which never win a maximum
    const int bn8 = (bn + 7) / 8 * 8;
    for (int j = bn; j < bn8; ++j) A[j] = B[j] = 0;
    double amax = block_max(A, bn8), bmax = block_max(B, bn8);
    // beta1 = 0 (ka = 0): exp_avg enters no certificate (the next update replaces it:
    // b1 m + (1 - b1) g = g for every finite m), so every A is 0; exp_avg_sq's step comes from
    // B alone and exp_avg's is the coarsest (the certificate still judges every coordinate)
    const bool m_free = !(ka > 0);
    // float overflowed or underflowed (live coordinates have both > 0): double (the padding stays 0)
    if (nm == 2 && !(amax < INFINITY && bmax < INFINITY && (m_free || (amax > 0) == (bmax > 0)))) {
        vlog_sens<double>(gc, src, i0, bn, w);
        amax = block_max(A, bn8);
        bmax = block_max(B, bn8);
    }
    if (!(bmax > 0) || (!m_free && !(amax > 0))) return false;
    const double r0 = m_free ? 1.0 : bmax / amax;
    // worst (largest) constraint at ratio r over the live coordinates, and the runner-up
    // (the largest of the others: w1 again when two reach it), as one serial scan with
    // strict compares from 0 gives them; w.settled holds the constraints (the quantisers
    // write it before they read it), so worst_at finds the first that reaches w1. Loops
    // without branches: a search loop per call cost 2% of the encoder.
    auto worst = [&](double r, double& second) {
        double* c = w.settled;
        double below[kBlock];
        for (int j = 0; j < bn8; ++j) c[j] = A[j] * r + B[j];
        const double w1 = block_max(c, bn8);
        second = 0;
        if (!(w1 > 0)) return 0.0;
        int ties = 0;
        for (int j = 0; j < bn8; ++j) {
            ties += int(c[j] == w1);
            below[j] = c[j] < w1 ? c[j] : 0.0;
        }
        second = ties > 1 ? w1 : block_max(below, bn8);
        return w1;
    };
    auto worst_at = [&](double w1) {
        int at = 0;
        while (!(w.settled[at] == w1)) ++at;
        return at;
    };
    // r^p / worst(r)^2 is unimodal in r (worst is convex): 5 points around the single
    // coordinate's optimum r0 p / (2 - p), one pass; scores relative to the middle point's
    // (mult^a (w_2 / w_k)^2b = its score^b, p = a/b), so that nothing overflows and every
    // level and the device compute the same IEEE operations (no pow)
    const double rc = r0 * double(kPlanMA) / double(2 * kPlanMB - kPlanMA);
    auto best_ratio = [&]() {
        const double mult[5] = {0.5, 0.7071067811865476, 1.0, 1.4142135623730951, 2.0};
        double rk[5], wc[5];
        for (int k = 0; k < 5; ++k) rk[k] = rc * mult[k];
        block_max_affine<5>(A, B, bn8, rk, wc);
        double best = rc, score = -1;
        for (int k = 0; k < 5; ++k) {
            const double q = wc[2] / wc[k];
            double sc = 1;
            for (int e = 0; e < kPlanMA; ++e) sc *= mult[k];
            for (int e = 0; e < 2 * kPlanMB; ++e) sc *= q;
            if (sc > score) { score = sc; best = rk[k]; }
        }
        return best;
    };
    double r = m_free ? 1.0 : best_ratio();   // m_free: worst(r) is max B for any r
    const double escape_bits = 32.0 * nm + 16;
    bool dropped = false;
    double sec, w1 = 0;
    for (int drop = 0; drop < 4; ++drop) {
        w1 = worst(r, sec);
        if (!(w1 > 0) || !(sec > 0)) break;
        if (!(nm * bn * log2_hd(w1 / sec) > escape_bits)) break;  // narrowing for it costs more than its escape
        const int at = worst_at(w1);
        w.live[at] = false;
        A[at] = B[at] = 0;
        dropped = true;
    }
    if (dropped) {  // else w1 is already the worst constraint at r
        r = m_free ? 1.0 : best_ratio();
        w1 = worst(r, sec);
    }
    const double L = budget / w1;
    dm = m_free ? 1e300 : L * r;   // m_free: VLog::m_step clamps it to the largest step
    delta = L;
    return true;
}

/// vlog codes and cells of second moment k (1: exp_avg_sq, 2: max_exp_avg_sq, coded on
/// exp_avg_sq's grid p relative to code1's index) for the first bn coordinates of a block;
/// lg[j] = log2_hd(x[j]) where x[j] > 0 is finite. keep[j] drops the coordinates without a
/// code (those already dropped get garbage codes and cells, never read). The same codes
/// and cells as VLog::encode_v per value (cells partition the line, so the nearest code is
/// the one whose cell holds the value, whatever the guess), in two passes: a branch-free
/// one (it vectorises) guesses the index whose cell holds the value and checks it; the
/// values it leaves unsettled (a guess off by one near a cell end, a range end, +0, no
/// positive finite value) then go through VLog::encode / encode_v themselves.
CKPT_HD_FORCE void vlog_code_v_block(MomentType type, const float* x, const double* lg, const int16_t* p, int bn,
                                     int k, const uint16_t* code1, bool* keep, uint16_t* code, BlockCells& cells,
                                     double* settled) {
    // Doubles throughout: flags are flag_hd values, the guess is rounded with the
    // 1.5 * 2^52 trick and clamped (NaN to a bound) before any conversion to int. Every
    // value is an exact integer where it stands for one (|e| < 2^31).
    // The guess: the cell of index j ends at the midpoint of 2^(e/1024) and 2^((e+st)/1024),
    // at u = j + cb on the scale u = (log2 x * 1024 - a16) / st of the indices, with
    // cb = 1024 log2((1 + 2^(st/1024)) / 2) / st in (1/2, 1); so x lies in cell
    // ceil(u - cb) = nearest(u - (cb - 1/2)). Errors of log2_poly (< 1e-5 octave) and the
    // table's float rounding move the guess only for values within ~0.02/st of a cell end:
    // those fail the check and are left unsettled.
    const int32_t st = p[1];
    const double a16 = double(int32_t(p[0]) * 16), sd = double(st), inv_sd = 1 / sd;
    const double off = 1024 * log2_hd((1 + VLog::value32(st)) / 2) * inv_sd - 0.5;
    constexpr double kMax = VLog::kMaxIndex;
    for (int j = 0; j < bn; ++j) {
        const double a = x[j];
        const double est = (lg[j] * 1024 - a16) * inv_sd - off;
        const double inr = flag_hd(est > -kMax - 2) * flag_hd(est < kMax + 2) * flag_hd(a > 0) * flag_hd(a < INFINITY);
        const double jd = fmin_hd(fmax_hd((est + 0x1.8p52) - 0x1.8p52, -kMax), kMax);
        const double e0d = a16 + jd * sd;
        const int32_t e0 = int32_t(e0d);
        const double xj = VLog::value32(e0);
        const double lo = (xj + VLog::value32(e0 - st)) / 2, hi = (xj + VLog::value32(e0 + st)) / 2;
        settled[j] = inr * flag_hd(xj > 0) * flag_hd(hi < INFINITY) * flag_hd(a > lo) * flag_hd(a <= hi);
        code[j] = uint16_t(int32_t(1 + (jd >= 0 ? 2 * jd : -2 * jd - 1)));  // 1 + zigzag(jd)
        cells.dec[j] = xj;
        cells.lo[j] = lo;
        cells.hi[j] = hi;
    }
    if (type == MomentType::F32 && k == 1 && block_all_nonzero(settled, bn)) return;  // nothing left to do
    for (int j = 0; j < bn; ++j) {
        if (!keep[j]) continue;
        if (settled[j] == 0) {
            if (x[j] > 0 && isfinite(x[j])) {
                Cell c;
                keep[j] = VLog::encode_v(x[j], lg[j], p, &code[j], &c);
                cells.set(j, c);
            } else {
                keep[j] = VLog::encode(x[j], role_of(k), p, 0, &code[j]);  // +0 -> code 0, exact; else no code
                if (keep[j]) cells.set(j, Cell{});
                continue;
            }
        }
        if (type != MomentType::F32) cells.dec[j] = round_to_type(type, cells.dec[j]);
        if (k == 2 && keep[j]) {  // relative to exp_avg_sq's index
            const int64_t d = VLog::unzigzag(uint32_t(code[j]) - 1) - VLog::index_of(code1[j]);
            keep[j] = d >= -VLog::kMaxIndex && d <= VLog::kMaxIndex;
            code[j] = uint16_t(1 + VLog::zigzag(int32_t(keep[j] ? d : 0)));
        }
    }
}

/// vlog exp_avg codes and cells of a block's first bn coordinates in units
/// d[j] = unit * scale[j], for the coordinates still kept (keep[j] drops those without a
/// code). The same as VLog::encode_m_value and m_cell per value, in two passes: a
/// branch-free first guess and at most one step to the nearest cell, then encode_m_value
/// itself for what that leaves (non-finite values or units, range ends, more steps).
CKPT_HD_FORCE void vlog_code_m_block(MomentType type, const float* x, double unit, const double* scale, int bn,
                                     bool* keep, uint16_t* code, BlockCells& cells, double* settled) {
    // Doubles throughout, flags are flag_hd values, selects are blends with them (a blend
    // with an infinite value gives NaN, which leaves the value unsettled)
    constexpr double kMax = VLog::kMaxIndex;
    for (int j = 0; j < bn; ++j) {
        const double d = unit * scale[j];
        const double xd = x[j], a = fabs(xd);
        const double neg = flag_hd(copysign(1.0, xd) < 0);  // signbit: -0.0 keeps its sign
        const double qf = a / d;
        const double inr = flag_hd(d > 0) * flag_hd(d < INFINITY) * flag_hd(qf < kMax + 0.5);  // 0 for NaN qf
        const double q0 = fmin_hd(fmax_hd((qf + 0x1p52) - 0x1p52, 0.0), kMax + 1);  // a first guess, as encode_m's (NaN: 0)
        const double up = flag_hd(a > (q0 + 0.5) * d) * flag_hd(q0 < kMax);  // encode_m's loop, once
        const double dn = (1 - up) * flag_hd(q0 > 0) * flag_hd(a < (q0 - 0.5) * d);
        const double zero = flag_hd(a == 0);
        const double q = (1 - zero) * (q0 + up - dn);
        const double hi = (q + 0.5) * d, lo = (q - 0.5) * d;  // lo = -0.5 d at q = 0, as m_cell
        settled[j] = fmax_hd(zero * flag_hd(d < INFINITY), inr * flag_hd(a <= hi) * fmax_hd(flag_hd(q == 0), flag_hd(a >= lo)));
        code[j] = uint16_t(int32_t(2 * q + neg));  // q in [0, kMax + 2]
        const double xv = (1 - flag_hd(q == 0)) * double(float(q * d));
        cells.dec[j] = (1 - 2 * neg) * xv;
        cells.lo[j] = neg * -hi + (1 - neg) * lo;
        cells.hi[j] = neg * -lo + (1 - neg) * hi;
    }
    if (type == MomentType::F32 && block_all_nonzero(settled, bn)) return;  // nothing left to do
    for (int j = 0; j < bn; ++j) {
        if (!keep[j]) continue;
        if (settled[j] == 0) {
            const double d = unit * scale[j];
            keep[j] = VLog::encode_m_value(x[j], d, &code[j]);
            if (!keep[j]) continue;
            cells.set(j, VLog::m_cell(code[j], d));
        }
        if (type != MomentType::F32) cells.dec[j] = round_to_type(type, cells.dec[j]);
    }
}

/// vlog's block encoder: steps from vlog_plan at 90% of the tolerance, then (only while a
/// coordinate the plan kept fails its certificate) again at 70% and 49%; the trial with
/// the fewest escapes wins, the coarsest on ties. Codes are the nearest per moment, as in
/// every codec; the certificate is guard.h's.
template <>
CKPT_HD const BlockTrial<VLog>& encode_block<VLog>(const TensorSetup& s, const GuardConst& gc, const float* const* src,
                                                  const float* theta, std::size_t i0, int bn, BlockWork<VLog>& w) {
    const int nm = s.moments();
    BlockTrial<VLog>* best = &w.trial[0];
    BlockTrial<VLog>* t = &w.trial[1];
    best->escapes = bn + 1;
    for (int k = 1; k < nm; ++k)
        for (int j = 0; j < bn; ++j) w.lg[k][j] = log2_float(src[k][i0 + j]);
    double dm = 1, delta = 0.5;
    // 90%: the rest covers the FP32 margin and the cells' asymmetry (a larger share makes
    // more blocks fail and re-code finer; docs/benchmarks.md, "Measurements behind the
    // code's choices")
    // --bound param: the steps leave room for the block's largest parameter term at |u| <= |theta|
    double room = s.tolerance;
    if (s.hyper.bound_param) {
        double most = 0;
        for (int j = 0; j < bn; ++j) {
            const double th = theta ? fabs(double(theta[i0 + j])) : s.domain.theta_bound;
            const double t = ulp32_at(2 * th) / gc.lr;
            most = t > most ? t : most;
        }
        room = most < s.tolerance ? s.tolerance - most : s.tolerance;  // none left: they escape whatever the steps
    }
    const bool constrained = vlog_plan(s, gc, src, i0, bn, 0.9 * room, w, dm, delta);
    const int16_t anchor = VLog::anchor(src[1] + i0, w.lg[1], bn);  // the same in every trial (bn <= kBlock <= 64)
    // A plan allowing an exp_avg_sq step of an octave or more (closed_all's eps form, where
    // sqrt(v) << eps) gets exactly one octave on whole octaves: the grid is then the powers of
    // two, 2^-149 included, so every positive float, subnormals too, has a code (a coarser
    // grid's next value below can round to 0, leaving the values under it without one).
    const int a_oct = (anchor >= 0 ? anchor + 32 : anchor - 32) / 64 * 64;
    const int16_t anchor_oct = int16_t(a_oct > 32767 ? a_oct - 64 : a_oct < -32767 ? a_oct + 64 : a_oct);
    double scale = 1;
    for (int trial = 0; trial < 3; ++trial, scale *= 0.7) {
        t->p[0][0] = VLog::m_step(dm * scale);
        t->p[0][1] = 0;
        t->p[1][1] = VLog::v_step(delta * scale);
        const bool octave = t->p[1][1] >= 1024;
        t->p[1][0] = octave ? anchor_oct : anchor;
        t->p[1][1] = octave ? int16_t(1024) : t->p[1][1];
        if (nm == 3) t->p[2][0] = t->p[2][1] = 0;  // max_exp_avg_sq uses exp_avg_sq's grid
        for (int j = 0; j < bn; ++j) t->keep[j] = true;
        for (int k = 1; k < nm; ++k)  // second moments: the log2 is computed once per block
            vlog_code_v_block(s.type, src[k] + i0, w.lg[k], t->p[1], bn, k, t->code[1], t->keep, t->code[k],
                              w.cells[k], w.settled);
        for (int j = 0; j < bn; ++j)  // set_scales without its keep select: dropped coordinates are never read
            w.scale[j] = m_scale(s.format6, w.cells[1].dec[j], nm == 3 ? w.cells[2].dec[j] : 0.0);
        vlog_code_m_block(s.type, src[0] + i0, VLog::value(t->p[0][0]), w.scale, bn, t->keep, t->code[0], w.cells[0],
                          w.settled);
        certify_trial(s, gc, theta, i0, bn, t, w);
        // a coordinate the plan kept (live) lost its codes: 8 flags at a time, then the tail
        uint64_t failed = 0;
        int j = 0;
        for (; j + 8 <= bn; j += 8) failed |= load_flags8(w.live + j) & ~load_flags8(t->keep + j);
        for (; j < bn; ++j) failed |= uint64_t(w.live[j] & !t->keep[j]);
        const bool planned_failed = failed != 0;
        if (t->escapes < best->escapes) {
            BlockTrial<VLog>* x = best;
            best = t;
            t = x;
        }
        if (!planned_failed || !constrained) break;
    }
    return *best;
}

/// Decoded values and cells of coordinate i of a chunk (c[k] for k < s.moments()), or
/// values only when `cells` is false (restore: c[k].dec alone is set). codes[k] /
/// params[k] are chunk-based. Returns false when a used code decodes outside the float
/// range (code_in_range; the same answer with and without cells).
template <class Q>
CKPT_HD bool decode_cells(const TensorSetup& s, const uint8_t* const* codes, const int16_t* const* params,
                          std::size_t i, bool cells, Cell* c) {
    const int nm = s.moments();
    const std::size_t b = i / kBlock;
    const int order[3] = {1, 2, 0};  // exp_avg_sq, max_exp_avg_sq, then exp_avg (relative to both)
    bool ok = true;
    for (int oi = 0; oi < 3; ++oi) {
        const int k = order[oi];
        if (k >= nm) continue;
        const double scale = k == 0 ? m_scale(s.format6, c[1].dec, nm == 3 ? c[2].dec : 0.0) : 0.0;
        const uint16_t code = load_code(codes[k], Q::kCodeBytes, i);
        const int16_t* p = params[k] + b * Q::kParams;
        const Role r = role_of(k);
        if constexpr (std::is_same<Q, VLog>::value) {
            // vlog's cells are ordered and its values never negative, so its check is on the
            // value alone (the check of vlog_decode_block, which has no cells on restore)
            if (k == 2) {  // on exp_avg_sq's grid, relative to its index
                c[2] = VLog::vmax_cell(code, load_code(codes[1], Q::kCodeBytes, i), params[1] + b * Q::kParams);
                ok = ok & (code == 0 || code_in_range<VLog>(Cell{c[2].dec, 0, 0}, r));
                c[2].dec = round_to_type(s.type, c[2].dec);
                continue;
            }
            if (cells) c[k] = VLog::cell(code, r, p, scale);
            else c[k].dec = VLog::decoded(code, r, p, scale);  // restore: no cells needed
            ok = ok & (!VLog::used(code, r) || code_in_range<VLog>(Cell{c[k].dec, 0, 0}, r));
            c[k].dec = round_to_type(s.type, c[k].dec);
        } else {
            const Cell raw = Q::cell(code, r, p, scale);
            ok = ok & (!Q::used(code, r) || code_in_range<Q>(raw, r));
            if (cells) c[k] = raw;
            c[k].dec = round_to_type(s.type, raw.dec);
        }
    }
    return ok;
}

/// Decode coordinate i of a chunk: out[k][i] (when out[k] is non-null) and, when bounds
/// is non-null, its re-derived certificate bounds[i]. codes[k] / params[k] are chunk-based.
/// Returns decode_cells' flag (false: a used code outside the float range).
template <class Q>
CKPT_HD bool decode_coord(const TensorSetup& s, const GuardConst& gc, const uint8_t* const* codes,
                          const int16_t* const* params, std::size_t i, float* const* out, const float* theta,
                          double* bounds) {
    Cell c[3];
    const bool ok = decode_cells<Q>(s, codes, params, i, bounds != nullptr, c);
    for (int k = 0; k < s.moments(); ++k)
        if (out[k]) out[k][i] = float(c[k].dec);
    if (bounds) {
        const double bd = certify(gc, guard_input(s, c, theta, i));
        bounds[i] = s.hyper.bound_param && bd > 0 ? bd + param_term(s, gc, c, theta, i) : bd;  // as certify_cells
    }
    return ok;
}

/// vlog's decode of one block, role by role without decode_cells' per-coordinate role
/// loop: exactly decode_cells<VLog>'s values, and with `with_cells` its cells, for
/// coordinates [i0, i0 + bn) of block i0 / kBlock, into cells[k] (SoA; .dec only without
/// with_cells) and out[k] where non-null (test_codec compares the two bit for bit).
/// Returns decode_cells' flag over the block: false when a used code decodes outside the
/// float range (to 0 or inf; code_in_range), checked in loops of their own.
CKPT_HD bool vlog_decode_block(const TensorSetup& s, const uint8_t* const* codes, const int16_t* const* params,
                               std::size_t i0, int bn, bool with_cells, float* const* out, BlockCells* cells) {
    const int nm = s.moments();
    const std::size_t b = i0 / kBlock;
    const int16_t* pv = params[1] + b * VLog::kParams;
    const MomentType t = s.type;
    // Branch-free loops over the block (they vectorise), as vlog_code_v_block: the
    // exponent of index idx in doubles, clamped as VLog::value clamps it; a code 0 (exact
    // zero) selects 0 afterwards.
    const double a16 = double(pv[0]) * 16, st = pv[1], lim = opaque_hd(double(int64_t(1) << 30));
    auto grid = [&](double e) {  // e is finite: a plain min / max clamps it (to an opaque bound, see opaque_hd)
        e = e > lim ? lim : e;
        e = e < -lim ? -lim : e;
        return VLog::value32(int32_t(e));
    };
    // 1.0 where a coordinate's codes decode inside the float range (code 0, or a value in
    // (0, inf) before round_to_type), else 0.0: flags as doubles, in loops of their own
    double in_range[kBlock];
    bool ok = true;
    auto second = [&](int k, auto with) {  // with: whether the cells are wanted (a compile-time flag)
        BlockCells& r = cells[k];
        const double rel = k == 2 ? 1.0 : 0.0;  // max_exp_avg_sq: relative to exp_avg_sq's index
        // The exponents first, then the grid values unconditionally, then the selects of
        // code 0: GCC 12 sinks a table read that only one side of a select needs into a
        // masked gather, which it cannot emulate, and leaves the whole loop scalar (AVX2).
        double ex[kBlock], zf[kBlock];
        for (int j = 0; j < bn; ++j) {
            const uint32_t c = load_code(codes[k], 2, i0 + j), c1 = load_code(codes[1], 2, i0 + j);
            const double at = rel * flag_hd(c1 != 0) * double(VLog::unzigzag(c1 - 1));  // code 0: index 0
            ex[j] = a16 + (at + double(VLog::unzigzag(c - 1))) * st;  // c = 0: garbage, not selected
            zf[j] = flag_hd(c == 0);
        }
        for (int j = 0; j < bn; ++j) r.dec[j] = grid(ex[j]);
        for (int j = 0; j < bn; ++j) in_range[j] = zf[j] + (1 - zf[j]) * flag_hd(r.dec[j] > 0) * flag_hd(r.dec[j] < INFINITY);
        ok = ok & block_all_nonzero(in_range, bn);
        if constexpr (decltype(with)::value) {
            for (int j = 0; j < bn; ++j) {
                r.lo[j] = grid(ex[j] - st);
                r.hi[j] = grid(ex[j] + st);
            }
            for (int j = 0; j < bn; ++j) {
                const double dec = r.dec[j];
                r.lo[j] = zf[j] != 0 ? 0.0 : (dec + r.lo[j]) / 2;
                r.hi[j] = zf[j] != 0 ? 0.0 : (dec + r.hi[j]) / 2;
            }
        }
        for (int j = 0; j < bn; ++j) r.dec[j] = zf[j] != 0 ? 0.0 : r.dec[j];
        if (t != MomentType::F32)
            for (int j = 0; j < bn; ++j) r.dec[j] = round_to_type(t, r.dec[j]);
    };
    for (int k = 1; k < nm; ++k) {
        if (with_cells) second(k, std::true_type{});
        else second(k, std::false_type{});
    }
    const double unit = VLog::value(params[0][b * VLog::kParams]);
    BlockCells& m = cells[0];
    for (int j = 0; j < bn; ++j) {
        const uint32_t c = load_code(codes[0], 2, i0 + j);
        const double d = unit * m_scale(s.format6, cells[1].dec[j], nm == 3 ? cells[2].dec[j] : 0.0);
        const double q = double(c >> 1), neg = flag_hd((c & 1) != 0);
        m.dec[j] = VLog::m_decoded(uint16_t(c), d);
        if (with_cells) {
            const double lo = (q - 0.5) * d, hi = (q + 0.5) * d;  // lo = -0.5 d at q = 0
            m.lo[j] = neg != 0 ? -hi : lo;
            m.hi[j] = neg != 0 ? -lo : hi;
        }
    }
    for (int j = 0; j < bn; ++j) {
        const double q0 = flag_hd((load_code(codes[0], 2, i0 + j) >> 1) == 0), a = fabs(m.dec[j]);
        in_range[j] = q0 + (1 - q0) * flag_hd(a > 0) * flag_hd(a < INFINITY);
    }
    ok = ok & block_all_nonzero(in_range, bn);
    if (t != MomentType::F32)
        for (int j = 0; j < bn; ++j) m.dec[j] = round_to_type(t, m.dec[j]);
    for (int k = 0; k < nm; ++k)
        if (out[k])
            for (int j = 0; j < bn; ++j) out[k][i0 + j] = float(cells[k].dec[j]);
    return ok;
}

/// decode_coord with bounds for the bn coordinates of the block starting at chunk index
/// i0 (the same values and bounds): the cells of the whole block first, then
/// certify_cells. `cells` / `closed`: scratch of 3 and 1 block rows. Returns false when a
/// used code of the block decodes outside the float range (decode_coord's flag).
template <class Q>
CKPT_HD bool decode_block_bounds(const TensorSetup& s, const GuardConst& gc, const uint8_t* const* codes,
                                 const int16_t* const* params, std::size_t i0, int bn, float* const* out,
                                 const float* theta, double* bounds, BlockCells* cells, double* closed) {
    const int nm = s.moments();
    bool ok = true;
    if constexpr (std::is_same<Q, VLog>::value) {
        ok = vlog_decode_block(s, codes, params, i0, bn, true, out, cells);
    } else {
        for (int j = 0; j < bn; ++j) {
            Cell c[3];
            ok = decode_cells<Q>(s, codes, params, i0 + std::size_t(j), true, c) & ok;
            for (int k = 0; k < nm; ++k) {
                cells[k].set(j, c[k]);
                if (out[k]) out[k][i0 + std::size_t(j)] = float(c[k].dec);
            }
        }
    }
    certify_cells(s, gc, cells, theta, i0, bn, nullptr, bounds + i0, closed);
    return ok;
}

}  // namespace ckpt::codec
