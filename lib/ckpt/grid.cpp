// ckpt-verify's dense-grid kernel (grid.h). Compiled with -O3 -ffp-contract=off
// -fno-math-errno -fno-trapping-math (lib/ckpt/CMakeLists.txt) so that its loops vectorise
// with the same IEEE operations, in the same order, on every target_clones ISA.
#include "ckpt/grid.h"

#include <cstring>

#include "codec/hd.h"

namespace ckpt {

namespace {

struct GridState {  // the two states' per-coordinate constants
    double a1, a2, c1, c2, e1, e2, x1, x2, sx1, isb, inv_bc1, eps;  // sx1 = sqrt(x1)
    /// D(t) = sqrt(max(c + e2 t^2, x)) / sqrt(bc2) + eps of the state with constants c, x.
    __attribute__((always_inline)) double d(double c, double x, double t) const {
        const double w = c + e2 * t * t;
        return std::sqrt(w > x ? w : x) * isb + eps;
    }
    /// D(t) of state 1 or 2.
    double denom(int which, double t) const { return which == 1 ? d(c1, x1, t) : d(c2, x2, t); }
    /// D1 at t (the original state), with its square root factored out when kFactored.
    template <bool kFactored>
    __attribute__((always_inline)) double d1_at(double t, double scale, double root) const {
        if constexpr (kFactored) {  // sqrt(b2 v + e2 t^2) = scale * root[k] when scale^2 = v
            const double s1 = scale * root;
            return (s1 > sx1 ? s1 : sx1) * isb + eps;
        } else {
            return d(c1, x1, t);
        }
    }
    __attribute__((always_inline)) double d2_at(double t) const { return d(c2, x2, t); }
};

/// The fast loops. kScreen: only whether some point has |N| > thr P (thr = min(the bound,
/// a known max)), noted in r.over, and the points inside counted; no per-lane best. With
/// kSymmetric (domain [-h, h], h >= 0, or the whole line) every grid t is >= 0 >= lo, so
/// +t and -t are both inside exactly when t <= h, and max(|A + B|, |A - B|) = |A| + |B|
/// (the same double: the sum of two same-signed values rounds the same way), where
/// N(+-t) = A +- B, A = a1 D2 - a2 D1, B = e1 t (D2 - D1). Not kScreen (the full loop, any
/// domain): every point over the bound counted and each lane's best point kept.
template <bool kFactored, bool kSymmetric, bool kScreen>
__attribute__((always_inline)) inline void grid_loop_fast(const GridState& g, double lo, double hi, double scale,
                                                          double bound, double thr, const GridPoints& grid, GridResult& r) {
    static_assert(kScreen || !kSymmetric, "the full loop counts +t and -t apart");
    const double* mult = grid.mult.data();
    const double* root = grid.root.data();
    const int n = int(grid.mult.size());
    const double bb = bound / g.inv_bc1;
    // per lane: the best |N| and its P (as bits), and the counts as doubles (exact below
    // 2^53): every lane of the loop is then 64-bit, with no mask-width conversions
    uint64_t best_n[kLanes], best_p[kLanes];
    double over[kLanes], points[kLanes];
    const double one = 1;
    for (int j = 0; j < kLanes; ++j) { best_n[j] = 0; std::memcpy(&best_p[j], &one, 8); over[j] = 0; points[j] = 0; }
    for (int k0 = 0; k0 < n; k0 += kLanes)
        for (int j = 0; j < kLanes; ++j) {  // one vector of kLanes points; lanes carry through memory
            const int k = k0 + j;
            const double t = scale * mult[k];  // NaN on the padding: outside every domain
            const double d1 = g.d1_at<kFactored>(t, scale, root[k]), d2 = g.d2_at(t);
            const double p = d1 * d2;
            const double a = g.a1 * d2 - g.a2 * d1, b = g.e1 * t * (d2 - d1);
            if constexpr (kScreen) {
                const double lim = thr * p;
                if constexpr (kSymmetric) {
                    const double in = codec::flag_hd(t <= hi);
                    const double m = (std::fabs(a) + std::fabs(b)) * in;  // NaN on the padding
                    over[j] += codec::flag_hd(m > lim);
                    points[j] += 2 * in;
                } else {
                    const bool in_p = (t >= lo) & (t <= hi), in_q = (-t >= lo) & (-t <= hi);
                    const double mp = in_p ? std::fabs(a + b) : 0.0, mq = in_q ? std::fabs(a - b) : 0.0;
                    over[j] += codec::flag_hd((mp > lim) | (mq > lim));
                    points[j] += codec::flag_hd(in_p) + codec::flag_hd(in_q);
                }
            } else {
                const double lim = bb * p;
                const bool in_p = (t >= lo) & (t <= hi), in_q = (-t >= lo) & (-t <= hi);
                const double mp = in_p ? std::fabs(a + b) : 0.0, mq = in_q ? std::fabs(a - b) : 0.0;
                const double m = mp > mq ? mp : mq;
                over[j] += codec::flag_hd(mp > lim) + codec::flag_hd(mq > lim);
                points[j] += codec::flag_hd(in_p) + codec::flag_hd(in_q);
                double bn, bp;
                std::memcpy(&bn, &best_n[j], 8);
                std::memcpy(&bp, &best_p[j], 8);
                const bool better = m * bp > bn * p;  // false on the padding (p NaN)
                // the new best by bit masks, not a select: GCC made the select a masked
                // store plus a branch, and the next vector's load of best_n waited on it
                const uint64_t keep = uint64_t(better) - 1;  // all ones: keep the old best
                uint64_t mb, pb;
                std::memcpy(&mb, &m, 8);
                std::memcpy(&pb, &p, 8);
                best_n[j] = (mb & ~keep) | (best_n[j] & keep);
                best_p[j] = (pb & ~keep) | (best_p[j] & keep);
            }
        }
    for (int j = 0; j < kLanes; ++j) {
        if constexpr (!kScreen) {
            double bn, bp;
            std::memcpy(&bn, &best_n[j], 8);
            std::memcpy(&bp, &best_p[j], 8);
            const double w = bn / bp * g.inv_bc1;
            r.max_diff = w > r.max_diff ? w : r.max_diff;
        }
        r.points += uint64_t(points[j]);
        r.over += uint64_t(over[j]);  // kScreen: lanes with a point over thr (grid_check reruns)
    }
}

template <bool kFactored>
__attribute__((always_inline)) inline void grid_loop_exact(const GridState& g, double lo, double hi, double scale,
                                                           double bound, const GridPoints& grid, GridResult& r) {
    const double* mult = grid.mult.data();
    const double* root = grid.root.data();
    uint64_t points = 0, n_over = 0, wbits = 0;
    for (int k = 0; k < grid.size; ++k) {
        const double t = scale * mult[k];
        const double d1 = g.d1_at<kFactored>(t, scale, root[k]), d2 = g.d2_at(t);
        const double r1 = g.inv_bc1 / d1, r2 = g.inv_bc1 / d2;
        const double p1 = (g.a1 + g.e1 * t) * r1, p2 = (g.a2 + g.e1 * t) * r2;
        const double q1 = (g.a1 - g.e1 * t) * r1, q2 = (g.a2 - g.e1 * t) * r2;
        const bool in_p = (t >= lo) & (t <= hi), in_q = (-t >= lo) & (-t <= hi);
        const double dp = std::fabs(p1 - p2), dq = std::fabs(q1 - q2);
        const bool use_p = in_p & !((p1 != p1) & (p2 != p2)), use_q = in_q & !((q1 != q1) & (q2 != q2));
        n_over += uint64_t(use_p & !(dp <= bound)) + uint64_t(use_q & !(dq <= bound));
        // the max over bit patterns: for non-negative doubles unsigned order is numeric
        // order, and an integer max vectorises without fast-math; NaN (one update NaN) is
        // counted above, not a max
        const double wp = (use_p & (dp == dp)) ? dp : 0.0, wq = (use_q & (dq == dq)) ? dq : 0.0;
        uint64_t bp, bq;
        std::memcpy(&bp, &wp, sizeof bp);
        std::memcpy(&bq, &wq, sizeof bq);
        const uint64_t b = bp > bq ? bp : bq;
        wbits = b > wbits ? b : wbits;
        points += uint64_t(in_p) + uint64_t(in_q);
    }
    double worst;
    std::memcpy(&worst, &wbits, sizeof worst);
    r.max_diff = worst > r.max_diff ? worst : r.max_diff;
    r.over += n_over;
    r.points += points;
}

/// The linearised screen (LinearScreen's constants, run by screen_linear): no square
/// root, division or mask per point. On the original's factored root s1 = scale root[k]
/// (s1^2 = w = c1 + e2 t^2 >= c1 up to rounding) with dv = c2 - c1, the decoded root is
/// sqrt(w + dv) = s1 sqrt(1 + x),
/// x = dv / w, |x| <= xm = |dv| / c1 <= 1/4. Then 0 <= 1 + x/2 - sqrt(1 + x)
/// = (x^2/4) / (1 + x/2 + sqrt(1 + x)) <= 0.25 x^2 sqrt(1 + x) (the denominator is >= 1.74,
/// sqrt(1 + x) >= 0.86), so with D2' = D1 + dv isb / (2 s1) (eps >= 0 only shrinks the
/// relative error) D2' = D2 (1 + r), 0 <= r <= xm^2 / 4. With rho = xm^2 / 4 (1 + 2^-20)
/// + 2^-46: N = A +- B is linear in D2 with slope a1 +- e1 t, so the full loop's |N|
/// exceeds |A'| + |B'| by at most (|a1| + e1 t) r D2 plus roundings (both loops', and this
/// one's other order of operations: tens of ulps of (|a1| + |a2| + 2 e1 t) (D1 + D2'), and
/// of s1^2 against w). The margin rho (|a1| + |a2| + 2 e1 t) (D1 + D2') covers both, and
/// is at most rho (|a1| + |a2| + 2 e1 t) 2.25 D1 (|D2' - D1| <= D1 xm / 2); and
/// P >= P' (1 - rho). So |A'| + |B'| + margin <= thr (1 - rho) P' at every point implies
/// that the full loop has no |N| > thr P. B' = e1 t (D2' - D1) = (e1 scale dv isb / (2 scale))
/// mult[k] / root[k]. |A'| + |B'| = max(|A' + B'|, |A' - B'|) serves +t and -t alike, so
/// the screen covers a range of k that holds every point inside the domain (a point
/// outside only makes it more cautious).
struct LinearScreen {
    double sisb, hisb, eps, a1, a2, kb, c0, c1, lthr;  // kb: |B'| / mult_inv_root[k]; c0 + c1 mult[k]: margin / D1
    const double *root, *inv_root, *mult, *mir;
    LinearScreen(const GridState& g, double scale, double thr, double xm, const GridPoints& grid) {
        const double rho = xm * xm * 0.25 * (1 + 0x1p-20) + 0x1p-46;
        sisb = scale * g.isb;
        hisb = (g.c2 - g.c1) / (2 * scale) * g.isb;
        eps = g.eps, a1 = g.a1, a2 = g.a2;
        kb = std::fabs(g.e1 * scale * hisb);
        c0 = 2.25 * rho * (std::fabs(a1) + std::fabs(a2));
        c1 = 2.25 * rho * 2 * g.e1 * scale;
        lthr = thr * (1 - rho);
        root = grid.root.data(), inv_root = grid.inv_root.data(), mult = grid.mult.data(), mir = grid.mult_inv_root.data();
    }
    /// points k0 .. k0 + kLanes - 1: over[j] = 1 where |A'| + |B'| + margin > lthr P'
    __attribute__((always_inline)) void points(int k0, double* over) const {
        for (int j = 0; j < kLanes; ++j) {
            const int k = k0 + j;
            const double d1 = sisb * root[k] + eps, d2 = d1 + hisb * inv_root[k];
            const double a = a1 * d2 - a2 * d1;
            const double m = std::fabs(a) + kb * mir[k] + (c0 + c1 * mult[k]) * d1;
            over[j] = m > lthr * (d1 * d2) ? 1.0 : over[j];
        }
    }
};

/// Runs LinearScreen on grid points [kb, ke) (ke - kb >= kLanes): whole vectors, the last
/// one overlapping the one before (a point seen twice changes no "any point over").
/// r.over: 1 if some point may be over thr (the caller counts the points).
__attribute__((always_inline)) inline void screen_linear(const GridState& g, double scale, double thr, double xm, int kb, int ke,
                                                         const GridPoints& grid, GridResult& r) {
    const LinearScreen L(g, scale, thr, xm, grid);
    double over[kLanes];
    for (int j = 0; j < kLanes; ++j) over[j] = 0;
    int k0 = kb;
    for (; k0 + kLanes <= ke; k0 += kLanes) L.points(k0, over);
    if (k0 < ke) L.points(ke - kLanes, over);
    for (int j = 0; j < kLanes; ++j) r.over += over[j] > 0;
}

/// log2(x) for a positive normal double, from its bits alone (exponent plus mantissa as
/// the fraction): below the true value by at most 0.0861 (log2(1 + f) - f on [0, 1)).
__attribute__((always_inline)) inline double log2_bits(double x) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return double(int((bits >> 52) & 0x7ff) - 1023) + double(bits & ((uint64_t(1) << 52) - 1)) * 0x1p-52;
}

/// How many grid points t_k = scale mult[k] (k < grid.size) are below x (kStrict) or at
/// most x: a prefix, since mult increases (and rounding keeps the order) and scale > 0. The
/// whole grid and none are one compare each (the common cases); otherwise the grid's
/// geometry (mult[k] = 10^(-3 + 7k / (size - 1))) places x within a window of 5 points, and
/// the count is the window's start plus its flags: the same comparisons of the same doubles
/// as the loops' domain tests, so the counts agree exactly. lg2_scale is log2_bits(scale).
/// (Measured on verify --original: a flag count over the whole grid, stepping one point at
/// a time from the guess (it mispredicts) and a bisection (9 dependent steps) are slower;
/// so is a guess that divides x by scale instead of taking the difference of the two
/// logarithms: docs/benchmarks.md, "Measurements behind the code's choices".)
/// Any other scale (0, inf, NaN) counts the flags.
template <bool kStrict>
__attribute__((always_inline)) inline int count_below(const GridPoints& grid, double scale, double lg2_scale, double x) {
    const double* mult = grid.mult.data();
    auto below = [&](int k) {
        const double t = scale * mult[k];
        return kStrict ? t < x : t <= x;
    };
    const int size = grid.size;
    if (below(size - 1)) return size;  // the whole grid
    auto count_all = [&]() {
        int n = 0;
        for (int k = 0; k < size; ++k) n += int(below(k));
        return n;
    };
    constexpr int kWindow = 5;
    if (!(scale > 0 && scale < INFINITY) || size < kWindow + 2) return count_all();
    if (!below(0)) return 0;  // none (NaN x too)
    // 0 < count < size, so x / scale lies about between mult[0] and mult[size - 1], and x
    // and scale are positive doubles (scale >= 1e-15 in verify, so x is normal). x's
    // position q on the grid, from the two logarithms' difference (each within 0.09
    // octave: together 0.052 decade, 0.94 steps of the 257-point grid), is within a step of
    // the count's, so the count is a + the flags of the window [a, a + kWindow) around q, as
    // long as the flags just outside the window say so (else, never seen: the whole count).
    // Both flags lie inside the grid: no branch on the window's bounds, a loop of known length.
    double q = ((log2_bits(x) - lg2_scale) * 0.30102999566398120 + 3) * double(size - 1) / 7;
    q = q > 0 ? q : 0;  // (NaN to 0)
    q = q < size ? q : size;
    int a = int(q) - 2;
    a = a < 1 ? 1 : a > size - kWindow - 1 ? size - kWindow - 1 : a;
    if (!below(a - 1) || below(a + kWindow)) return count_all();
    int n = a;
    for (int j = 0; j < kWindow; ++j) n += int(below(a + j));
    return n;
}

/// Grid points inside [lo, hi], both signs (symmetric: lo = -hi <= 0), by count_below; kb,
/// ke: a range of k holding every k whose +t or -t lies inside.
__attribute__((always_inline)) inline uint64_t points_inside(const GridPoints& grid, double scale, double lo, double hi,
                                                            bool symmetric, int& kb, int& ke) {
    const double ls = log2_bits(scale);
    if (symmetric) {  // t > 0 >= lo: inside for both signs exactly when t <= hi
        kb = 0;
        ke = count_below<false>(grid, scale, ls, hi);
        return 2 * uint64_t(ke);
    }
    // +t inside for k in [p0, p1), -t (-hi <= t <= -lo) for k in [q0, q1)
    const int p0 = count_below<true>(grid, scale, ls, lo), p1 = count_below<false>(grid, scale, ls, hi);
    const int q0 = count_below<true>(grid, scale, ls, -hi), q1 = count_below<false>(grid, scale, ls, -lo);
    const int np = std::max(0, p1 - p0), nq = std::max(0, q1 - q0);
    kb = np == 0 ? q0 : nq == 0 ? p0 : std::min(p0, q0);
    ke = np == 0 ? q1 : nq == 0 ? p1 : std::max(p1, q1);
    return uint64_t(np) + uint64_t(nq);
}

/// closed_form_below's test of a closed_form_value against thr, lowered by 2^-40 (grid.h).
inline bool closed_settles(double closed, double thr) { return closed <= thr * (1 - 0x1p-40); }  // false for NaN

/// closed_form_value's per-coordinate part (the tensor's FP32 gate checked by the caller):
/// selects only, so closed_form_values' loop vectorises.
__attribute__((always_inline)) inline double closed_value_coord(const codec::GuardConst& c, bool ams, double m, double v,
                                                                double vmax, double mt, double vt, double vmaxt) {
    codec::GuardInput in;
    in.amsgrad = ams;
    in.m = {mt, std::min(m, mt), std::max(m, mt)};  // (a NaN original stays in its cell: no bound)
    in.v = {vt, std::min(v, vt), std::max(v, vt)};
    if (ams) in.vmax = {vmaxt, std::min(vmax, vmaxt), std::max(vmax, vmaxt)};
    const codec::ClosedStage k = codec::certify_closed_h<false>(c, in);  // the first update's (the grid's)
    // equal states carry no FP32 margin: nothing to settle there
    // (flags as doubles and one select: codec/hd.h flag_hd)
    const double usable = codec::flag_hd((k.dm != 0) | (k.dv != 0)) * (1 - k.gate_failed) * codec::flag_hd(k.closed == k.closed);
    return usable != 0 ? k.closed : INFINITY;
}

template <bool kAms>
__attribute__((always_inline)) inline void closed_values_loop(const codec::GuardConst& c, const float* m, const float* v,
                                                              const float* vmax, const float* mt, const float* vt,
                                                              const float* vmaxt, std::size_t n, double* out) {
    // a local copy: a field of gc read only under a condition is a load that may trap for
    // the if-converter, which then leaves the loop scalar (codec/block.h closed_stage_block)
    const codec::GuardConst cc = c;
    for (std::size_t i = 0; i < n; ++i)
        out[i] = closed_value_coord(cc, kAms, m[i], v[i], kAms ? vmax[i] : 0.0, mt[i], vt[i], kAms ? vmaxt[i] : 0.0);
}

}  // namespace

// grid.h says why the closed form bounds the loops' values
double closed_form_value(const codec::GuardConst& c, bool ams, double m, double v, double vmax, double mt, double vt,
                         double vmaxt) {
    return codec::fp32_gate_tensor(c) ? closed_value_coord(c, ams, m, v, vmax, mt, vt, vmaxt) : INFINITY;
}

bool closed_form_below(const codec::GuardConst& c, bool ams, double m, double v, double vmax, double mt, double vt,
                       double vmaxt, double thr) {
    return closed_settles(closed_form_value(c, ams, m, v, vmax, mt, vt, vmaxt), thr);
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void closed_form_values(const codec::GuardConst& c, bool ams, const float* m, const float* v, const float* vmax,
                        const float* mt, const float* vt, const float* vmaxt, std::size_t n, double* out) {
    if (!codec::fp32_gate_tensor(c)) {
        std::fill(out, out + n, INFINITY);
        return;
    }
    ams ? closed_values_loop<true>(c, m, v, vmax, mt, vt, vmaxt, n, out)
        : closed_values_loop<false>(c, m, v, vmax, mt, vt, vmaxt, n, out);
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
GridResult grid_check(const codec::GuardConst& c, bool ams, double m, double v, double vmax, double mt, double vt,
                      double vmaxt, double lo, double hi, double scale, double bound, const GridPoints& grid,
                      bool fast_paths, double only_above, double closed) {
    const GridState g{c.b1 * m, c.b1 * mt, c.b2 * v, c.b2 * vt, 1 - c.b1, 1 - c.b2,
                      ams ? vmax : -INFINITY, ams ? vmaxt : -INFINITY, ams ? std::sqrt(vmax) : -INFINITY,
                      1 / c.sqrt_bc2, c.inv_bc1, c.eps};
    // the original's square root factors out of the grid when scale = sqrt(v) (v >= 1e-30)
    const bool factored = v >= 1e-30 && v < INFINITY && scale == std::sqrt(v) && grid.b2 == c.b2;
    // The fast path's magnitude bounds, from the inputs alone (no square root): every grid
    // D = sqrt(max(w, x)) isb + eps with w = c + e2 t^2 between its values at the first and
    // last point. D <= sqrt(2^300) 2^40 + 2^100 < 2^200; D >= eps >= 2^-200, or
    // D >= sqrt(w(t0)) >= 2^-150 (isb >= 1); w >= 0 on the whole grid (c >= 0, e2 >= 0).
    const double t0 = scale * grid.mult[0], tn = scale * grid.mult[std::size_t(grid.size - 1)];
    const double big = 0x1p200;
    const double w_hi = std::max(g.c1, g.c2) + g.e2 * tn * tn;
    // (x1 and x2 each: std::max would drop a NaN decoded max_exp_avg_sq, which only the exact loop counts)
    const bool d_ok = g.c1 >= 0 && g.c2 >= 0 && g.e2 >= 0 && w_hi <= 0x1p300 && g.x1 <= 0x1p300 && g.x2 <= 0x1p300 && g.isb >= 1 &&
                      g.isb <= 0x1p40 && g.eps >= 0 && g.eps <= 0x1p100 &&
                      (g.eps >= 0x1p-200 || std::min(g.c1, g.c2) + g.e2 * t0 * t0 >= 0x1p-300);
    const bool fast = fast_paths && d_ok && std::fabs(g.a1) <= big && std::fabs(g.a2) <= big && std::fabs(g.e1 * tn) <= big &&
                      g.inv_bc1 >= 1 && g.inv_bc1 <= big && bound >= 0 && bound <= big;  // false for NaN too
    GridResult r;
    bool settled = false;  // the closed form held: no point, the ends' included, can matter
    if (fast) {
        // (no lambda here: it would be compiled outside this function's target ISA)
        // The screen first, when a max is known: no point over thr = min(bound, only_above)
        // (in |N| / P units, lowered by 2^-40 so that rounding cannot hide a point whose
        // full-loop value exceeds only_above) leaves nothing to count or to report. Else,
        // or when some point is over, the full loop.
        bool full = true;
        if (only_above >= 0) {
            const double thr = std::min(bound / g.inv_bc1, only_above / g.inv_bc1 * (1 - 0x1p-40));
            const bool symmetric = lo == -hi && hi >= 0;
            int kb = 0, ke = 0;
            if (closed != closed) closed = closed_form_value(c, ams, m, v, vmax, mt, vt, vmaxt);
            if (closed_settles(closed, std::min(bound, only_above))) {  // closed_form_below
                // nothing on the grid can be over the bound or above the known max: count the points
                r.points = points_inside(grid, scale, lo, hi, symmetric, kb, ke);
                settled = true;
            } else {
                // the linearised screen where it holds (screen_linear), over the range of k
                // whose +t or -t lies inside [lo, hi]; else the screen loops
                const double xm = std::fabs(g.c2 - g.c1) / g.c1;  // NaN or inf when c1 = 0
                const bool linear = factored && !ams && xm <= 0.25 && grid.size >= kLanes;  // false for NaN
                if (linear) {
                    r.points = points_inside(grid, scale, lo, hi, symmetric, kb, ke);
                    if (r.points > 0) {
                        if (ke - kb < kLanes) kb = std::max(0, ke - kLanes), ke = kb + kLanes;  // grid.size >= kLanes
                        screen_linear(g, scale, thr, xm, kb, ke, grid, r);
                    }
                } else if (symmetric)
                    factored ? grid_loop_fast<true, true, true>(g, lo, hi, scale, bound, thr, grid, r)
                             : grid_loop_fast<false, true, true>(g, lo, hi, scale, bound, thr, grid, r);
                else
                    factored ? grid_loop_fast<true, false, true>(g, lo, hi, scale, bound, thr, grid, r)
                             : grid_loop_fast<false, false, true>(g, lo, hi, scale, bound, thr, grid, r);
            }
            full = r.over > 0;
        }
        if (full) {
            r = GridResult{};
            factored ? grid_loop_fast<true, false, false>(g, lo, hi, scale, bound, 0, grid, r)
                     : grid_loop_fast<false, false, false>(g, lo, hi, scale, bound, 0, grid, r);
        }
    } else {
        factored ? grid_loop_exact<true>(g, lo, hi, scale, bound, grid, r)
                 : grid_loop_exact<false>(g, lo, hi, scale, bound, grid, r);
    }
    // the domain's ends and 0, where inside and finite; hi = -lo reuses lo's denominators
    // (D depends on x * x, the same double for -x). Where the closed form held, it bounds
    // them as it bounds the grid (at most thr: not over, no new max): only counted.
    const double ends[3] = {0.0, lo, hi};
    double lo_d1 = 0, lo_d2 = 0;
    for (int i = 0; i < 3; ++i) {
        const double x = ends[i];
        if (!(x >= lo && x <= hi) || !std::isfinite(x)) continue;
        if (settled) {
            ++r.points;
            continue;
        }
        const bool mirror = i == 2 && x == -lo;  // then lo was inside and finite: lo_d* are set
        const double d1 = mirror ? lo_d1 : g.denom(1, x), d2 = mirror ? lo_d2 : g.denom(2, x);
        if (i == 1) lo_d1 = d1, lo_d2 = d2;
        const double u1 = c.inv_bc1 * (g.a1 + g.e1 * x) / d1;
        const double u2 = c.inv_bc1 * (g.a2 + g.e1 * x) / d2;
        const double dd = (u1 != u1 && u2 != u2) ? 0.0 : std::fabs(u1 - u2);
        r.max_diff = dd > r.max_diff ? dd : r.max_diff;
        r.over += !(dd <= bound);
        ++r.points;
    }
    return r;
}

SeqPoints::SeqPoints(const codec::AdamHyper& h) : b1(h.beta1), b2(h.beta2), eps(h.eps), ams(h.amsgrad) {
    double n = h.step;
    for (int t = 1; t <= kSeqSteps; ++t) {
        n = codec::round_step(n + 1, h.step_bits);
        inv_bc1.push_back(1 / (1 - std::pow(b1, n)));
        inv_sqrt_bc2.push_back(1 / std::sqrt(1 - std::pow(b2, n)));
    }
    for (int P : {1, 3, 10, 30})
        for (double c : {1.0, 3.0, 10.0, 30.0}) {
            std::vector<double> ramp(kSeqSteps, 0.0), spike(kSeqSteps, 0.0);
            for (int s = 1; s <= P; ++s) ramp[std::size_t(s - 1)] = c * std::pow(b2, 0.5 * P) * std::pow(b1 / b2, P - s);
            spike[std::size_t(P - 1)] = c * std::pow(b2, 0.5 * P);
            seqs.push_back(ramp);
            seqs.push_back(spike);
        }
    for (double c : {0.3, 1.0, 3.0}) {
        std::vector<double> pos(kSeqSteps, c), neg(kSeqSteps, -c), alt(kSeqSteps);
        for (int s = 0; s < kSeqSteps; ++s) alt[std::size_t(s)] = s % 2 ? -c : c;
        seqs.push_back(pos);
        seqs.push_back(neg);
        seqs.push_back(alt);
    }
}

GridResult sequence_check(const SeqPoints& sp, double m, double v, double vmax, double mt, double vt, double vmaxt,
                          double bound) {
    GridResult r;
    const double scale = std::sqrt(std::max(v, 0.0)) * (m < 0 ? -1.0 : 1.0);
    for (const auto& seq : sp.seqs) {
        double a = m, b = v, x = vmax, at = mt, bt = vt, xt = vmaxt, worst = 0;
        for (int t = 0; t < kSeqSteps; ++t) {
            const double g = seq[std::size_t(t)] * scale;
            a = sp.b1 * a + (1 - sp.b1) * g;
            at = sp.b1 * at + (1 - sp.b1) * g;
            b = sp.b2 * b + (1 - sp.b2) * g * g;
            bt = sp.b2 * bt + (1 - sp.b2) * g * g;
            x = std::max(x, b);
            xt = std::max(xt, bt);
            const double s2 = sp.inv_sqrt_bc2[std::size_t(t)];
            const double f = a / (std::sqrt(sp.ams ? x : b) * s2 + sp.eps), ft = at / (std::sqrt(sp.ams ? xt : bt) * s2 + sp.eps);
            const double d = std::fabs(f - ft) * sp.inv_bc1[std::size_t(t)];
            if (std::isnan(f) && std::isnan(ft)) continue;
            if (!(d <= worst)) worst = d;  // NaN in one: over
        }
        ++r.points;
        if (!(worst <= bound)) ++r.over;
        if (worst > r.max_diff) r.max_diff = worst;
    }
    return r;
}

}  // namespace ckpt
