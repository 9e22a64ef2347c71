#include "codec/codec.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "codec/bf16.h"
#include "codec/blockwise8.h"

namespace ckpt::codec {

Kind kind_from_name(const std::string& s) {
    if (s == "log8") return Kind::Log8;
    if (s == "bf16") return Kind::BF16;
    if (s == "blockwise8") return Kind::Blockwise8;
    throw std::invalid_argument("unknown codec '" + s + "' (log8, bf16, blockwise8)");
}
const char* kind_name(Kind k) {
    switch (k) {
        case Kind::Log8: return "log8";
        case Kind::BF16: return "bf16";
        case Kind::Blockwise8: return "blockwise8";
    }
    return "?";
}
int code_bytes(Kind k) { return k == Kind::BF16 ? BF16::kCodeBytes : 1; }
int params_per_block(Kind k) {
    return k == Kind::Log8 ? Log8::kParams : k == Kind::BF16 ? BF16::kParams : Blockwise8::kParams;
}

double round_to(MomentType t, double x) {
    if (t == MomentType::F32) return x;
    const float f = float(x);
    if (t == MomentType::BF16) {
        if (!std::isfinite(f)) return f;
        return BF16::from_code(BF16::rne(f));
    }
    // IEEE half: round through _Float16 (GCC on x86-64 supports it in software)
    return double(static_cast<float>(static_cast<_Float16>(x)));
}

namespace {

constexpr Role kRoles[3] = {Role::ExpAvg, Role::ExpAvgSq, Role::MaxExpAvgSq};

}  // namespace

void gradient_domain(const DomainRule& d, const float* theta, std::size_t i, double& lo, double& hi) {
    const double G = d.grad_bound;
    if (!std::isfinite(G)) { lo = -INFINITY; hi = INFINITY; return; }
    lo = INFINITY; hi = -INFINITY;
    if (d.plain) { lo = -G; hi = G; }
    if (d.l2) {
        const double s = theta ? d.weight_decay * double(theta[i]) : 0.0;
        const double w = theta ? 0.0 : std::fabs(d.weight_decay) * d.theta_bound;
        lo = std::fmin(lo, s - w - G);
        hi = std::fmax(hi, s + w + G);
    }
    lo -= std::fabs(lo) * 1e-6;
    hi += std::fabs(hi) * 1e-6;
}

namespace {

template <class Q>
Cell cell_of(const TensorSetup& s, uint16_t code, Role r, const int16_t* p, double scale) {
    Cell c = Q::cell(code, r, p, scale);
    c.dec = round_to(s.type, c.dec);
    return c;
}

uint16_t load_code(const uint8_t* codes, int cb, std::size_t i) {
    return cb == 1 ? codes[i] : uint16_t(codes[2 * i] | (codes[2 * i + 1] << 8));
}
void store_code(uint8_t* codes, int cb, std::size_t i, uint16_t c) {
    if (cb == 1) codes[i] = uint8_t(c);
    else { codes[2 * i] = uint8_t(c); codes[2 * i + 1] = uint8_t(c >> 8); }
}

/// The guard input of one coordinate from its cells; false when it cannot be certified.
GuardInput guard_input(const TensorSetup& s, const Cell* c, const float* theta, std::size_t i) {
    GuardInput g;
    g.amsgrad = s.hyper.amsgrad;
    g.m = c[0];
    g.v = c[1];
    if (g.amsgrad) g.vmax = c[2];
    gradient_domain(s.domain, theta, i, g.glo, g.ghi);
    return g;
}

/// exp_avg is coded relative to sqrt of the decoded denominator state at g = 0:
/// exp_avg_sq, or max(exp_avg_sq, max_exp_avg_sq) with amsgrad.
double m_scale(double v, double vmax) { return sqrt(v > vmax ? v : vmax); }

// Moments are coded in the order max_exp_avg_sq, exp_avg_sq, exp_avg.
template <class Q>
ChunkOut encode_impl(const TensorSetup& s, const ChunkIn& in) {
    const int nm = s.moments();
    const std::size_t n = in.n, blocks = (n + kBlock - 1) / kBlock;
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance);
    const float* src[3] = {in.m, in.v, in.vmax};
    ChunkOut out;
    for (int k = 0; k < nm; ++k) {
        out.codes[k].assign(n * Q::kCodeBytes, 0);
        out.params[k].assign(blocks * Q::kParams, 0);
    }
    struct Trial {
        int16_t p[3][Q::kParams > 0 ? Q::kParams : 1];
        uint16_t code[3][kBlock];
        bool keep[kBlock];
        double bound[kBlock];
        int escapes;
    };
    Trial best, t;
    double scale[kBlock];
    Cell cells[3][kBlock];
    for (std::size_t b = 0; b < blocks; ++b) {
        const std::size_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
        const int bn = int(i1 - i0);
        best.escapes = bn + 1;
        // exp_avg_sq and max_exp_avg_sq parameters: choose(), then (only while the block
        // has escapes) the codec's alternatives; exp_avg follows the decoded v.
        for (int trial = 0; trial < 2 * Q::kVariants && best.escapes > 0; ++trial) {
            const int variant = trial / 2, mvariant = trial % 2;  // v step, exp_avg step
            bool any = variant == 0;
            for (int k = nm - 1; k >= 1; --k) {
                Q::choose(src[k] + i0, bn, kRoles[k], nullptr, gc, t.p[k]);
                if (variant > 0) any = Q::vary(t.p[k], variant) || any;
            }
            if (!any || (mvariant && Q::kVariants == 1)) continue;
            for (int j = 0; j < bn; ++j) t.keep[j] = true;
            for (int k = nm - 1; k >= 0; --k) {
                if (k == 0) {
                    for (int j = 0; j < bn; ++j)
                        scale[j] = t.keep[j] ? m_scale(cells[1][j].dec, nm == 3 ? cells[2][j].dec : 0.0) : 0.0;
                    Q::choose(src[0] + i0, bn, kRoles[0], scale, gc, t.p[0]);
                    if (mvariant) Q::vary(t.p[0], -1);
                }
                for (int j = 0; j < bn; ++j) {
                    if (!t.keep[j]) continue;
                    const double sc = k == 0 ? scale[j] : 0.0;
                    t.keep[j] = Q::encode(src[k][i0 + j], kRoles[k], t.p[k], sc, &t.code[k][j]);
                    if (t.keep[j]) cells[k][j] = cell_of<Q>(s, t.code[k][j], kRoles[k], t.p[k], sc);
                }
            }
            t.escapes = 0;
            for (int j = 0; j < bn; ++j) {
                if (t.keep[j]) {
                    const Cell c[3] = {cells[0][j], cells[1][j], cells[2][j]};
                    t.bound[j] = certify(gc, guard_input(s, c, in.theta, i0 + std::size_t(j)));
                    t.keep[j] = t.bound[j] <= s.tolerance;
                }
                t.escapes += !t.keep[j];
            }
            if (t.escapes < best.escapes) std::swap(best, t);
        }
        for (int k = 0; k < nm; ++k)
            std::copy(best.p[k], best.p[k] + Q::kParams, out.params[k].data() + b * Q::kParams);
        for (int j = 0; j < bn; ++j) {
            const std::size_t i = i0 + std::size_t(j);
            if (!best.keep[j]) { out.escapes.push_back(uint32_t(i)); continue; }
            out.max_bound = std::max(out.max_bound, best.bound[j]);
            for (int k = 0; k < nm; ++k) store_code(out.codes[k].data(), Q::kCodeBytes, i, best.code[k][j]);
        }
    }
    return out;
}

template <class Q>
void decode_impl(const TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                 const std::array<const int16_t*, 3>& params, std::size_t n,
                 std::array<float*, 3> out, const float* theta, double* bounds) {
    const int nm = s.moments();
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t b = i / kBlock;
        Cell c[3];
        for (int k = nm - 1; k >= 0; --k) {
            const double scale = k == 0 ? m_scale(c[1].dec, nm == 3 ? c[2].dec : 0.0) : 0.0;
            c[k] = cell_of<Q>(s, load_code(codes[k], Q::kCodeBytes, i), kRoles[k],
                              params[k] + b * Q::kParams, scale);
            if (out[k]) out[k][i] = float(c[k].dec);
        }
        if (bounds) bounds[i] = certify(gc, guard_input(s, c, theta, i));
    }
}

}  // namespace

ChunkOut encode_chunk(const TensorSetup& s, const ChunkIn& in) {
    switch (s.kind) {
        case Kind::Log8: return encode_impl<Log8>(s, in);
        case Kind::BF16: return encode_impl<BF16>(s, in);
        case Kind::Blockwise8: return encode_impl<Blockwise8>(s, in);
    }
    throw std::logic_error("codec kind");
}

void decode_chunk(const TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                  const std::array<const int16_t*, 3>& params, std::size_t n,
                  std::array<float*, 3> out, const float* theta, double* bounds) {
    switch (s.kind) {
        case Kind::Log8: return decode_impl<Log8>(s, codes, params, n, out, theta, bounds);
        case Kind::BF16: return decode_impl<BF16>(s, codes, params, n, out, theta, bounds);
        case Kind::Blockwise8: return decode_impl<Blockwise8>(s, codes, params, n, out, theta, bounds);
    }
}

}  // namespace ckpt::codec
