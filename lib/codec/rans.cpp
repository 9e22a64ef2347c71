#include "codec/rans.h"

#include "codec/isa.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace ckpt::codec {

namespace {

constexpr int kSymbols = 76;
constexpr uint32_t kProbBits = 14, kProb = 1u << kProbBits;
constexpr uint32_t kLow = 1u << 23;  ///< rANS state lower bound
/// Segment modes: rANS with two interleaved states (format version 2), raw, rANS with four
/// (version 3, written since).
enum : uint8_t { kModeRans2 = 0, kModeRaw = 1, kModeRans4 = 2 };

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

struct SplitTag {};  ///< CKPT_ISA_CLONES' template argument
CKPT_ISA_CLONES(split_isa, split_body)
CKPT_ISA_CLONES(join_isa, join_body)

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

/// Frequencies summing to kProb, >= 1 for every symbol that occurs (deterministic).
std::array<uint32_t, kSymbols> normalise(const std::array<uint64_t, kSymbols>& count, uint64_t n) {
    std::array<uint32_t, kSymbols> f{};
    int64_t sum = 0;
    int top = 0;
    for (int s = 0; s < kSymbols; ++s) {
        if (!count[s]) continue;
        f[s] = std::max<uint32_t>(1, uint32_t(count[s] * kProb / n));
        sum += f[s];
        if (count[s] > count[top]) top = s;
    }
    while (sum != kProb) {  // give the difference to (or take it from) the largest frequencies
        if (sum < kProb) { f[top] += uint32_t(kProb - sum); sum = kProb; break; }
        int big = -1;
        for (int s = 0; s < kSymbols; ++s)
            if (f[s] > 1 && (big < 0 || f[s] > f[big])) big = s;
        const uint32_t take = std::min<uint32_t>(f[big] - 1, uint32_t(sum - kProb));
        f[big] -= take;
        sum -= take;
    }
    return f;
}

}  // namespace

void segment_encode(const uint16_t* codes, std::size_t n, std::vector<uint8_t>& out, int states) {
    if (states != 2 && states != 4) throw std::invalid_argument("segment_encode: states must be 2 or 4");
    std::array<uint64_t, kSymbols> count{};
    thread_local std::vector<uint8_t> sym_buf, extra_buf, buf, bits_buf;  // reused: one segment at a time per thread
    thread_local std::vector<uint16_t> low_buf;
    const std::size_t n4 = (n + 3) / 4 * 4;
    sym_buf.resize(n4);
    extra_buf.resize(n4);
    low_buf.resize(n4);
    bits_buf.resize(2 * n + 16);
    uint8_t* sym = sym_buf.data();
    uint8_t* bits = bits_buf.data();
    // pass 1a (vectorised): symbols, raw bit counts and raw bits; the padding to whole
    // groups of 4 has no raw bits
    split_isa<SplitTag>(codes, n, sym, extra_buf.data(), low_buf.data());
    for (std::size_t i = n; i < n4; ++i) extra_buf[i] = 0, low_buf[i] = 0;
    // pass 1b: the counts, in four histograms (code i into i & 3: consecutive equal
    // symbols do not wait on each other's increment; summed below)
    uint32_t count4[4][kSymbols] = {};
    for (std::size_t i = 0; i < n; ++i) ++count4[i & 3][sym[i]];
    // pass 1c: the raw bits, LSB first, four codes (<= 52 bits) at a time. The writer is
    // branch-free: all 8 bytes of the accumulator are stored at the first byte not yet
    // complete, then the whole bytes are dropped (fewer than 8 bits stay pending).
    std::size_t nbits = 0;
    {
        const uint8_t* ex = extra_buf.data();
        const uint16_t* lo = low_buf.data();
        uint64_t acc = 0;
        uint32_t have = 0;
        for (std::size_t i = 0; i < n4; i += 4) {
            const uint32_t e0 = ex[i], e01 = e0 + ex[i + 1], e012 = e01 + ex[i + 2];
            acc |= (uint64_t(lo[i]) | uint64_t(lo[i + 1]) << e0 | uint64_t(lo[i + 2]) << e01 | uint64_t(lo[i + 3]) << e012)
                   << have;
            have += e012 + ex[i + 3];
            std::memcpy(bits + nbits, &acc, 8);  // little-endian: byte b holds bits 8b..8b+7
            nbits += std::size_t(have >> 3);
            acc >>= (have & ~7u);
            have &= 7;
        }
        if (have > 0) bits[nbits++] = uint8_t(acc);
    }
    for (int s = 0; s < kSymbols; ++s) count[s] = uint64_t(count4[0][s]) + count4[1][s] + count4[2][s] + count4[3][s];
    if (n == 0) { out.push_back(kModeRaw); return; }
    const auto f = normalise(count, n);
    std::array<uint32_t, kSymbols> cum{};
    for (int s = 1; s < kSymbols; ++s) cum[s] = cum[s - 1] + f[s - 1];
    // rANS, last code first, written backwards. x' = (x / f) 2^14 + x mod f + cum, with the
    // division by f done as a multiplication by its reciprocal (ryg_rans RansEncSymbolInit /
    // RansEncPutSymbol: exact for every 32-bit state).
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
    buf.resize(2 * n + 24);  // < 14 bits per symbol, 16 state bytes, and put()'s 2 bytes of slack
    uint8_t* ptr = buf.data() + buf.size();
    // S interleaved states: code i goes through state i mod S (ryg_rans's interleaving),
    // so the decoder's S dependency chains overlap.
    // The states live in a local array indexed by compile-time constants only (the loops
    // over k are unrolled), so they stay in registers: the byte stores below could alias
    // anything whose address escapes.
    auto put_all = [&](auto SC) {  // SC: the state count as a compile-time constant
        constexpr int S = decltype(SC)::value;
        const Enc* et = enc.data();
        uint8_t* p = ptr;
        uint32_t xs[S];
        for (int k = 0; k < S; ++k) xs[k] = kLow;
        auto put = [&](uint32_t& st, uint8_t sy) {
            const Enc& e = et[sy];
            // renormalise: 0, 1 or 2 bytes out (st < 2^31 and xmax >= 2^17), branch-free
            const int k = int(st >= e.xmax) + int((st >> 8) >= e.xmax);
            p[-1] = uint8_t(st);
            p[-2] = uint8_t(st >> 8);
            p -= k;
            st >>= 8 * k;
            const uint32_t q = uint32_t((uint64_t(st) * e.rcp) >> 32) >> e.shift;
            st = st + e.bias + q * e.cmpl;
        };
        // last code first: the n mod S codes of the incomplete last round, then whole rounds
        const std::size_t full = n / S * S;
        for (int k = S - 1; k >= 0; --k)
            if (full + std::size_t(k) < n) put(xs[k], sym[full + std::size_t(k)]);
        for (std::size_t i = full; i > 0;) {
            i -= S;
            for (int k = S - 1; k >= 0; --k) put(xs[k], sym[i + std::size_t(k)]);
        }
        for (int k = S - 1; k >= 0; --k) {  // state 0 first in the stream
            p -= 4;
            for (int b = 0; b < 4; ++b) p[b] = uint8_t(xs[k] >> (8 * b));
        }
        ptr = p;
    };
    if (states == 2) put_all(std::integral_constant<int, 2>{});
    else put_all(std::integral_constant<int, 4>{});
    const std::size_t rans_len = std::size_t(buf.data() + buf.size() - ptr);
    std::vector<uint8_t> head;
    head.push_back(states == 2 ? kModeRans2 : kModeRans4);
    put_varint(head, rans_len);
    put_varint(head, nbits);
    int used = kSymbols;
    while (used > 0 && f[used - 1] == 0) --used;
    put_varint(head, uint64_t(used));
    for (int s = 0; s < used; ++s) put_varint(head, f[s]);
    if (head.size() + rans_len + nbits >= 1 + 2 * n) {  // raw is no larger
        out.push_back(kModeRaw);
        const std::size_t at = out.size();
        out.resize(at + 2 * n);
        codes_to_bytes(codes, n, out.data() + at);
        return;
    }
    out.insert(out.end(), head.begin(), head.end());
    out.insert(out.end(), ptr, ptr + rans_len);
    out.insert(out.end(), bits, bits + nbits);
}

void segment_decode(const uint8_t* p, std::size_t size, std::size_t n, uint16_t* codes) {
    Cursor c{p, p + size};
    if (size == 0) Cursor::bad("empty");
    const uint8_t mode = *c.p++;
    if (mode == kModeRaw) {
        if (std::size_t(c.end - c.p) != 2 * n) Cursor::bad("raw size mismatch");
        codes_from_bytes(c.p, n, codes);
        return;
    }
    if (mode != kModeRans2 && mode != kModeRans4) Cursor::bad("unknown mode");
    const int S = mode == kModeRans2 ? 2 : 4;
    const uint64_t rans_len = c.varint(), bits_len = c.varint(), used = c.varint();
    if (used == 0 || used > uint64_t(kSymbols)) Cursor::bad("bad symbol count");
    std::array<uint32_t, kSymbols> f{}, cum{};
    uint64_t sum = 0;
    for (uint64_t s = 0; s < used; ++s) {
        const uint64_t v = c.varint();
        if (v > kProb) Cursor::bad("bad frequency");
        f[std::size_t(s)] = uint32_t(v);
        sum += v;
    }
    if (sum != kProb) Cursor::bad("frequencies do not sum to 2^14");
    for (int s = 1; s < kSymbols; ++s) cum[s] = cum[s - 1] + f[s - 1];
    const std::size_t rest = std::size_t(c.end - c.p);
    if (rans_len < uint64_t(4 * S) || rans_len > rest || bits_len != rest - rans_len) Cursor::bad("stream sizes do not match the segment");
    // per symbol: frequency and start; per slot: its symbol
    struct Dec { uint32_t freq, cum; };
    std::array<Dec, kSymbols> dec{};
    for (int s = 0; s < kSymbols; ++s) dec[s] = {f[s], cum[s]};
    thread_local std::vector<uint8_t> lookup;
    lookup.resize(kProb);
    for (int s = 0; s < kSymbols; ++s) std::fill(lookup.begin() + cum[s], lookup.begin() + cum[s] + f[s], uint8_t(s));
    const uint8_t* rp = c.p;
    const uint8_t* rend = c.p + rans_len;
    auto load32 = [](const uint8_t* q) { return uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24; };
    // Pass 1: the symbols, into sym[]. A decoded state is >= 2^9 (x >> 14 >= 2^9 and
    // freq >= 1), so it takes at most 2 bytes to get back above kLow. While 2 bytes per
    // state remain, each of the two steps reads a byte unconditionally and keeps it only
    // when needed: no branch on the data (its pattern is random); the last rounds take the
    // checked path. States, tables and the byte pointer are locals indexed by constants
    // (sym's byte stores could alias anything whose address escapes).
    thread_local std::vector<uint8_t> sym_buf;
    sym_buf.resize(n);
    uint8_t* const sym = sym_buf.data();
    const uint8_t* const lk = lookup.data();
    const Dec* const dt = dec.data();
    auto symbols = [&](auto SC) {  // SC: the state count as a compile-time constant
        constexpr int S = decltype(SC)::value;
        const uint8_t* r = rp;
        uint32_t xs[S];
        for (int k = 0; k < S; ++k) xs[k] = load32(r + 4 * k);
        r += 4 * S;
        auto step = [&](uint32_t& x) {
            const uint32_t slot = x & (kProb - 1);
            const uint8_t sy = lk[slot];
            const Dec& d = dt[sy];
            x = d.freq * (x >> kProbBits) + slot - d.cum;
            return sy;
        };
        std::size_t i = 0;
        for (; i + S <= n && rend - r >= 2 * S; i += S)
            for (int k = 0; k < S; ++k) {
                sym[i + std::size_t(k)] = step(xs[k]);
                // the byte count n comes from the state alone ((x << 8 | b) < 2^23 exactly when
                // x < 2^15), so the byte pointer's chain does not wait on the loads; both
                // bytes are read and shifted in as needed (arithmetic: a select becomes a branch)
                const uint32_t x = xs[k];
                const uint32_t nb = uint32_t(x < kLow) + uint32_t(x < (kLow >> 8));
                const uint32_t w = uint32_t(r[0]) << 8 | r[1];  // the next two bytes in stream order
                xs[k] = (x << (8 * nb)) | (w >> (16 - 8 * nb));
                r += nb;
            }
        for (; i < n; i += S)
            for (int k = 0; k < S; ++k) {
                if (i + std::size_t(k) >= n) break;
                sym[i + std::size_t(k)] = step(xs[k]);
                while (xs[k] < kLow) {
                    if (r == rend) Cursor::bad("rANS stream truncated");
                    xs[k] = (xs[k] << 8) | *r++;
                }
            }
        for (int k = 0; k < S; ++k)
            if (xs[k] != kLow) Cursor::bad("trailing or inconsistent data");
        if (r != rend) Cursor::bad("trailing or inconsistent data");
    };
    if (S == 2) symbols(std::integral_constant<int, 2>{});
    else symbols(std::integral_constant<int, 4>{});
    // Pass 2: each code's raw low bits, LSB first from the bit position pos. Each symbol's
    // raw bit count and base value (vectorised, join_body); then while 8 bytes can be read
    // at pos / 8, one unaligned load serves four codes (<= 52 bits at a shift <= 7); the
    // end of the stream goes code by code, byte by byte.
    thread_local std::vector<uint8_t> extra_buf;
    thread_local std::vector<uint16_t> base_buf;
    extra_buf.resize(n);
    base_buf.resize(n);
    const uint8_t* ex = extra_buf.data();
    const uint16_t* bs = base_buf.data();
    join_isa<SplitTag>(sym, n, extra_buf.data(), base_buf.data());
    const uint8_t* bp = rend;
    const uint64_t nb = bits_len * 8;
    uint64_t pos = 0;
    std::size_t i = 0;
    if (bits_len >= 8) {
        const uint64_t fast_end = (bits_len - 8) * 8;  // a load at pos / 8 stays inside while pos <= fast_end
        for (; i + 4 <= n && pos <= fast_end; i += 4) {
            uint64_t w;
            std::memcpy(&w, bp + (pos >> 3), 8);
            w >>= (pos & 7);
            for (int k = 0; k < 4; ++k) {
                const uint32_t e = ex[i + std::size_t(k)];
                codes[i + std::size_t(k)] = uint16_t(bs[i + std::size_t(k)] | (w & ((1u << e) - 1)));
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

}  // namespace ckpt::codec
