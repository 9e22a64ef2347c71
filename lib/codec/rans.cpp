#include "codec/rans.h"

#include "codec/isa.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
// GCC 12 warns inside its own AVX-512 headers (their _mm512_undefined_* results; GCC bug
// 105593): off around the AVX-512 functions; clang has no such warning
#if defined(__GNUC__) && !defined(__clang__)
#define CKPT_AVX512_WARNINGS_OFF _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define CKPT_AVX512_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define CKPT_AVX512_WARNINGS_OFF
#define CKPT_AVX512_WARNINGS_ON
#endif

namespace ckpt::codec {

namespace {

constexpr int kSymbols = 76;
constexpr uint32_t kProbBits = 14, kProb = 1u << kProbBits;
constexpr uint32_t kLow = 1u << 23;  ///< rANS state lower bound
/// Mode 3 (format version 4): 16 states, 12-bit frequencies, 16-bit renormalisation words.
constexpr int kLanes = 16;
constexpr uint32_t kProbBits12 = 12, kProb12 = 1u << kProbBits12, kLow16 = 1u << 16;
/// segment_encode's default codes a segment of at most this many codes both ways (mode 3
/// and mode 2) and keeps the smaller.
constexpr std::size_t kBothBelow = 4096;
/// Segment modes: rANS with two interleaved states (format version 2), raw, rANS with four
/// (version 3), rANS with sixteen and 16-bit words (version 4, written since).
enum : uint8_t { kModeRans2 = 0, kModeRaw = 1, kModeRans4 = 2, kModeRans16 = 3 };

/// Each code's symbol, raw bit count and raw low bits (codes[0..n) into sym, extra, low):
/// branch-free and vectorisable at every instruction-set level (isa.h). The bit length nb
/// of x | 32 (6..16) is the exponent of its float value (exact below 2^24), which needs no
/// vector count-leading-zeros; the selects are products with the 0/1 flag `big`. The
/// symbol and bits are integers: every level gives the same ones.
template <class>
void split_body(const uint16_t* __restrict codes, std::size_t n, uint8_t* __restrict sym, uint8_t* __restrict extra,
                uint16_t* __restrict low) {
    for (std::size_t i = 0; i < n; ++i) {
        const uint32_t x = codes[i];
        const uint32_t big = uint32_t(x >= 32);
        const float fx = float(x | 32);
        uint32_t fbits;
        std::memcpy(&fbits, &fx, 4);
        const uint32_t nb = (fbits >> 23) - 126;  // biased exponent 127 + nb - 1
        const uint32_t e = (nb - 3) * big;
        const uint32_t s_big = 32 + 4 * (nb - 6) + ((x >> (nb - 3)) & 3);
        sym[i] = uint8_t(x + (s_big - x) * big);
        extra[i] = uint8_t(e);
        low[i] = uint16_t(x & ((1u << e) - 1));
    }
}

/// split_body's inverse for the decoder: each symbol's raw bit count and base value (the
/// code with its raw bits zero), sym[0..n) into extra and base. Vectorisable likewise.
template <class>
void join_body(const uint8_t* __restrict sym, std::size_t n, uint8_t* __restrict extra, uint16_t* __restrict base) {
    for (std::size_t i = 0; i < n; ++i) {
        const uint32_t s = sym[i];
        const uint32_t big = uint32_t(s >= 32);
        const uint32_t e = ((s - 32) / 4 + 3) * big;  // symbols 32 + 4 (nb - 6) + t: nb - 3 raw bits
        const uint32_t b = (4 | ((s - 32) & 3)) << e;  // the top bit and the two below it
        extra[i] = uint8_t(e);
        base[i] = uint16_t(s + (b - s) * big);
    }
}

struct SplitTag {};  ///< CKPT_ISA_CLONES' template argument (encode; decode_body inlines join_body)
CKPT_ISA_CLONES(split_isa, split_body)

void put_varint(std::vector<uint8_t>& out, uint64_t v) {
    while (v >= 0x80) { out.push_back(uint8_t(v | 0x80)); v >>= 7; }
    out.push_back(uint8_t(v));
}

struct Cursor {
    const uint8_t* p;
    const uint8_t* end;
    [[noreturn]] static void bad(const char* what) { throw std::runtime_error(std::string("vlog segment: ") + what); }
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (p == end) bad("truncated header");
            const uint8_t b = *p++;
            v |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        bad("bad varint");
    }
};

/// Frequencies summing to `total` (2^14 or 2^12), >= 1 for every symbol that occurs
/// (deterministic).
std::array<uint32_t, kSymbols> normalise(const std::array<uint64_t, kSymbols>& count, uint64_t n, uint32_t total) {
    std::array<uint32_t, kSymbols> f{};
    int64_t sum = 0;
    int top = 0;
    for (int s = 0; s < kSymbols; ++s) {
        if (!count[s]) continue;
        f[s] = std::max<uint32_t>(1, uint32_t(count[s] * total / n));
        sum += f[s];
        if (count[s] > count[top]) top = s;
    }
    while (sum != total) {  // give the difference to (or take it from) the largest frequencies
        if (sum < total) { f[top] += uint32_t(total - sum); sum = total; break; }
        int big = -1;
        for (int s = 0; s < kSymbols; ++s)
            if (f[s] > 1 && (big < 0 || f[s] > f[big])) big = s;
        const uint32_t take = std::min<uint32_t>(f[big] - 1, uint32_t(sum - total));
        f[big] -= take;
        sum -= take;
    }
    return f;
}


/// The rANS stream of sym[0..n) through S interleaved states (code i through state
/// i mod S: ryg_rans's interleaving, so the decoder's S dependency chains overlap), written
/// backwards to end at `p`: the last code first, then the S final states (4 bytes
/// little-endian each, state 0 first). put(state, symbol, p) codes one symbol and writes
/// its renormalisation output below p. Returns the stream's first byte. The whole rounds
/// go through put too, or through rounds(xs, full, p) when given (codes [0, full), S
/// states xs, the same bytes: a vector form). The states are a local array indexed by
/// constants once the loops over k are unrolled, so the compiler keeps them out of memory
/// that the byte stores could alias.
template <int S, uint32_t Low, class Put, class Rounds = std::nullptr_t>
uint8_t* put_states(const uint8_t* sym, std::size_t n, uint8_t* p, Put put, Rounds rounds = nullptr) {
    uint32_t xs[S];
    for (int k = 0; k < S; ++k) xs[k] = Low;
    const std::size_t full = n / S * S;  // the n mod S codes of the incomplete last round first
    for (int k = S - 1; k >= 0; --k)
        if (full + std::size_t(k) < n) put(xs[k], sym[full + std::size_t(k)], p);
    if constexpr (!std::is_same_v<Rounds, std::nullptr_t>) {
        rounds(xs, full, p);
    } else {
        for (std::size_t i = full; i > 0;) {
            i -= S;
#pragma GCC unroll 16
            for (int k = S - 1; k >= 0; --k) put(xs[k], sym[i + std::size_t(k)], p);
        }
    }
    for (int k = S - 1; k >= 0; --k) {
        p -= 4;
        for (int b = 0; b < 4; ++b) p[b] = uint8_t(xs[k] >> (8 * b));
    }
    return p;
}

/// Modes 0 and 2 (format versions 2 and 3): S states in [2^23, 2^31), byte-wise
/// renormalisation, 14-bit frequencies f with starts cum. x' = (x / f) 2^14 + x mod f + cum,
/// the division done as a multiplication by a reciprocal (ryg_rans RansEncSymbolInit /
/// RansEncPutSymbol: exact for every state below 2^31).
template <int S>
uint8_t* put_bytes(const uint8_t* sym, std::size_t n, const std::array<uint32_t, kSymbols>& f,
                   const std::array<uint32_t, kSymbols>& cum, uint8_t* end) {
    struct Enc { uint32_t xmax, rcp, bias, cmpl; int shift; };
    std::array<Enc, kSymbols> enc{};
    for (int s = 0; s < kSymbols; ++s) {
        if (!f[s]) continue;
        Enc& e = enc[s];
        e.xmax = ((kLow >> kProbBits) << 8) * f[s];
        e.cmpl = kProb - f[s];
        if (f[s] < 2) {
            e.rcp = ~0u;
            e.shift = 0;
            e.bias = cum[s] + kProb - 1;
        } else {
            int sh = 0;
            while (f[s] > (1u << sh)) ++sh;
            e.rcp = uint32_t(((uint64_t(1) << (sh + 31)) + f[s] - 1) / f[s]);
            e.shift = sh - 1;
            e.bias = cum[s];
        }
    }
    return put_states<S, kLow>(sym, n, end, [&](uint32_t& st, uint8_t sy, uint8_t*& p) {
        const Enc& e = enc[sy];
        // renormalise: 0, 1 or 2 bytes out (st < 2^31 and xmax >= 2^17), branch-free
        const int k = int(st >= e.xmax) + int((st >> 8) >= e.xmax);
        p[-1] = uint8_t(st);
        p[-2] = uint8_t(st >> 8);
        p -= k;
        st >>= 8 * k;
        const uint32_t q = uint32_t((uint64_t(st) * e.rcp) >> 32) >> e.shift;
        st = st + e.bias + q * e.cmpl;
    });
}

/// The AVX-512 rounds' per-symbol tables hold kTable entries (zeros past kSymbols): five
/// vectors of 16 words, ten of 8 doubles, which fc_lookup and rf_lookup cover.
constexpr int kTable = 80;
static_assert(kSymbols <= kTable);

#if defined(__x86_64__)
CKPT_AVX512_WARNINGS_OFF
/// Which range of 16 symbols each of 16 lanes' symbols s falls in: ge[r] = lanes with
/// s >= 16 (r + 1), r = 0..3 (the table lookups' blends).
struct SymbolRanges {
    __mmask16 ge[4];
};

/// rf[s] for the 8 symbols s8 (lanes 8h..8h+7 of the round, ranges r.ge >> 8h) without a
/// gather: each 16-double range of the table by a two-vector permute (index bits 0-3),
/// then blended in by range. On Zen 4 these ten permutes and blends beat two gathers of 8
/// doubles (docs/benchmarks.md, "Measurements behind the code's choices").
__attribute__((target(CKPT_TARGET_AVX512), always_inline)) inline __m512d
rf_lookup(const double* rf, __m256i s8, const SymbolRanges& r, int h) {
    const __m512i idx = _mm512_cvtepu32_epi64(s8);
    __m512d v = _mm512_permutex2var_pd(_mm512_load_pd(rf), idx, _mm512_load_pd(rf + 8));
    for (int k = 0; k < 4; ++k)
        v = _mm512_mask_blend_pd(__mmask8(r.ge[k] >> (8 * h)), v,
                                 _mm512_permutex2var_pd(_mm512_load_pd(rf + 16 * (k + 1)), idx, _mm512_load_pd(rf + 16 * (k + 1) + 8)));
    return v;
}

/// fc[s] for the 16 symbols s of a round without a gather: 32-word ranges by two-vector
/// permutes (index bits 0-4), the last 16 by a one-vector permute, blended by range.
__attribute__((target(CKPT_TARGET_AVX512), always_inline)) inline __m512i
fc_lookup(const uint32_t* fc, __m512i s, const SymbolRanges& r) {
    const __m512i lo = _mm512_permutex2var_epi32(_mm512_load_si512(fc), s, _mm512_load_si512(fc + 16));
    const __m512i mid = _mm512_permutex2var_epi32(_mm512_load_si512(fc + 32), s, _mm512_load_si512(fc + 48));
    const __m512i top = _mm512_permutexvar_epi32(s, _mm512_load_si512(fc + 64));
    return _mm512_mask_blend_epi32(r.ge[3], _mm512_mask_blend_epi32(r.ge[1], lo, mid), top);
}

/// One of put_words' whole rounds with AVX-512 (codes sym[0..16)), the 16 states X as one
/// vector, its words below p (p moves down). Each lane's fc word (f | cum << 13) and rf
/// (fc_lookup, rf_lookup); the lanes with x >= f 2^20 (x >> 20 >= f) send their low
/// words, compressed into lane order and stored below p with a masked 16-bit store;
/// then x' = x + cum + q (2^12 - f) with q = x div f from doubles: fl(fl(x rf) + 2^-20)
/// with rf = fl(1 / f) is within 2^-31 of x / f + 2^-20 (x < 2^32, relative errors
/// 2^-53), and x / f is an integer or at least 1/f >= 2^-12 below one, so truncation gives
/// x div f exactly. The same bytes as the scalar rounds (test_rans).
__attribute__((target(CKPT_TARGET_AVX512), always_inline)) inline void
words_encode_round_avx512(const uint8_t* sym, const uint32_t* fc, const double* rf, __m512i& X, uint8_t*& p) {
    static_assert(kLanes == 16);
    const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sym)));
    SymbolRanges r;
    for (int k = 0; k < 4; ++k) r.ge[k] = _mm512_cmpge_epu32_mask(s, _mm512_set1_epi32(16 * (k + 1)));
    const __m512i e = fc_lookup(fc, s, r);
    const __m512i f = _mm512_and_si512(e, _mm512_set1_epi32(0x1fff));
    const __mmask16 m = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(X, 20), f);
    const unsigned cnt = unsigned(__builtin_popcount(m));
    p -= 2 * cnt;
    _mm512_mask_cvtepi32_storeu_epi16(p, __mmask16((1u << cnt) - 1), _mm512_maskz_compress_epi32(m, X));
    X = _mm512_mask_srli_epi32(X, m, X, 16);
    const __m512d nudge = _mm512_set1_pd(0x1p-20);
    const __m512d r_lo = rf_lookup(rf, _mm512_castsi512_si256(s), r, 0);
    const __m512d r_hi = rf_lookup(rf, _mm512_extracti64x4_epi64(s, 1), r, 1);
    const __m256i q_lo = _mm512_cvttpd_epu32(_mm512_add_pd(_mm512_mul_pd(_mm512_cvtepu32_pd(_mm512_castsi512_si256(X)), r_lo), nudge));
    const __m256i q_hi = _mm512_cvttpd_epu32(_mm512_add_pd(_mm512_mul_pd(_mm512_cvtepu32_pd(_mm512_extracti64x4_epi64(X, 1)), r_hi), nudge));
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q_lo), q_hi, 1);
    X = _mm512_add_epi32(_mm512_add_epi32(X, _mm512_srli_epi32(e, 13)), _mm512_mullo_epi32(q, _mm512_sub_epi32(_mm512_set1_epi32(int(kProb12)), f)));
}

/// put_words' whole rounds with AVX-512 (words_encode_round_avx512, above).
__attribute__((target(CKPT_TARGET_AVX512), noinline)) uint8_t*
words_encode_avx512(const uint8_t* sym, std::size_t full, const uint32_t* fc, const double* rf, uint32_t* xs, uint8_t* p) {
    __m512i X = _mm512_loadu_si512(xs);
    for (std::size_t i = full; i > 0;) {
        i -= 16;
        words_encode_round_avx512(sym + i, fc, rf, X, p);
    }
    _mm512_storeu_si512(xs, X);
    return p;
}

/// words_encode_avx512 over two segments (a = 0, 1: symbols sym[a], whole rounds
/// full[a], tables fc[a] / rf[a], states xs[a], output below p[a]), a round of each in
/// turn while both have rounds left, then the rest of the longer: a round is one chain of
/// dependent operations through the 16 states, and the two segments' chains overlap. The
/// same rounds, so the same bytes, as words_encode_avx512 on each.
__attribute__((target(CKPT_TARGET_AVX512), noinline)) void
words_encode_avx512_x2(const uint8_t* const* sym, const std::size_t* full, const uint32_t* const* fc,
                       const double* const* rf, uint32_t* const* xs, uint8_t** p) {
    __m512i X0 = _mm512_loadu_si512(xs[0]), X1 = _mm512_loadu_si512(xs[1]);
    std::size_t i0 = full[0], i1 = full[1];
    uint8_t *p0 = p[0], *p1 = p[1];
    for (; i0 > 0 && i1 > 0;) {
        i0 -= 16;
        words_encode_round_avx512(sym[0] + i0, fc[0], rf[0], X0, p0);
        i1 -= 16;
        words_encode_round_avx512(sym[1] + i1, fc[1], rf[1], X1, p1);
    }
    for (; i0 > 0;) i0 -= 16, words_encode_round_avx512(sym[0] + i0, fc[0], rf[0], X0, p0);
    for (; i1 > 0;) i1 -= 16, words_encode_round_avx512(sym[1] + i1, fc[1], rf[1], X1, p1);
    _mm512_storeu_si512(xs[0], X0);
    _mm512_storeu_si512(xs[1], X1);
    p[0] = p0;
    p[1] = p1;
}
CKPT_AVX512_WARNINGS_ON
#endif

/// put_words' tables for one segment's frequencies f and starts cum: the scalar coder's
/// per symbol (the reciprocal m = ceil(2^64 / f), the renormalisation bound, bias and
/// complement; see put_words) and the AVX-512 rounds' (fc, rf).
struct WordsTables {
    struct Enc { uint64_t m, xmax; uint32_t bias, cmpl; };
    std::array<Enc, kSymbols> enc{};
    alignas(64) uint32_t fc[kTable] = {};  ///< the AVX-512 rounds' tables: f | cum << 13, and 1 / f
    alignas(64) double rf[kTable] = {};
    WordsTables(const std::array<uint32_t, kSymbols>& f, const std::array<uint32_t, kSymbols>& cum) {
        for (int s = 0; s < kSymbols; ++s) {
            fc[s] = f[s] | cum[s] << 13;
            rf[s] = f[s] ? 1.0 / double(f[s]) : 0.0;
            if (!f[s]) continue;
            Enc& e = enc[s];
            e.xmax = uint64_t(f[s]) << 20;  // ((2^16 >> 12) << 16) f; 2^32 for f = 2^12: never
            e.cmpl = kProb12 - f[s];
            e.m = f[s] == 1 ? ~uint64_t(0) : ~uint64_t(0) / f[s] + 1;
            e.bias = cum[s] + (f[s] == 1 ? kProb12 - 1 : 0);
        }
    }
    /// One code of symbol sy through state x, its word (if any) below p.
    void put(uint32_t& x, uint8_t sy, uint8_t*& p) const {
        const Enc& e = enc[sy];
        const uint32_t c = uint32_t(x >= e.xmax);
        p[-2] = uint8_t(x);
        p[-1] = uint8_t(x >> 8);
        p -= 2 * c;
        x >>= 16 * c;
        const uint32_t q = uint32_t((static_cast<unsigned __int128>(x) * e.m) >> 64);
        x = x + e.bias + q * e.cmpl;
    }
};

/// Mode 3 (format version 4): kLanes states in [2^16, 2^32), 16-bit renormalisation words
/// (little-endian), 12-bit frequencies: x' = (x / f) 2^12 + x mod f + cum. A state at or
/// above f 2^20 sends its low word first, so at most one word per code, and the decoder
/// reads one exactly when its state falls below 2^16 (ryg_rans's rans_word_sse41). The
/// division is a multiplication by m = ceil(2^64 / f), exact for every 32-bit x (Lemire,
/// Kaser & Kurz 2019, "Faster remainder by direct computation", Theorem 1: 64 >= 32 +
/// log2 f); for f = 1, m = 2^64 - 1 gives x - 1 and the bias gains 2^12 - 1 to match (as
/// RansEncSymbolInit does).
uint8_t* put_words(const uint8_t* sym, std::size_t n, const std::array<uint32_t, kSymbols>& f,
                   const std::array<uint32_t, kSymbols>& cum, uint8_t* end) {
    const WordsTables t(f, cum);
    auto put = [&](uint32_t& x, uint8_t sy, uint8_t*& p) { t.put(x, sy, p); };
#if defined(__x86_64__)
    if (active_isa() == Isa::AVX512)
        return put_states<kLanes, kLow16>(sym, n, end, put, [&](uint32_t* xs, std::size_t full, uint8_t*& p) {
            p = words_encode_avx512(sym, full, t.fc, t.rf, xs, p);
        });
#endif
    return put_states<kLanes, kLow16>(sym, n, end, put);
}

#if defined(__x86_64__)
/// put_words of two segments (a = 0, 1) with AVX-512, their whole rounds interleaved
/// (words_encode_avx512_x2): segment 1's put_states runs inside segment 0's rounds step,
/// which changes only when each segment's own steps run, not what they write. Returns
/// each stream's first byte in first[a].
void put_words_x2(const uint8_t* const* sym, const std::size_t* n, const std::array<uint32_t, kSymbols>* f,
                  const std::array<uint32_t, kSymbols>* cum, uint8_t* const* end, uint8_t** first) {
    const WordsTables t0(f[0], cum[0]), t1(f[1], cum[1]);
    auto put0 = [&](uint32_t& x, uint8_t sy, uint8_t*& p) { t0.put(x, sy, p); };
    auto put1 = [&](uint32_t& x, uint8_t sy, uint8_t*& p) { t1.put(x, sy, p); };
    first[0] = put_states<kLanes, kLow16>(sym[0], n[0], end[0], put0, [&](uint32_t* xs0, std::size_t full0, uint8_t*& p0) {
        first[1] = put_states<kLanes, kLow16>(sym[1], n[1], end[1], put1, [&](uint32_t* xs1, std::size_t full1, uint8_t*& p1) {
            const std::size_t full[2] = {full0, full1};
            const uint32_t* const fc[2] = {t0.fc, t1.fc};
            const double* const rf[2] = {t0.rf, t1.rf};
            uint32_t* const xs[2] = {xs0, xs1};
            uint8_t* p[2] = {p0, p1};
            words_encode_avx512_x2(sym, full, fc, rf, xs, p);
            p0 = p[0];
            p1 = p[1];
        });
    });
}
#endif

/// The raw-bit stream's writer (LSB first), branch-free: put() ORs a group of len <= 56
/// bits in above the pending ones, stores all 8 bytes of the accumulator at the first byte
/// not yet complete, then drops the whole bytes (fewer than 8 bits stay pending). The
/// buffer needs 8 bytes of room past the last byte written.
struct BitSink {
    uint8_t* bp;
    uint64_t acc = 0;
    uint32_t have = 0;
    std::size_t nbytes = 0;
    void put(uint64_t group, uint32_t len) {
        acc |= group << have;
        have += len;
        std::memcpy(bp + nbytes, &acc, 8);  // little-endian: byte b holds bits 8b..8b+7
        nbytes += std::size_t(have >> 3);
        acc >>= (have & ~7u);
        have &= 7;
    }
};

#if defined(__x86_64__)
CKPT_AVX512_WARNINGS_OFF
/// SegmentCoder::prepare's passes 1a and 1c fused, 16 codes a round with AVX-512: split_body's
/// symbols (stored in sym), raw bit counts and raw bits (kept in the vector), and the four
/// groups of the round put together in vector lanes (pairs in 64-bit lanes, then pairs of
/// pairs); only their sink.put calls stay serial. Returns the codes done (a multiple of 16,
/// at most n); the same symbols and groups, so the same bytes, as the scalar passes
/// (test_rans compares the levels).
__attribute__((target(CKPT_TARGET_AVX512), noinline)) std::size_t
split_groups_avx512(const uint16_t* codes, std::size_t n, uint8_t* sym, BitSink& sink) {
    const __m512i low32 = _mm512_set1_epi64(0xffffffff), c32 = _mm512_set1_epi32(32), c3 = _mm512_set1_epi32(3),
                  one = _mm512_set1_epi32(1);
    BitSink s = sink;  // a local: its fields stay in registers
    alignas(64) uint64_t g[8], len[8];
    std::size_t i = 0;
    for (; n - i >= 16; i += 16) {
        const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i)));
        const __mmask16 big = _mm512_cmpge_epu32_mask(x, c32);
        // split_body: nb = the bit length of x | 32 from its float exponent
        const __m512i fb = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_or_si512(x, c32)));
        const __m512i nb3 = _mm512_sub_epi32(_mm512_srli_epi32(fb, 23), _mm512_set1_epi32(129));  // nb - 3
        const __m512i e = _mm512_maskz_mov_epi32(big, nb3);
        const __m512i s_big = _mm512_add_epi32(_mm512_add_epi32(c32, _mm512_slli_epi32(_mm512_sub_epi32(nb3, c3), 2)),
                                               _mm512_and_si512(_mm512_srlv_epi32(x, nb3), c3));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(sym + i), _mm512_cvtepi32_epi8(_mm512_mask_mov_epi32(x, big, s_big)));
        const __m512i l = _mm512_and_si512(x, _mm512_sub_epi32(_mm512_sllv_epi32(one, e), one));
        // codes 2j and 2j + 1 in 64-bit lane j: l[2j] | l[2j + 1] << e[2j], e[2j] + e[2j + 1] bits
        const __m512i e0 = _mm512_and_si512(e, low32);
        const __m512i p = _mm512_or_si512(_mm512_and_si512(l, low32), _mm512_sllv_epi64(_mm512_srli_epi64(l, 32), e0));
        const __m512i pl = _mm512_add_epi64(e0, _mm512_srli_epi64(e, 32));
        // pairs 2q and 2q + 1 in 64-bit lane 2q (unpackhi: lane 2q + 1 of each 128-bit half)
        _mm512_store_si512(g, _mm512_or_si512(p, _mm512_sllv_epi64(_mm512_unpackhi_epi64(p, p), pl)));
        _mm512_store_si512(len, _mm512_add_epi64(pl, _mm512_unpackhi_epi64(pl, pl)));
        s.put(g[0], uint32_t(len[0]));
        s.put(g[2], uint32_t(len[2]));
        s.put(g[4], uint32_t(len[4]));
        s.put(g[6], uint32_t(len[6]));
    }
    sink = s;
    return i;
}
CKPT_AVX512_WARNINGS_ON
#endif

/// segment_encode's work on one segment of n > 0 codes: its symbols, raw bits and
/// frequencies (prepare), then, once a put_* wrote the rANS stream to end at end(), its
/// bytes (emit). Buffers reused from segment to segment.
struct SegmentCoder {
    std::vector<uint8_t> sym, extra, buf, bits;
    std::vector<uint16_t> low;
    std::size_t n = 0, nbits = 0;
    std::array<uint32_t, kSymbols> f{}, cum{};
    uint8_t* end() { return buf.data() + buf.size(); }
    void prepare(const uint16_t* codes, std::size_t n, int states);
    void emit(const uint16_t* codes, int states, const uint8_t* ptr, std::vector<uint8_t>& out);
};

}  // namespace

void SegmentCoder::prepare(const uint16_t* codes, std::size_t count_n, int states) {
    n = count_n;
    const std::size_t n4 = (n + 3) / 4 * 4;
    sym.resize(n4);
    extra.resize(n4);
    low.resize(n4);
    bits.resize(2 * n + 16);
    BitSink sink{bits.data()};  // pass 1c's writer (LSB first, four codes a group)
    std::size_t done = 0;       // codes whose symbols and raw bits the fused rounds wrote
#if defined(__x86_64__)
    if (active_isa() == Isa::AVX512) done = split_groups_avx512(codes, n, sym.data(), sink);
#endif
    // pass 1a (vectorised): the other codes' symbols, raw bit counts and raw bits; the
    // padding to whole groups of 4 has no raw bits
    split_isa<SplitTag>(codes + done, n - done, sym.data() + done, extra.data() + done, low.data() + done);
    for (std::size_t i = n; i < n4; ++i) extra[i] = 0, low[i] = 0;
    // pass 1b: the counts, in four histograms (code i into i mod 4: consecutive equal
    // symbols do not wait on each other's increment; summed below), four codes a round
    uint32_t count4[4][kSymbols] = {};
    {
        const uint8_t* sy = sym.data();
        std::size_t i = 0;
        for (; i + 4 <= n; i += 4) {
            ++count4[0][sy[i]];
            ++count4[1][sy[i + 1]];
            ++count4[2][sy[i + 2]];
            ++count4[3][sy[i + 3]];
        }
        for (; i < n; ++i) ++count4[i & 3][sy[i]];
    }
    // pass 1c: the other codes' raw bits, a group of four codes (<= 52 bits) at a time
    {
        const uint8_t* ex = extra.data();
        const uint16_t* lo = low.data();
        for (std::size_t i = done; i < n4; i += 4) {
            const uint32_t e0 = ex[i], e01 = e0 + ex[i + 1], e012 = e01 + ex[i + 2];
            sink.put(uint64_t(lo[i]) | uint64_t(lo[i + 1]) << e0 | uint64_t(lo[i + 2]) << e01 | uint64_t(lo[i + 3]) << e012,
                     e012 + ex[i + 3]);
        }
        if (sink.have > 0) sink.bp[sink.nbytes++] = uint8_t(sink.acc);
        nbits = sink.nbytes;
    }
    std::array<uint64_t, kSymbols> count{};
    for (int s = 0; s < kSymbols; ++s) count[s] = uint64_t(count4[0][s]) + count4[1][s] + count4[2][s] + count4[3][s];
    f = normalise(count, n, states == kLanes ? kProb12 : kProb);
    cum = {};
    for (int s = 1; s < kSymbols; ++s) cum[s] = cum[s - 1] + f[s - 1];
    buf.resize(2 * n + 4 * kLanes + 8);  // <= 2 bytes per code (<= 14 bits, or one word), the states, put's slack
}

void SegmentCoder::emit(const uint16_t* codes, int states, const uint8_t* ptr, std::vector<uint8_t>& out) {
    const std::size_t rans_len = std::size_t(end() - ptr);
    std::vector<uint8_t> h;
    h.push_back(states == kLanes ? kModeRans16 : states == 2 ? kModeRans2 : kModeRans4);
    put_varint(h, rans_len);
    put_varint(h, nbits);
    int used = kSymbols;
    while (used > 0 && f[used - 1] == 0) --used;
    put_varint(h, uint64_t(used));
    for (int s = 0; s < used; ++s) put_varint(h, f[s]);
    if (h.size() + rans_len + nbits >= 1 + 2 * n) {  // raw is no larger
        out.push_back(kModeRaw);
        const std::size_t at = out.size();
        out.resize(at + 2 * n);
        codes_to_bytes(codes, n, out.data() + at);
        return;
    }
    out.insert(out.end(), h.begin(), h.end());
    out.insert(out.end(), ptr, ptr + rans_len);
    out.insert(out.end(), bits.data(), bits.data() + nbits);
}

void segment_encode(const uint16_t* codes, std::size_t n, std::vector<uint8_t>& out, int states) {
    if (states == 0) {  // mode 3, or mode 2 for a short segment where its 48 fewer state bytes win
        if (n > kBothBelow) return segment_encode(codes, n, out, kLanes);
        thread_local std::vector<uint8_t> four;
        four.clear();
        segment_encode(codes, n, four, 4);
        const std::size_t at = out.size();
        segment_encode(codes, n, out, kLanes);
        if (four.size() < out.size() - at) {
            out.resize(at);
            out.insert(out.end(), four.begin(), four.end());
        }
        return;
    }
    if (states != 2 && states != 4 && states != kLanes) throw std::invalid_argument("segment_encode: states must be 0, 2, 4 or 16");
    if (n == 0) { out.push_back(kModeRaw); return; }
    thread_local SegmentCoder c;  // reused: one segment at a time per thread
    c.prepare(codes, n, states);
    const uint8_t* ptr = states == kLanes ? put_words(c.sym.data(), n, c.f, c.cum, c.end())
                         : states == 2    ? put_bytes<2>(c.sym.data(), n, c.f, c.cum, c.end())
                                          : put_bytes<4>(c.sym.data(), n, c.f, c.cum, c.end());
    c.emit(codes, states, ptr, out);
}

void segment_encode2(const uint16_t* const codes[2], const std::size_t n[2], std::vector<uint8_t>* const out[2]) {
#if defined(__x86_64__)
    if (n[0] > kBothBelow && n[1] > kBothBelow && active_isa() == Isa::AVX512) {  // both mode 3
        thread_local SegmentCoder c[2];
        for (int a = 0; a < 2; ++a) c[a].prepare(codes[a], n[a], kLanes);
        const uint8_t* const sym[2] = {c[0].sym.data(), c[1].sym.data()};
        const std::array<uint32_t, kSymbols> f[2] = {c[0].f, c[1].f}, cum[2] = {c[0].cum, c[1].cum};
        uint8_t* const end[2] = {c[0].end(), c[1].end()};
        uint8_t* first[2];
        put_words_x2(sym, n, f, cum, end, first);
        for (int a = 0; a < 2; ++a) c[a].emit(codes[a], kLanes, first[a], *out[a]);
        return;
    }
#endif
    for (int a = 0; a < 2; ++a) segment_encode(codes[a], n[a], *out[a]);
}

namespace {

/// One segment's decode tables. Modes 0 and 2: per symbol its frequency and start, per
/// slot its symbol. Mode 3: per slot one word, symbol | freq << 7 | (slot - start) << 20
/// (7 + 13 + 12 bits), so that one (vector) gather serves a code.
struct Dec { uint32_t freq, cum; };
struct Tables {
    Dec dec[kSymbols];
    uint8_t lk[kProb];
    alignas(64) uint32_t w[kProb12];
};

/// A parsed rANS segment: its state count (2: format version 2's mode, 4, kLanes) and streams.
struct Parsed {
    int S = 0;
    const uint8_t* rp = nullptr;    ///< the rANS bytes [rp, rend), its S initial states first
    const uint8_t* rend = nullptr;  ///< and the raw low bits [rend, rend + bits_len)
    uint64_t bits_len = 0;
};

/// Parse the header of the segment [p, p + size) of n codes and fill its tables; false for
/// a raw segment, which is then decoded already. Throws (Cursor::bad) when the header is
/// invalid.
bool parse(const uint8_t* p, std::size_t size, std::size_t n, uint16_t* codes, Tables& t, Parsed& h) {
    Cursor c{p, p + size};
    if (size == 0) Cursor::bad("empty");
    const uint8_t mode = *c.p++;
    if (mode == kModeRaw) {
        if (std::size_t(c.end - c.p) != 2 * n) Cursor::bad("raw size mismatch");
        codes_from_bytes(c.p, n, codes);
        return false;
    }
    if (mode != kModeRans2 && mode != kModeRans4 && mode != kModeRans16) Cursor::bad("unknown mode");
    h.S = mode == kModeRans2 ? 2 : mode == kModeRans4 ? 4 : kLanes;
    const uint32_t total = h.S == kLanes ? kProb12 : kProb;
    const uint64_t rans_len = c.varint(), bits_len = c.varint(), used = c.varint();
    if (used == 0 || used > uint64_t(kSymbols)) Cursor::bad("bad symbol count");
    std::array<uint32_t, kSymbols> f{}, cum{};
    uint64_t sum = 0;
    for (uint64_t s = 0; s < used; ++s) {
        const uint64_t x = c.varint();
        if (x > total) Cursor::bad("bad frequency");
        f[std::size_t(s)] = uint32_t(x);
        sum += x;
    }
    if (sum != total) Cursor::bad("frequencies do not sum to the table size");
    for (int s = 1; s < kSymbols; ++s) cum[s] = cum[s - 1] + f[s - 1];
    const std::size_t rest = std::size_t(c.end - c.p);
    if (rans_len < uint64_t(4 * h.S) || rans_len > rest || bits_len != rest - rans_len)
        Cursor::bad("stream sizes do not match the segment");
    if (h.S == kLanes) {
        uint32_t* const w = t.w;
        for (int s = 0; s < kSymbols; ++s) {  // slot j of s: s | f << 7 | (j - cum) << 20, as K + j 2^20 (mod 2^32)
            const uint32_t k = (uint32_t(s) | f[s] << 7) - (cum[s] << 20);
            for (uint32_t j = cum[s]; j < cum[s] + f[s]; ++j) w[j] = k + (j << 20);
        }
    } else {
        for (int s = 0; s < kSymbols; ++s) {
            t.dec[s] = {f[s], cum[s]};
            std::memset(t.lk + cum[s], s, f[s]);
        }
    }
    h.rp = c.p;
    h.rend = c.p + rans_len;
    h.bits_len = bits_len;
    return true;
}

uint32_t load32(const uint8_t* q) { return uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24; }

/// One rANS decode step of a state x in [2^23, 2^31) (its symbol into *sym), then its
/// renormalisation from the byte pointer r, unchecked: r must have 4 bytes left (2 are
/// used at most; the read is one 4-byte load). The state stays in [2^23, 2^31) whatever
/// the bytes: the decoded y = freq (x >> 14) + (slot - cum), with 0 <= slot - cum < freq
/// (parse checks that the frequencies sum to 2^14, so the slot table is consistent), lies
/// in [2^9, 2^31), and renormalising shifts bytes in only while y < 2^23: y < 2^23 needs
/// one byte, y < 2^15 two, so the shift is `bits` = 8 * ((lz - 1) / 8) for lz, y's leading
/// zeros (1..22). decode_rans refuses initial states outside the range, so this holds by
/// induction, for damaged segments too. The next 4 bytes, big-endian, go below y and the
/// 64-bit pair shifts left by `bits`: its top half is x with the bytes needed shifted in
/// (the others fall off). No branch on the data (its pattern is random; a select would
/// become one): this loop is bound by operation count, and this form takes about 22 per
/// code (lzcnt, a load and a byte swap, 4 shifts and ors) where two loads per byte, bsr and
/// two compares took about 28.
[[gnu::always_inline]] inline void step_fast(const Tables& t, uint32_t& x, const uint8_t*& r, uint8_t* sym) {
    const uint32_t slot = x & (kProb - 1);
    const uint8_t sy = t.lk[slot];
    const Dec d = t.dec[sy];
    const uint32_t y = d.freq * (x >> kProbBits) + slot - d.cum;
    *sym = sy;
    const uint32_t lz1 = uint32_t(std::countl_zero(y)) - 1;  // 0..21
    uint32_t w;
    std::memcpy(&w, r, 4);
    if constexpr (std::endian::native == std::endian::little) w = __builtin_bswap32(w);  // r[0] on top
    x = uint32_t(((uint64_t(y) << 32 | w) << (lz1 & 24)) >> 32);
    r += lz1 >> 3;
}

#if defined(__x86_64__)
CKPT_AVX512_WARNINGS_OFF
/// raw_bits' fast rounds with AVX-512, 16 codes a round from code 0: each code's raw bit
/// count and base (join_body's arithmetic), its bit position (a prefix sum across the
/// lanes, in 4 shifted adds), then its bits from one 64-byte window of the stream loaded
/// per round at the round's first 32-bit word: each lane permutes in the word that holds
/// its position and the next one, and funnel-shifts them (<= 13 bits at a shift <= 31;
/// a shift by 32 gives 0). A round spans <= 31 + 15 * 13 + 13 bits: words 0..8 of the
/// window. Permutes instead of a gather, which was slower
/// (docs/benchmarks.md, "Measurements behind the code's choices").
/// Runs while the window lies in the stream. Returns the codes done; *pos: the bit
/// position after them. The same codes as the scalar loop (test_rans compares the levels).
__attribute__((target(CKPT_TARGET_AVX512), noinline)) std::size_t
raw_bits_avx512(const uint8_t* sym, std::size_t n, const uint8_t* bp, uint64_t bits_len, uint16_t* codes, uint64_t* pos) {
    const __m512i c32 = _mm512_set1_epi32(32), c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4),
                  c31 = _mm512_set1_epi32(31), one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
    uint64_t at = 0;
    std::size_t i = 0;
    for (; n - i >= 16 && (at >> 5) * 4 + 64 <= bits_len; i += 16) {
        const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sym + i)));
        const __mmask16 big = _mm512_cmpge_epu32_mask(s, c32);
        const __m512i t = _mm512_sub_epi32(s, c32);
        const __m512i e = _mm512_maskz_add_epi32(big, _mm512_srli_epi32(t, 2), c3);  // nb - 3 raw bits
        const __m512i base = _mm512_mask_mov_epi32(s, big, _mm512_sllv_epi32(_mm512_or_si512(c4, _mm512_and_si512(t, c3)), e));
        __m512i incl = e;  // inclusive prefix sum: lane j += lane j - 1, j - 2, j - 4, j - 8
        incl = _mm512_add_epi32(incl, _mm512_alignr_epi32(incl, zero, 15));
        incl = _mm512_add_epi32(incl, _mm512_alignr_epi32(incl, zero, 14));
        incl = _mm512_add_epi32(incl, _mm512_alignr_epi32(incl, zero, 12));
        incl = _mm512_add_epi32(incl, _mm512_alignr_epi32(incl, zero, 8));
        const __m512i win = _mm512_loadu_si512(bp + (at >> 5) * 4);
        const __m512i rel = _mm512_add_epi32(_mm512_set1_epi32(int(at & 31)), _mm512_sub_epi32(incl, e));
        const __m512i w = _mm512_srli_epi32(rel, 5), sh = _mm512_and_si512(rel, c31);
        const __m512i lo = _mm512_permutexvar_epi32(w, win), hi = _mm512_permutexvar_epi32(_mm512_add_epi32(w, one), win);
        const __m512i g = _mm512_or_si512(_mm512_srlv_epi32(lo, sh), _mm512_sllv_epi32(hi, _mm512_sub_epi32(c32, sh)));
        const __m512i val = _mm512_and_si512(g, _mm512_sub_epi32(_mm512_sllv_epi32(one, e), one));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), _mm512_cvtepi32_epi16(_mm512_or_si512(base, val)));
        at += uint32_t(_mm_extract_epi32(_mm512_extracti32x4_epi32(incl, 3), 3));
    }
    *pos = at;
    return i;
}

CKPT_AVX512_WARNINGS_ON

/// raw_bits_avx512 with AVX2: 8 codes a round, the prefix sum within each 128-bit half and
/// then across, a 32-byte window (a round spans <= 31 + 7 * 13 + 13 bits: words 0..4).
__attribute__((target(CKPT_TARGET_AVX2), noinline)) std::size_t
raw_bits_avx2(const uint8_t* sym, std::size_t n, const uint8_t* bp, uint64_t bits_len, uint16_t* codes, uint64_t* pos) {
    const __m256i c32 = _mm256_set1_epi32(32), c3 = _mm256_set1_epi32(3), c4 = _mm256_set1_epi32(4),
                  c31 = _mm256_set1_epi32(31), one = _mm256_set1_epi32(1),
                  lane3 = _mm256_set1_epi32(3);
    uint64_t at = 0;
    std::size_t i = 0;
    for (; n - i >= 8 && (at >> 5) * 4 + 32 <= bits_len; i += 8) {
        const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sym + i)));
        const __m256i big = _mm256_cmpgt_epi32(s, c31);
        const __m256i t = _mm256_sub_epi32(s, c32);
        const __m256i e = _mm256_and_si256(big, _mm256_add_epi32(_mm256_srli_epi32(t, 2), c3));
        const __m256i base = _mm256_blendv_epi8(s, _mm256_sllv_epi32(_mm256_or_si256(c4, _mm256_and_si256(t, c3)), e), big);
        __m256i incl = _mm256_add_epi32(e, _mm256_slli_si256(e, 4));
        incl = _mm256_add_epi32(incl, _mm256_slli_si256(incl, 8));
        incl = _mm256_add_epi32(incl, _mm256_blend_epi32(_mm256_setzero_si256(), _mm256_permutevar8x32_epi32(incl, lane3), 0xf0));
        const __m256i win = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + (at >> 5) * 4));
        const __m256i rel = _mm256_add_epi32(_mm256_set1_epi32(int(at & 31)), _mm256_sub_epi32(incl, e));
        const __m256i w = _mm256_srli_epi32(rel, 5), sh = _mm256_and_si256(rel, c31);
        const __m256i lo = _mm256_permutevar8x32_epi32(win, w), hi = _mm256_permutevar8x32_epi32(win, _mm256_add_epi32(w, one));
        const __m256i g = _mm256_or_si256(_mm256_srlv_epi32(lo, sh), _mm256_sllv_epi32(hi, _mm256_sub_epi32(c32, sh)));
        const __m256i val = _mm256_and_si256(g, _mm256_sub_epi32(_mm256_sllv_epi32(one, e), one));
        const __m256i c = _mm256_or_si256(base, val);  // < 2^16: packus keeps it
        const __m256i c16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(c, c), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm256_castsi256_si128(c16));
        at += uint32_t(_mm256_extract_epi32(incl, 7));
    }
    *pos = at;
    return i;
}
#endif

/// Pass 2 of a rANS segment, after pass 1 decoded its symbols sym[0..n): each code's raw
/// low bits, LSB first, from [h.rend, h.rend + h.bits_len). The AVX-512 or AVX2 rounds
/// (raw_bits_avx512) go first; then each symbol's raw bit count and base value come from
/// join_body (vectorised); while 8 bytes can be read at pos / 8, one
/// unaligned load serves four codes (<= 52 bits at a shift <= 7); the end of the stream
/// goes code by code, byte by byte. Throws (Cursor::bad) on a truncated or inconsistent
/// stream.
void raw_bits(const Parsed& h, const uint8_t* sym, std::size_t n, uint16_t* codes) {
    const uint8_t* bp = h.rend;
    const uint64_t bits_len = h.bits_len, nb = bits_len * 8;
    uint64_t pos = 0;
#if defined(__x86_64__)
    {  // the vector rounds first (their codes are final), then the scalar loops from there
        std::size_t done = 0;
        if (active_isa() == Isa::AVX512) done = raw_bits_avx512(sym, n, bp, bits_len, codes, &pos);
        else if (active_isa() == Isa::AVX2) done = raw_bits_avx2(sym, n, bp, bits_len, codes, &pos);
        sym += done, codes += done, n -= done;
    }
#endif
    thread_local std::vector<uint8_t> extra_buf;
    thread_local std::vector<uint16_t> base_buf;
    extra_buf.resize(n);
    base_buf.resize(n);
    const uint8_t* ex = extra_buf.data();
    const uint16_t* bs = base_buf.data();
    join_body<void>(sym, n, extra_buf.data(), base_buf.data());
    std::size_t i = 0;
    if (bits_len >= 8) {
        const uint64_t fast_end = (bits_len - 8) * 8;  // a load at pos / 8 stays inside while pos <= fast_end
        for (; i + 4 <= n && pos <= fast_end; i += 4) {
            uint64_t w;
            std::memcpy(&w, bp + (pos >> 3), 8);
            w >>= (pos & 7);
            for (int k = 0; k < 4; ++k) {
                const uint32_t e = ex[i + std::size_t(k)];
                codes[i + std::size_t(k)] = uint16_t(bs[i + std::size_t(k)] | (uint32_t(w) & ((1u << e) - 1)));  // one bzhi (BMI2)
                w >>= e;
                pos += e;
            }
        }
    }
    for (; i < n; ++i) {
        if (pos + ex[i] > nb) Cursor::bad("raw bits truncated");
        uint32_t v = 0;
        for (uint32_t b = 0; b < ex[i]; ++b, ++pos) v |= uint32_t((bp[pos >> 3] >> (pos & 7)) & 1) << b;
        codes[i] = uint16_t(bs[i] | v);
    }
    // every byte used, and the last one's unused high bits zero
    if ((pos + 7) / 8 != bits_len || (pos & 7 && bp[pos >> 3] >> (pos & 7))) Cursor::bad("trailing or inconsistent data");
}

/// The rest of pass 1 of a mode 0 or 2 segment from code `from` on (after decode_rans's
/// fast rounds), checked byte by byte, and the final-state checks. Throws (Cursor::bad)
/// on a truncated or inconsistent stream.
template <int S>
void finish_bytes(const Tables& t, const Parsed& h, uint8_t* sym, std::size_t n, uint32_t (&xs)[S], const uint8_t* r,
                  std::size_t from) {
    for (std::size_t i = from; i < n; i += S)
        for (int k = 0; k < S; ++k) {
            if (i + std::size_t(k) >= n) break;
            uint32_t& x = xs[k];
            const uint32_t slot = x & (kProb - 1);
            const uint8_t sy = t.lk[slot];
            x = t.dec[sy].freq * (x >> kProbBits) + slot - t.dec[sy].cum;
            sym[i + std::size_t(k)] = sy;
            while (x < kLow) {
                if (r == h.rend) Cursor::bad("rANS stream truncated");
                x = (x << 8) | *r++;
            }
        }
    for (int k = 0; k < S; ++k)
        if (xs[k] != kLow) Cursor::bad("trailing or inconsistent data");
    if (r != h.rend) Cursor::bad("trailing or inconsistent data");
}

/// segment_decode for S states, after parse filled t and h. Pass 1's fast rounds run here,
/// while a whole round of S codes is left and 2 bytes per state plus step_fast's 2 bytes
/// of overread, then finish_bytes and raw_bits.
/// The states and byte pointer are locals indexed by constants (scalars after unrolling,
/// so in registers: the byte stores to sym could alias anything whose address escapes). A
/// segment's states form one serial chain (each state's bytes start where the state before
/// it stopped); interleaving two segments' rounds was measured and lost: 8
/// states do not fit x86-64's 16 registers, and the spilled states cost more than the
/// overlap gained.
template <int S>
void decode_rans(const Parsed& h, const Tables& t, std::size_t n, uint16_t* codes) {
    thread_local std::vector<uint8_t> sym_buf;
    sym_buf.resize(n);
    uint8_t* const sym = sym_buf.data();
    uint32_t x[S];
    for (int k = 0; k < S; ++k) {
        x[k] = load32(h.rp + 4 * k);
        if (x[k] < kLow || x[k] >> 31) Cursor::bad("trailing or inconsistent data");  // no encoder writes it (step_fast)
    }
    const uint8_t* r = h.rp + 4 * S;
    std::size_t i = 0;
    for (;;) {  // in blocks of rounds that surely have their bytes: no check per round
        const std::size_t left = std::size_t(h.rend - r);
        const std::size_t rounds = left < 2 ? 0 : std::min((n - i) / S, (left - 2) / (2 * S));
        if (rounds == 0) break;
        for (const std::size_t end = i + rounds * S; i < end; i += S) {
#pragma GCC unroll 4
            for (int k = 0; k < S; ++k) step_fast(t, x[k], r, sym + i + std::size_t(k));
        }
    }
    finish_bytes<S>(t, h, sym, n, x, r, i);
    raw_bits(h, sym, n, codes);
}

/// One mode-3 decode step of a state x in [2^16, 2^32) through the slot words w (Tables::w):
/// its symbol into *sym, and y = freq (x >> 12) + (slot - start), before renormalisation.
/// y < 2^32 (slot - start < freq) and y >= 16 (x >> 12 >= 16), so one word (y < 2^16:
/// y = y << 16 | word) brings it back to [2^20, 2^32): whatever the bytes, every state
/// stays in range and takes at most one word a step.
[[gnu::always_inline]] inline uint32_t step_word(const uint32_t* w, uint32_t x, uint8_t* sym) {
    const uint32_t e = w[x & (kProb12 - 1)];
    *sym = uint8_t(e & 127);
    return ((e >> 7) & 0x1fff) * (x >> kProbBits12) + (e >> 20);
}

/// The little-endian 16-bit word at q.
uint32_t load16(const uint8_t* q) {
    if constexpr (std::endian::native == std::endian::little) {
        uint16_t v;
        std::memcpy(&v, q, 2);
        return v;
    }
    return uint32_t(q[0]) | uint32_t(q[1]) << 8;
}

/// Mode 3's fast rounds: from code 0, whole rounds of kLanes codes while the round's
/// words (<= 2 kLanes bytes) surely lie in [r, rend); no other check. x: the kLanes
/// states, r: the word pointer, both updated. Returns the codes decoded. Lane k of a round
/// decodes code i + k, then reads its word if it needs one, lanes in order: so the vector
/// forms below gather every lane's slot word at once, and hand the words at r to the
/// lanes that need them in lane order (AVX-512's expand; AVX2's permutation from a table
/// indexed by the lane mask), with the same results as this scalar form.
std::size_t words_scalar(const uint32_t* w, uint32_t* x, const uint8_t*& r, const uint8_t* rend, uint8_t* sym,
                         std::size_t n) {
    std::size_t i = 0;
    const uint8_t* p = r;
    uint32_t xs[kLanes];  // local (x could alias sym): indexed by constants once unrolled
    std::memcpy(xs, x, sizeof xs);
    for (; n - i >= std::size_t(kLanes) && rend - p >= 2 * kLanes; i += kLanes) {
#pragma GCC unroll 16
        for (int k = 0; k < kLanes; ++k) {
            const uint32_t y = step_word(w, xs[k], sym + i + std::size_t(k));
            const uint32_t c = uint32_t(y < kLow16);
            // arithmetic, with the word read whether needed or not: GCC makes a select here
            // a branch on the data, which mispredicts
            xs[k] = y << (c << 4) | (load16(p) & (0u - c));
            p += 2 * c;
        }
    }
    std::memcpy(x, xs, sizeof xs);
    r = p;
    return i;
}

#if defined(__x86_64__)
CKPT_AVX512_WARNINGS_OFF
/// One round of words_scalar with one AVX-512 vector of 16 states X: gather, multiply,
/// expand; the 16 symbols into sym[0..16), the words from p (p advances; it must have 32
/// bytes left).
__attribute__((target(CKPT_TARGET_AVX512), always_inline)) inline void words_round_avx512(const uint32_t* w, __m512i& X,
                                                                                          const uint8_t*& p, uint8_t* sym) {
    const __m512i e = _mm512_i32gather_epi32(_mm512_and_si512(X, _mm512_set1_epi32(kProb12 - 1)), w, 4);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sym), _mm512_cvtepi32_epi8(_mm512_and_si512(e, _mm512_set1_epi32(127))));
    const __m512i f = _mm512_and_si512(_mm512_srli_epi32(e, 7), _mm512_set1_epi32(0x1fff));
    const __m512i y = _mm512_add_epi32(_mm512_mullo_epi32(f, _mm512_srli_epi32(X, kProbBits12)), _mm512_srli_epi32(e, 20));
    const __mmask16 m = _mm512_cmplt_epu32_mask(y, _mm512_set1_epi32(int(kLow16)));
    const __m512i words = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    X = _mm512_mask_or_epi32(y, m, _mm512_slli_epi32(y, 16), _mm512_maskz_expand_epi32(m, words));
    p += 2 * __builtin_popcount(m);
}

/// words_scalar with one AVX-512 vector of 16 states (words_round_avx512).
__attribute__((target(CKPT_TARGET_AVX512), noinline)) std::size_t
words_avx512(const uint32_t* w, uint32_t* x, const uint8_t*& r, const uint8_t* rend, uint8_t* sym, std::size_t n) {
    static_assert(kLanes == 16);
    __m512i X = _mm512_loadu_si512(x);
    const uint8_t* p = r;
    std::size_t i = 0;
    for (; n - i >= 16 && rend - p >= 32; i += 16) words_round_avx512(w, X, p, sym + i);
    _mm512_storeu_si512(x, X);
    r = p;
    return i;
}

/// words_avx512 over two segments at once (a = 0, 1: tables w[a], states x[a], words from
/// r[a] up to rend[a], symbols into sym[a]), a round of each in turn while both have a
/// whole round of their first n codes left: a round is one chain of dependent operations
/// (gather, multiply, compare, expand) through the 16 states, and the two segments' chains
/// overlap. The same symbols, states and pointers as words_avx512 on each (the same
/// rounds). Returns the codes decoded in each.
__attribute__((target(CKPT_TARGET_AVX512), noinline)) std::size_t
words_avx512_x2(const uint32_t* const* w, uint32_t (*x)[kLanes], const uint8_t** r, const uint8_t* const* rend,
                uint8_t* const* sym, std::size_t n) {
    __m512i X0 = _mm512_loadu_si512(x[0]), X1 = _mm512_loadu_si512(x[1]);
    const uint8_t *p0 = r[0], *p1 = r[1];
    std::size_t i = 0;
    for (; n - i >= 16 && rend[0] - p0 >= 32 && rend[1] - p1 >= 32; i += 16) {
        words_round_avx512(w[0], X0, p0, sym[0] + i);
        words_round_avx512(w[1], X1, p1, sym[1] + i);
    }
    _mm512_storeu_si512(x[0], X0);
    _mm512_storeu_si512(x[1], X1);
    r[0] = p0;
    r[1] = p1;
    return i;
}

CKPT_AVX512_WARNINGS_ON

/// For AVX2's expand: lane j of a mask m takes the word numbered popcount(m & (2^j - 1)).
struct ExpandTable {
    alignas(32) uint32_t idx[256][8];
};
constexpr ExpandTable make_expand_table() {
    ExpandTable t{};
    for (int m = 0; m < 256; ++m)
        for (int j = 0, c = 0; j < 8; ++j)
            if (m >> j & 1) t.idx[m][j] = uint32_t(c++);
    return t;
}
constexpr ExpandTable kExpand = make_expand_table();

#define CKPT_AVX2_TARGET(...) __attribute__((target(CKPT_TARGET_AVX2), __VA_ARGS__))
/// One AVX2 half-round of words_avx2: the 8 states X decode one code each and take their
/// words from p in lane order (p advances). Returns their slot words' symbols (u32 lanes).
CKPT_AVX2_TARGET(always_inline) inline __m256i words_half_avx2(const uint32_t* w, __m256i& X, const uint8_t*& p) {
    const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(w), _mm256_and_si256(X, _mm256_set1_epi32(kProb12 - 1)), 4);
    const __m256i f = _mm256_and_si256(_mm256_srli_epi32(e, 7), _mm256_set1_epi32(0x1fff));
    const __m256i y = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(X, kProbBits12)), _mm256_srli_epi32(e, 20));
    const __m256i c = _mm256_cmpeq_epi32(_mm256_srli_epi32(y, 16), _mm256_setzero_si256());  // y < 2^16
    const unsigned m = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(c)));
    const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i fed = _mm256_permutevar8x32_epi32(words, _mm256_load_si256(reinterpret_cast<const __m256i*>(kExpand.idx[m])));
    X = _mm256_blendv_epi8(y, _mm256_or_si256(_mm256_slli_epi32(y, 16), fed), c);
    p += 2 * __builtin_popcount(m);
    return _mm256_and_si256(e, _mm256_set1_epi32(127));
}

/// words_scalar with two AVX2 vectors of 8 states (lanes 0-7, then 8-15, which read their
/// words after the first half's).
CKPT_AVX2_TARGET(noinline) std::size_t words_avx2(const uint32_t* w, uint32_t* x, const uint8_t*& r, const uint8_t* rend,
                                                          uint8_t* sym, std::size_t n) {
    static_assert(kLanes == 16);
    __m256i X0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    __m256i X1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8));
    const uint8_t* p = r;
    std::size_t i = 0;
    for (; n - i >= 16 && rend - p >= 32; i += 16) {
        const __m256i s0 = words_half_avx2(w, X0, p), s1 = words_half_avx2(w, X1, p);
        // the 16 symbols as bytes, in lane order: pack to u16 (lanes 0-3 8-11 | 4-7 12-15), reorder, pack to u8
        const __m256i s16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(s0, s1), 0xd8);
        const __m256i s8 = _mm256_permute4x64_epi64(_mm256_packus_epi16(s16, s16), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(sym + i), _mm256_castsi256_si128(s8));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), X0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 8), X1);
    r = p;
    return i;
}
#undef CKPT_AVX2_TARGET
#endif

/// Mode 3's initial states into x (each must be in [2^16, 2^32), as every encoder's are:
/// no encoder writes a smaller one, step_word); false when one is not.
bool words_init(const Parsed& h, uint32_t* x) {
    bool ok = true;
    for (int k = 0; k < kLanes; ++k) {
        x[k] = load32(h.rp + 4 * k);
        ok = ok && x[k] >= kLow16;
    }
    return ok;
}

/// The fast rounds of mode 3 for the active instruction set, from code i (a multiple of
/// kLanes) on: the codes decoded.
std::size_t words_fast(const Tables& t, uint32_t* x, const uint8_t*& r, const uint8_t* rend, uint8_t* sym, std::size_t n,
                       std::size_t i) {
#if defined(__x86_64__)
    switch (active_isa()) {
        case Isa::AVX512: return words_avx512(t.w, x, r, rend, sym + i, n - i);
        case Isa::AVX2: return words_avx2(t.w, x, r, rend, sym + i, n - i);
        case Isa::Baseline: break;
    }
#endif
    return words_scalar(t.w, x, r, rend, sym + i, n - i);
}

/// Mode 3's pass 1 from code i on (after the fast rounds: states x, words from r), checked
/// word by word; the final-state checks; then raw_bits.
void words_finish(const Parsed& h, const Tables& t, std::size_t n, uint16_t* codes, uint32_t* x, const uint8_t* r,
                  std::size_t i, uint8_t* sym) {
    for (; i < n; i += kLanes)
        for (int k = 0; k < kLanes && i + std::size_t(k) < n; ++k) {
            uint32_t y = step_word(t.w, x[k], sym + i + std::size_t(k));
            if (y < kLow16) {
                if (h.rend - r < 2) Cursor::bad("rANS stream truncated");
                y = y << 16 | load16(r);
                r += 2;
            }
            x[k] = y;
        }
    for (int k = 0; k < kLanes; ++k)
        if (x[k] != kLow16) Cursor::bad("trailing or inconsistent data");
    if (r != h.rend) Cursor::bad("trailing or inconsistent data");
    raw_bits(h, sym, n, codes);
}

/// Mode 3's pass 1 (format version 4): the initial states (words_init), the fast rounds
/// (words_fast), then words_finish.
void decode_words(const Parsed& h, const Tables& t, std::size_t n, uint16_t* codes) {
    thread_local std::vector<uint8_t> sym_buf;
    sym_buf.resize(n);
    uint8_t* const sym = sym_buf.data();
    alignas(64) uint32_t x[kLanes];
    if (!words_init(h, x)) Cursor::bad("trailing or inconsistent data");
    const uint8_t* r = h.rp + 4 * kLanes;
    const std::size_t i = words_fast(t, x, r, h.rend, sym, n, 0);
    words_finish(h, t, n, codes, x, r, i, sym);
}

/// A parsed rANS segment's pass 1 and 2 (decode_body after parse).
void decode_parsed(const Parsed& h, const Tables& t, std::size_t n, uint16_t* codes) {
    if (h.S == 2) decode_rans<2>(h, t, n, codes);
    else if (h.S == 4) decode_rans<4>(h, t, n, codes);
    else decode_words(h, t, n, codes);
}

/// segment_decode's body, compiled for each instruction-set level (decode_isa below):
/// integer code, the same codes on every level.
template <class>
void decode_body(const uint8_t* p, std::size_t size, std::size_t n, uint16_t* codes) {
    thread_local Tables t;
    Parsed h;
    if (!parse(p, size, n, codes, t, h)) return;  // raw: decoded
    decode_parsed(h, t, n, codes);
}

/// segment_decode2's body (decode_body for two segments): both parsed, then, when both
/// are mode 3 on AVX-512, their fast rounds interleaved (words_avx512_x2) before each is
/// finished on its own; otherwise one after the other. Either way the same codes, and the
/// same first error, as decode_body on segment 0 and then on segment 1.
template <class>
void decode_pair_body(const uint8_t* const* p, const std::size_t* size, const std::size_t* n, uint16_t* const* codes) {
    thread_local Tables t[2];
    Parsed h[2];
    const bool coded0 = parse(p[0], size[0], n[0], codes[0], t[0], h[0]);  // its error first
    bool coded1;
    try {
        coded1 = parse(p[1], size[1], n[1], codes[1], t[1], h[1]);
    } catch (...) {  // segment 0's own errors come first
        if (coded0) decode_parsed(h[0], t[0], n[0], codes[0]);
        throw;
    }
    alignas(64) uint32_t x[2][kLanes];
    const bool pair = coded0 && coded1 && h[0].S == kLanes && h[1].S == kLanes && active_isa() == Isa::AVX512 &&
                      words_init(h[0], x[0]) && words_init(h[1], x[1]);
    if (!pair) {
        if (coded0) decode_parsed(h[0], t[0], n[0], codes[0]);
        if (coded1) decode_parsed(h[1], t[1], n[1], codes[1]);
        return;
    }
#if defined(__x86_64__)
    thread_local std::vector<uint8_t> sym_buf[2];
    sym_buf[0].resize(n[0]);
    sym_buf[1].resize(n[1]);
    uint8_t* const sym[2] = {sym_buf[0].data(), sym_buf[1].data()};
    const uint32_t* const w[2] = {t[0].w, t[1].w};
    const uint8_t* r[2] = {h[0].rp + 4 * kLanes, h[1].rp + 4 * kLanes};
    const uint8_t* const rend[2] = {h[0].rend, h[1].rend};
    const std::size_t both = words_avx512_x2(w, x, r, rend, sym, std::min(n[0], n[1]));
    for (int a = 0; a < 2; ++a) {
        const std::size_t i = both + words_fast(t[a], x[a], r[a], h[a].rend, sym[a], n[a], both);
        words_finish(h[a], t[a], n[a], codes[a], x[a], r[a], i, sym[a]);
    }
#endif
}

struct RansTag {};  ///< CKPT_ISA_CLONES' template argument
CKPT_ISA_CLONES(decode_isa, decode_body)
CKPT_ISA_CLONES(decode_pair_isa, decode_pair_body)

}  // namespace

void segment_decode(const uint8_t* p, std::size_t size, std::size_t n, uint16_t* codes) {
    decode_isa<RansTag>(p, size, n, codes);
}

void segment_decode2(const uint8_t* const p[2], const std::size_t size[2], const std::size_t n[2], uint16_t* const codes[2]) {
    decode_pair_isa<RansTag>(p, size, n, codes);
}

}  // namespace ckpt::codec
