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
    // pass 1b: the counts, in four histograms (code i into i mod 4: consecutive equal
    // symbols do not wait on each other's increment; summed below), four codes a round
    uint32_t count4[4][kSymbols] = {};
    {
        std::size_t i = 0;
        for (; i + 4 <= n; i += 4) {
            ++count4[0][sym[i]];
            ++count4[1][sym[i + 1]];
            ++count4[2][sym[i + 2]];
            ++count4[3][sym[i + 3]];
        }
        for (; i < n; ++i) ++count4[i & 3][sym[i]];
    }
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

namespace {

/// One segment's decode tables: per symbol its frequency and start, per slot its symbol.
struct Dec { uint32_t freq, cum; };
struct Tables {
    Dec dec[kSymbols];
    uint8_t lk[kProb];
};

/// A parsed rANS segment: its state count (2: format version 2's mode, 4) and streams.
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
    if (mode != kModeRans2 && mode != kModeRans4) Cursor::bad("unknown mode");
    h.S = mode == kModeRans2 ? 2 : 4;
    const uint64_t rans_len = c.varint(), bits_len = c.varint(), used = c.varint();
    if (used == 0 || used > uint64_t(kSymbols)) Cursor::bad("bad symbol count");
    std::array<uint32_t, kSymbols> f{}, cum{};
    uint64_t sum = 0;
    for (uint64_t s = 0; s < used; ++s) {
        const uint64_t x = c.varint();
        if (x > kProb) Cursor::bad("bad frequency");
        f[std::size_t(s)] = uint32_t(x);
        sum += x;
    }
    if (sum != kProb) Cursor::bad("frequencies do not sum to 2^14");
    for (int s = 1; s < kSymbols; ++s) cum[s] = cum[s - 1] + f[s - 1];
    const std::size_t rest = std::size_t(c.end - c.p);
    if (rans_len < uint64_t(4 * h.S) || rans_len > rest || bits_len != rest - rans_len)
        Cursor::bad("stream sizes do not match the segment");
    for (int s = 0; s < kSymbols; ++s) {
        t.dec[s] = {f[s], cum[s]};
        std::memset(t.lk + cum[s], s, f[s]);
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

/// The rest of one segment from code i on (after decode_rans's fast rounds): pass 1's last rounds,
/// checked byte by byte, the final-state checks, then pass 2: each code's raw low bits,
/// LSB first. Each symbol's raw bit count and base value come from join_body (vectorised);
/// while 8 bytes can be read at pos / 8, one unaligned load serves four codes (<= 52 bits
/// at a shift <= 7); the end of the stream goes code by code, byte by byte. Throws
/// (Cursor::bad) on a truncated or inconsistent stream.
template <int S>
void finish(const Tables& t, const Parsed& h, uint8_t* sym, std::size_t n, uint16_t* codes, uint32_t (&xs)[S],
            const uint8_t* r, std::size_t from) {
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
    thread_local std::vector<uint8_t> extra_buf;
    thread_local std::vector<uint16_t> base_buf;
    extra_buf.resize(n);
    base_buf.resize(n);
    const uint8_t* ex = extra_buf.data();
    const uint16_t* bs = base_buf.data();
    join_body<void>(sym, n, extra_buf.data(), base_buf.data());
    const uint8_t* bp = h.rend;
    const uint64_t bits_len = h.bits_len, nb = bits_len * 8;
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

/// segment_decode for S states, after parse filled t and h. Pass 1's fast rounds run here,
/// while a whole round of S codes is left and 2 bytes per state plus step_fast's 2 bytes
/// of overread, then finish.
/// The states and byte pointer are locals indexed by constants (scalars after unrolling,
/// so in registers: the byte stores to sym could alias anything whose address escapes). A
/// segment's states form one serial chain (each state's bytes start where the state before
/// it stopped); interleaving two segments' rounds was measured (2026-12-02) and lost: 8
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
    finish<S>(t, h, sym, n, codes, x, r, i);
}

/// segment_decode's body, compiled for each instruction-set level (decode_isa below):
/// integer code, the same codes on every level.
template <class>
void decode_body(const uint8_t* p, std::size_t size, std::size_t n, uint16_t* codes) {
    thread_local Tables t;
    Parsed h;
    if (!parse(p, size, n, codes, t, h)) return;  // raw: decoded
    if (h.S == 2) decode_rans<2>(h, t, n, codes);
    else decode_rans<4>(h, t, n, codes);
}

struct RansTag {};  ///< CKPT_ISA_CLONES' template argument
CKPT_ISA_CLONES(decode_isa, decode_body)

}  // namespace

void segment_decode(const uint8_t* p, std::size_t size, std::size_t n, uint16_t* codes) {
    decode_isa<RansTag>(p, size, n, codes);
}

}  // namespace ckpt::codec
