// The dense gradient grid of ckpt-verify --original: the true |u(g) - u~(g)| of one
// coordinate at hundreds of gradients, checked against its certificate. Independent of the
// certificate's analysis (codec/guard.h): it only evaluates the update formula.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "codec/guard.h"

namespace ckpt {

/// The dense grid of one tensor: multipliers 10^k for k in [-3, 4], per_side points
/// (computed once per run: the grid of every coordinate is scale * these, so no pow in the
/// per-coordinate loop), and root[k] = sqrt(b2 + (1 - b2) mult[k]^2) for the tensor's b2,
/// so that the original state's sqrt(b2 v + (1 - b2) t^2) at t = sqrt(v) mult[k] is
/// sqrt(v) root[k] (the same value up to rounding, with no square root per point), and
/// inv_root[k] = 1 / root[k], mult_inv_root[k] = mult[k] / root[k] (the linearised
/// screen's, grid.cpp). The arrays are padded to a multiple of kLanes with NaN, which lies
/// outside every domain, so the loop masks it out (`size` is the real count).
constexpr int kLanes = 8;

struct GridPoints {
    std::vector<double> mult, root, inv_root, mult_inv_root;
    int size = 0;     ///< real points per side (mult.size() is that rounded up to kLanes)
    double b2 = -1;   ///< the b2 root was computed for
    explicit GridPoints(int points) {
        size = std::max(1, (points - 3) / 2);
        const std::size_t padded = std::size_t((size + kLanes - 1) / kLanes * kLanes);
        mult.resize(padded);
        for (std::size_t i = 0; i < padded; ++i)
            mult[i] = int(i) < size ? std::pow(10.0, -3.0 + 7.0 * double(i) / std::max(1, size - 1)) : NAN;
        root.resize(padded);
        inv_root.resize(padded);
        mult_inv_root.resize(padded);
    }
    void set_b2(double b2_) {
        if (b2_ == b2) return;
        b2 = b2_;
        for (std::size_t k = 0; k < mult.size(); ++k) {
            root[k] = std::sqrt(b2 + (1 - b2) * mult[k] * mult[k]);
            inv_root[k] = 1 / root[k];
            mult_inv_root[k] = mult[k] * inv_root[k];
        }
    }
};

/// grid_check's answer: the largest difference (units of lr), points inside the domain,
/// and points whose difference exceeds the bound.
struct GridResult { double max_diff = 0; uint64_t points = 0, over = 0; };

/// One coordinate's dense-grid check: the largest |u(g) - u~(g)| / lr (double arithmetic,
/// codec::update_lr's formula, 1/sqrt(bc2) as a product) over the grid points inside the
/// domain [lo, hi]: 0, lo, hi (when finite) and +-scale * mult[k]; and how many points
/// exceed `bound`. A point outside the domain is masked (difference 0, not counted). Both
/// updates NaN (torch gives NaN for both) is no difference; one NaN counts as over `bound`.
///
/// The fast path (grid_loop_fast) needs no division per point. With D1, D2 the two states'
/// denominators at gradient t, u - u~ = inv_bc1 N / P with N = (a1 + e1 t) D2 - (a2 + e1 t) D1
/// = A + B (A = a1 D2 - a2 D1, B = e1 t (D2 - D1)) and P = D1 D2 > 0; -t has N = A - B and
/// shares D1, D2 (v' = b2 v + (1-b2) t^2). A point is over when
/// |N| > (bound / inv_bc1) P; each of kLanes lanes keeps the point of its largest |N| / P by
/// comparing cross products (|N| P_best > N_best P), and the lanes' winners are divided
/// once at the end. In the screen on a symmetric domain [-h, h] a point pair costs
/// |A| + |B| (= max(|A + B|, |A - B|)). The cross products and the folded constant round differently from
/// dividing at every point: the max and the threshold agree with it to a few ulps, far
/// below any tolerance. It runs only where every magnitude is bounded (inputs finite,
/// |a|, |e1 t| <= 2^200, every D in [2^-200, 2^200]: no overflow, no NaN, products far from
/// underflow for any difference that matters); otherwise grid_loop_exact divides at every
/// point. The original's square root is sqrt(v) * GridPoints::root[k] (no square root per
/// point) when scale = sqrt(v) >= 1e-15. Both loops are branch-free, so the compiler
/// vectorises them; target_clones picks AVX-512 or AVX2 at run time, and -ffp-contract=off
/// (lib/ckpt/CMakeLists.txt) keeps the same IEEE operations in the same order on every ISA.
///
/// The screen (only_above >= 0, the largest difference the caller already knows): only the
/// max of the whole run is reported, so a coordinate matters for it only where it exceeds
/// that. The screen loop tests |N| > thr P at every point with thr = min(bound, only_above)
/// in N / P units (only_above lowered by 2^-40, more than the rounding of the full loop's
/// division) and keeps no per-lane best: about a third fewer operations per point. Where no
/// point is over thr, the counts are exact (no point over the bound) and max_diff is only the
/// domain ends' (<= only_above unless an end exceeds it, when it is the exact max); else the
/// full loop runs. So points and over are always exact, and max_diff is exact whenever it
/// exceeds only_above (test_grid checks both). Where the original's root factors out and
/// the two exp_avg_sq differ by at most a quarter (no amsgrad), the screen takes no square
/// root either: the decoded root is linearised around the original's, with a proven
/// margin (grid.cpp, LinearScreen), since the square root bounded the screen's speed.
///
/// Before the screen, closed_form_below: where it holds for min(bound, only_above), no grid
/// point (nor the domain's ends) can matter, and only the points are counted. `closed`:
/// the coordinate's closed_form_value when the caller has it (closed_form_values, a
/// vectorised pass over a chunk), NaN to compute it here.
///
/// (m, v, vmax) is the original state, (mt, vt, vmaxt) the decoded one (vmax* read only when
/// `ams`); the grid is +-scale * grid.mult[k] (scale = sqrt(v) in verify); `fast_paths` false
/// forces the exact loop everywhere (test/ckpt/test_grid.cpp compares the two).
GridResult grid_check(const codec::GuardConst& c, bool ams, double m, double v, double vmax, double mt, double vt,
                      double vmaxt, double lo, double hi, double scale, double bound, const GridPoints& grid,
                      bool fast_paths = true, double only_above = -1, double closed = NAN);

/// Whether the guard's closed form (codec/guard.h certify_closed) bounds every grid point's
/// |u - u~| / lr, as the fast loops compute it, by thr (arguments as grid_check's). Its
/// cells [original, decoded] hold the original state, so the exact sup over every gradient
/// is below its closed bound. That bound carries the FP32 margin (fp32_rel, 64 float ulps
/// of update_bound, which bounds both updates), far above the loops' double rounding (tens
/// of double ulps of the same magnitudes); so the two states must differ (else the margin
/// is 0), and thr is lowered by 2^-40 as the screen's. Two square roots and a few divisions
/// per coordinate, where the screen evaluates every grid point.
bool closed_form_below(const codec::GuardConst& c, bool ams, double m, double v, double vmax, double mt, double vt,
                       double vmaxt, double thr);

/// The closed bound closed_form_below compares with thr (1 - 2^-40): certify_closed's
/// `closed` on the cells [original, decoded], or +inf where it settles nothing (the
/// tensor's FP32 gate or the coordinate's gate fails, the states are equal, NaN).
double closed_form_value(const codec::GuardConst& c, bool ams, double m, double v, double vmax, double mt, double vt,
                         double vmaxt);

/// closed_form_value of coordinates [0, n) of one tensor, into out[0, n): the same
/// doubles (the same IEEE operations in the same order, vectorised; target_clones picks
/// the ISA). Original state m, v, vmax; decoded mt, vt, vmaxt (vmax, vmaxt read only when
/// `ams`).
void closed_form_values(const codec::GuardConst& c, bool ams, const float* m, const float* v, const float* vmax,
                        const float* mt, const float* vt, const float* vmaxt, std::size_t n, double* out);

/// The gradient sequences of ckpt-verify --original for horizon "all" (docs/design.md §1,
/// "Every later update"): kSeqSteps updates after restore, per step t the bias corrections
/// as torch computes them (step counted in the step tensor's dtype, codec::round_step).
/// Built once per tensor; the sequences of a coordinate scale with sqrt of its original
/// exp_avg_sq. Families: ramps aligned with exp_avg, c sqrt(v b2^P) (b1/b2)^(P-s), peaking
/// at P in {1, 3, 10, 30} for c in {1, 3, 10, 30} (the bound's worst case: the
/// gradients' part of v_t near half the decayed state while exp_avg grows), a spike of
/// c sqrt(v b2^P) after P - 1 zeros, constant +-c sqrt(v), alternating signs.
constexpr int kSeqSteps = 48;
struct SeqPoints {
    double b1 = 0, b2 = 0, eps = 0;
    bool ams = false;
    std::vector<double> inv_bc1, inv_sqrt_bc2;  ///< per step t = 1..kSeqSteps
    std::vector<std::vector<double>> seqs;      ///< gradient sequences in units of sqrt(v)
    explicit SeqPoints(const codec::AdamHyper& h);
};

/// One coordinate's sequence check: the largest max_t |f_t - f~_t| (lr units, double
/// arithmetic of torch's recursion) over SeqPoints' sequences, scaled by sqrt(v) of the
/// original and signed by its exp_avg, and how many sequences exceed `bound`. Original
/// state (m, v, vmax), decoded (mt, vt, vmaxt); both NaN at a step is no difference.
GridResult sequence_check(const SeqPoints& sp, double m, double v, double vmax, double mt, double vt, double vmaxt,
                          double bound);

}  // namespace ckpt
