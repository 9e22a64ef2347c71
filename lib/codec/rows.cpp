// vlog's row prediction (declared and specified in vlog.h), in ckpt_codec so that it is
// built with the codec's flags (-O3: its loops vectorise), at every instruction-set level
// (isa.h: integer arithmetic and one exact double product, so every level gives the same
// codes; the baseline's SSE2 has no 32-bit vector multiply).
#include <vector>

#include "codec/isa.h"
#include "codec/vlog.h"

namespace ckpt::codec {

namespace {

struct RowsTag {};  ///< CKPT_ISA_CLONES' template argument (one body, no codec type)

template <class>
void rows_body(uint16_t* codes, std::size_t n, const int16_t* params, std::size_t row, bool to_residual) {
    if (row == 0 || row >= n) return;
    // All in int32 (|index * step| < 2^30); the modulo 65535 of the format is one
    // conditional add, as every sum below lies within one period of [0, 65535). The
    // division by q's step s uses a reciprocal per block: for integers 0 <= a < 2^30 and
    // 1 <= s < 2^15, floor(a * fl(1/s) + 2^-20) = floor(a / s), because the product's
    // relative error (< 2^-51) moves it by < 2^-21, and a / s is an integer or at least
    // 1/s >= 2^-15 away from one. Branch-free per coordinate (single selects, no chains),
    // so the loops vectorise: to_residual reads a copy of the absolute codes (the order
    // of the coordinates is then free); the inverse runs in coordinate order, so the row
    // above is absolute again when q needs it (it vectorises where row >= the vector width).
    constexpr int32_t kMax = VLog::kMaxIndex, kMod = 2 * kMax + 1;  // 65535 indices
    const std::size_t blocks = (n + 63) / 64;
    thread_local std::vector<int32_t> raw_step, step;
    thread_local std::vector<double> inv;
    thread_local std::vector<uint16_t> copy;
    raw_step.resize(blocks);
    step.resize(blocks);
    inv.resize(blocks);
    for (std::size_t b = 0; b < blocks; ++b) {
        raw_step[b] = params[2 * b + 1];
        step[b] = raw_step[b] > 0 ? raw_step[b] : 1;
        inv[b] = 1.0 / step[b];
    }
    auto index = [](uint32_t c) { return c == 0 ? 0 : VLog::unzigzag(c - 1); };  // 0 for code 0
    // The coordinates of q's block b (at q >= row) in one loop: q's step s and its
    // reciprocal are the block's; the row above lies in block ba or ba + 1 (sa0 / sa1),
    // from index k0 on in the second. pred: the predicted index + kMax of q from index i
    // of the coordinate above (its offset from its own anchor on q's grid), in [0, 65534].
    auto for_blocks = [&](auto body) {
        for (std::size_t b = row / 64; b < blocks; ++b) {
            const std::size_t q0 = b * 64 > row ? b * 64 : row, q1 = b * 64 + 64 < n ? b * 64 + 64 : n;
            const std::size_t ba = (q0 - row) / 64;
            const int32_t sa0 = raw_step[ba], sa1 = ba + 1 < blocks ? raw_step[ba + 1] : 0;
            const int32_t k0 = int32_t((ba + 1) * 64 + row - q0), s = step[b];
            const double iv = inv[b];
            auto pred = [=](int32_t k, int32_t i) {
                const int32_t e = i * (k >= k0 ? sa1 : sa0);
                const int32_t a = (e >= 0 ? e : -e) + s / 2;  // nearest, halves away from 0
                const int32_t qa = int32_t(double(a) * iv + 0x1p-20);
                int32_t j = e >= 0 ? qa : -qa;
                j = j < -kMax ? -kMax : j;
                j = j > kMax ? kMax : j;
                return j + kMax;
            };
            body(q0, int32_t(q1 - q0), pred);
        }
    };
    if (to_residual) {
        copy.assign(codes, codes + n);
        const uint16_t* abs = copy.data();
        for_blocks([&](std::size_t q0, int32_t len, auto pred) {
            for (int32_t k = 0; k < len; ++k) {
                const uint32_t cur = abs[q0 + k], above = abs[q0 + k - row];
                int32_t r = index(cur) + kMax - pred(k, index(above));  // (-65535, 65535)
                r = r > kMax ? r - kMod : r;
                r = r < -kMax ? r + kMod : r;
                const uint32_t sent = 1 + VLog::zigzag(r);
                codes[q0 + k] = uint16_t(((cur == 0) | (above == 0)) ? cur : sent);
            }
        });
        return;
    }
    for_blocks([&](std::size_t q0, int32_t len, auto pred) {
        for (int32_t k = 0; k < len; ++k) {
            const uint32_t cur = codes[q0 + k], above = codes[q0 + k - row];
            int32_t u = pred(k, index(above)) + index(cur);  // [-32767, 98301]
            u = u < 0 ? u + kMod : u;
            u = u >= kMod ? u - kMod : u;
            const uint32_t absolute = 1 + VLog::zigzag(u - kMax);
            codes[q0 + k] = uint16_t(((cur == 0) | (above == 0)) ? cur : absolute);
        }
    });
}

CKPT_ISA_CLONES(rows_isa, rows_body)

}  // namespace

void vlog_rows(uint16_t* codes, std::size_t n, const int16_t* params, std::size_t row, bool to_residual) {
    rows_isa<RowsTag>(codes, n, params, row, to_residual);
}

}  // namespace ckpt::codec
