// ckpt/grid.h: the dense-grid check's fast loops (no division per point; the symmetric
// domain's |A| + |B|) against its exact loop (two divisions per point), over seeded random
// states of many magnitudes, symmetric and shifted domains, amsgrad, and grids with and
// without padding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ckpt/grid.h"

using namespace ckpt;

namespace {

struct Case {
    double m, v, vmax, mt, vt, vmaxt, lo, hi;
    bool ams;
};

Case random_case(std::mt19937_64& rng) {
    std::uniform_real_distribution<double> u(0, 1);
    Case c{};
    c.v = u(rng) < 0.05 ? 0.0 : std::pow(10.0, -16 + 14 * u(rng));
    const double s = std::sqrt(std::max(c.v, 1e-30));
    c.m = s * (u(rng) < 0.1 ? 0.0 : 6 * u(rng) - 3);
    const double rel = std::pow(10.0, -4 + 3 * u(rng));   // decoded error, relative to the scale
    c.mt = c.m + s * rel * (2 * u(rng) - 1);
    c.vt = c.v * (1 + rel * (2 * u(rng) - 1));
    if (u(rng) < 0.05) c.mt = c.m, c.vt = c.v;            // decoded exactly
    c.ams = u(rng) < 0.25;
    c.vmax = c.v * (1 + (u(rng) < 0.5 ? 0.0 : 3 * u(rng)));
    c.vmaxt = c.vmax * (1 + rel * (2 * u(rng) - 1));
    const double pick = u(rng);
    if (pick < 0.4) c.lo = -1, c.hi = 1;                  // G = 1
    else if (pick < 0.6) c.lo = -INFINITY, c.hi = INFINITY;
    else if (pick < 0.9) { const double shift = s * (20 * u(rng) - 10); c.lo = -1 + shift, c.hi = 1 + shift; }  // L2
    else c.lo = -s * 3 * u(rng), c.hi = s * 50 * u(rng);  // asymmetric, inside the grid's range
    return c;
}

}  // namespace

TEST_CASE("grid_check: the fast loops agree with the exact loop (points, over counts, max to 1e-9)") {
    std::mt19937_64 rng(20261201);
    const codec::AdamHyper hypers[] = {
        {1e-3, 0.9, 0.999, 1e-8, 0, false, false, 10},
        {6e-4, 0.9, 0.95, 1e-8, 0, false, false, 300},
        {1e-2, 0.5, 0.9, 0.0, 0, false, false, 0},
    };
    long cases = 0, bitwise_different = 0, with_over = 0;
    for (int points : {257, 11, 19}) {
        GridPoints grid(points);
        REQUIRE(grid.size == std::max(1, (points - 3) / 2));
        REQUIRE(grid.mult.size() % kLanes == 0);
        for (const auto& h : hypers) {
            const codec::GuardConst gc = codec::make_guard_const(h, 0.01);
            grid.set_b2(gc.b2);
            for (int i = 0; i < 4000; ++i) {
                const Case c = random_case(rng);
                const double scale = std::sqrt(std::max(c.v, 1e-30));
                const GridResult ref = grid_check(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, c.lo, c.hi, scale,
                                                  INFINITY, grid, false);
                for (double f : {0.5, 1.5}) {
                    const double bound = ref.max_diff * f;
                    const GridResult e = grid_check(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, c.lo, c.hi, scale,
                                                    bound, grid, false);
                    const GridResult q = grid_check(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, c.lo, c.hi, scale,
                                                    bound, grid, true);
                    ++cases;
                    INFO("grid ", points, " b1 ", h.beta1, " b2 ", h.beta2, " eps ", h.eps, " ams ", c.ams, " m ", c.m, " v ", c.v,
                         " vmax ", c.vmax, " mt ", c.mt, " vt ", c.vt, " vmaxt ", c.vmaxt, " lo ", c.lo, " hi ", c.hi,
                         " bound ", bound);
                    CHECK(q.points == e.points);
                    // below ~1e-12 lr the differences are rounding noise of the two formulas
                    // (a state decoded exactly), and so is which point lies over such a bound
                    if (ref.max_diff > 1e-12) CHECK(q.over == e.over);
                    CHECK((q.max_diff == e.max_diff || std::fabs(q.max_diff - e.max_diff) <= 1e-9 * e.max_diff + 1e-15));
                    bitwise_different += q.max_diff != e.max_diff;
                    with_over += ref.max_diff > 1e-12 && e.over > 0;
                    if (f > 1 && h.eps > 0) CHECK(e.over == 0);  // eps 0, v 0: inf - inf at g = 0 is over
                }
            }
        }
    }
    // the fast loops ran: they round differently from the exact loop somewhere, and the
    // over counts were compared where points exceed the bound
    CHECK(bitwise_different > 0);
    CHECK(with_over > cases / 4);
}

TEST_CASE("grid_check: the screen (only_above) changes no count, and no max above what is already known") {
    // verify passes its running max: a coordinate whose grid stays at or below it (and below
    // its bound) is only screened; counts must be exact and any larger max exactly the full loop's
    std::mt19937_64 rng(20261202);
    const codec::AdamHyper h{6e-4, 0.9, 0.95, 1e-8, 0, false, false, 300};
    const codec::GuardConst gc = codec::make_guard_const(h, 0.01);
    long screened = 0, rerun = 0;
    std::uniform_real_distribution<double> u(0, 1);
    // 257 points (127 a side), 19 (8: one vector) and 27 (12: the last vector overlaps)
    for (int i = 0; i < 3000; ++i) {
        GridPoints grid(i % 5 == 3 ? 19 : i % 5 == 4 ? 27 : 257);
        grid.set_b2(gc.b2);
        Case c = random_case(rng);
        // a third with exp_avg_sq decoded up to 30% off: the linearised screen's edge (1/4)
        if (i % 3 == 0) c.vt = c.v * (1 + 0.3 * (2 * u(rng) - 1));
        const double scale = std::sqrt(std::max(c.v, 1e-30));
        const GridResult full0 = grid_check(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, c.lo, c.hi, scale, INFINITY, grid);
        for (double fb : {0.7, 2.0}) {
            const double bound = full0.max_diff * fb;
            const GridResult full = grid_check(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, c.lo, c.hi, scale, bound, grid);
            const double mx = full.max_diff;
            for (double known : {0.0, mx * 0.5, mx * (1 - 1e-15), mx, std::nextafter(mx, INFINITY), mx * 2}) {
                const GridResult q = grid_check(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, c.lo, c.hi, scale, bound, grid,
                                                true, known);
                INFO("case ", i, " bound ", bound, " known ", known, " max ", mx);
                CHECK(q.points == full.points);
                CHECK(q.over == full.over);
                if (mx > known) {
                    CHECK(q.max_diff == mx);
                    ++rerun;
                } else {
                    CHECK(q.max_diff <= known);
                    screened += q.max_diff != mx;
                }
            }
        }
    }
    CHECK(screened > 1000);  // the screen did skip the full loop
    CHECK(rerun > 1000);
}

TEST_CASE("grid_check: non-finite states take the exact loop (one NaN update is over, both NaN are not)") {
    const codec::GuardConst gc = codec::make_guard_const(codec::AdamHyper{}, 0.01);
    GridPoints grid(257);
    grid.set_b2(gc.b2);
    const double v = 1e-6, s = std::sqrt(v);
    const GridResult one = grid_check(gc, false, 1e-3, v, 0, NAN, v, 0, -1, 1, s, 1.0, grid);
    CHECK(one.over == one.points);
    CHECK(one.points > 0);
    const GridResult both = grid_check(gc, false, NAN, v, 0, NAN, v, 0, -1, 1, s, 1.0, grid);
    CHECK(both.over == 0);
    CHECK(both.max_diff == 0);
    // amsgrad with a NaN decoded max_exp_avg_sq: every decoded update is NaN, the original's
    // not: every point is over, in the fast paths' gate as in the exact loop
    for (double known : {-1.0, 1.0}) {
        const GridResult vx = grid_check(gc, true, 1e-3, v, v, 1e-3, v, NAN, -1, 1, s, 1.0, grid, true, known);
        CHECK(vx.points > 0);
        CHECK(vx.over == vx.points);
    }
}

TEST_CASE("closed_form_below: where it holds for thr, the full loop has no point above thr; it holds for most states") {
    // grid_check skips the screen where closed_form_below(min(bound, known max)): sound only if
    // no grid value, as the full loop computes it, can be above that
    std::mt19937_64 rng(20261203);
    const codec::AdamHyper h{6e-4, 0.9, 0.95, 1e-8, 0, false, false, 300};
    const codec::GuardConst gc = codec::make_guard_const(h, 0.01);
    GridPoints grid(257);
    grid.set_b2(gc.b2);
    long held = 0, differ = 0;
    for (int i = 0; i < 4000; ++i) {
        const Case c = random_case(rng);
        const double scale = std::sqrt(std::max(c.v, 1e-30));
        const GridResult full = grid_check(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, c.lo, c.hi, scale, INFINITY, grid);
        const bool same = c.m == c.mt && c.v == c.vt && (!c.ams || c.vmax == c.vmaxt);
        differ += !same;
        if (same) CHECK_FALSE(closed_form_below(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, 1.0));  // no margin
        for (double f : {1.0, 1.5, 3.0, 10.0}) {  // thr at and above the grid's max
            const double thr = full.max_diff * f;
            if (!closed_form_below(gc, c.ams, c.m, c.v, c.vmax, c.mt, c.vt, c.vmaxt, thr)) continue;
            INFO("case ", i, " thr ", thr, " max ", full.max_diff);
            CHECK(full.max_diff <= thr * (1 - 0x1p-40));
            held += f == 3.0;
        }
    }
    CHECK(held > differ / 2);  // at 3x the grid's max the closed form settles most states
}

TEST_CASE("closed_form_values: the vectorised pass gives closed_form_value's doubles, bit for bit") {
    // verify --original takes the closed form of a whole chunk from closed_form_values and
    // compares it as grid_check would have compared its own closed_form_value
    std::mt19937_64 rng(20261204);
    const codec::AdamHyper h{6e-4, 0.9, 0.95, 1e-8, 0, false, false, 300};
    const codec::GuardConst gc = codec::make_guard_const(h, 0.01);
    for (bool ams : {false, true}) {
        const std::size_t n = 1003;  // not a multiple of any vector width
        std::vector<float> m(n), v(n), vmax(n), mt(n), vt(n), vmaxt(n);
        for (std::size_t i = 0; i < n; ++i) {
            const Case c = random_case(rng);
            m[i] = float(c.m), v[i] = float(c.v), vmax[i] = float(c.vmax);
            mt[i] = float(c.mt), vt[i] = float(c.vt), vmaxt[i] = float(c.vmaxt);
            if (i % 97 == 5) m[i] = NAN;                 // a NaN original settles nothing
            if (i % 89 == 7) mt[i] = m[i], vt[i] = v[i], vmaxt[i] = vmax[i];  // equal states
        }
        std::vector<double> out(n, -1);
        closed_form_values(gc, ams, m.data(), v.data(), vmax.data(), mt.data(), vt.data(), vmaxt.data(), n, out.data());
        long finite = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const double one = closed_form_value(gc, ams, m[i], v[i], vmax[i], mt[i], vt[i], vmaxt[i]);
            INFO("ams ", ams, " i ", i);
            CHECK(std::memcmp(&one, &out[i], sizeof one) == 0);
            if (i % 97 == 5 || (i % 89 == 7 && !std::isnan(m[i]))) CHECK(out[i] == INFINITY);
            finite += out[i] < INFINITY;
        }
        CHECK(finite > long(n) / 2);
    }
}
