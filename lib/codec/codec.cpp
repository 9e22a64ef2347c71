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

/// Gradient domain of one coordinate (SPEC §2.2), widened by 1e-6 relative for the FP32
/// rounding of grad + wd*theta in torch.
void domain_of(const DomainRule& d, const float* theta, std::size_t i, double& lo, double& hi) {
    const double G = d.grad_bound;
    if (!std::isfinite(G)) { lo = -INFINITY; hi = INFINITY; return; }
    lo = INFINITY; hi = -INFINITY;
    if (d.plain) { lo = -G; hi = G; }
    if (d.l2) {
        const double s = d.weight_decay * double(theta[i]);
        lo = std::fmin(lo, s - G);
        hi = std::fmax(hi, s + G);
    }
    lo -= std::fabs(lo) * 1e-6;
    hi += std::fabs(hi) * 1e-6;
}

template <class Q>
Cell cell_of(const TensorSetup& s, uint16_t code, Role r, const int32_t* p) {
    Cell c = Q::cell(code, r, p);
    c.dec = round_to(s.type, c.dec);
    return c;
}

uint16_t load_code(const uint8_t* codes, int cb, std::size_t i) {
    return cb == 1 ? codes[i] : uint16_t(codes[2 * i] | (codes[2 * i + 1] << 8));
}

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
    for (std::size_t b = 0; b < blocks; ++b) {
        const std::size_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
        int32_t* p[3] = {};
        for (int k = 0; k < nm; ++k) {
            p[k] = out.params[k].data() + b * Q::kParams;
            Q::choose(src[k] + i0, in.v + i0, int(i1 - i0), kRoles[k], s.tolerance, p[k]);
        }
        for (std::size_t i = i0; i < i1; ++i) {
            uint16_t code[3] = {};
            bool ok = true;
            for (int k = 0; k < nm && ok; ++k) ok = Q::encode(src[k][i], kRoles[k], p[k], &code[k]);
            if (ok) {
                GuardInput g;
                g.amsgrad = s.hyper.amsgrad;
                g.m = cell_of<Q>(s, code[0], Role::ExpAvg, p[0]);
                g.v = cell_of<Q>(s, code[1], Role::ExpAvgSq, p[1]);
                if (g.amsgrad) g.vmax = cell_of<Q>(s, code[2], Role::MaxExpAvgSq, p[2]);
                domain_of(s.domain, in.theta, i, g.glo, g.ghi);
                const double bound = certify(gc, g);
                ok = bound <= s.tolerance;
                if (ok && bound > out.max_bound) out.max_bound = bound;
            }
            if (!ok) { out.escapes.push_back(uint32_t(i)); continue; }
            for (int k = 0; k < nm; ++k) {
                if (Q::kCodeBytes == 1) out.codes[k][i] = uint8_t(code[k]);
                else { out.codes[k][2 * i] = uint8_t(code[k]); out.codes[k][2 * i + 1] = uint8_t(code[k] >> 8); }
            }
        }
    }
    return out;
}

template <class Q>
void decode_impl(const TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                 const std::array<const int32_t*, 3>& params, std::size_t n,
                 std::array<float*, 3> out, const float* theta, double* bounds) {
    const int nm = s.moments();
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t b = i / kBlock;
        Cell c[3];
        for (int k = 0; k < nm; ++k) {
            c[k] = cell_of<Q>(s, load_code(codes[k], Q::kCodeBytes, i), kRoles[k],
                              params[k] + b * Q::kParams);
            if (out[k]) out[k][i] = float(c[k].dec);
        }
        if (bounds) {
            GuardInput g;
            g.amsgrad = s.hyper.amsgrad;
            g.m = c[0];
            g.v = c[1];
            if (g.amsgrad) g.vmax = c[2];
            domain_of(s.domain, theta, i, g.glo, g.ghi);
            bounds[i] = certify(gc, g);
        }
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
                  const std::array<const int32_t*, 3>& params, std::size_t n,
                  std::array<float*, 3> out, const float* theta, double* bounds) {
    switch (s.kind) {
        case Kind::Log8: return decode_impl<Log8>(s, codes, params, n, out, theta, bounds);
        case Kind::BF16: return decode_impl<BF16>(s, codes, params, n, out, theta, bounds);
        case Kind::Blockwise8: return decode_impl<Blockwise8>(s, codes, params, n, out, theta, bounds);
    }
}

}  // namespace ckpt::codec
