// vlog's entropy coder (codec/rans.h): exact round trips over the distributions the codes
// have, the raw fallback, and refusal of every malformed segment.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/rans.h"

using namespace ckpt::codec;

namespace {
std::vector<uint16_t> roundtrip(const std::vector<uint16_t>& c, std::vector<uint8_t>& bytes, int states = 0) {
    bytes.clear();
    segment_encode(c.data(), c.size(), bytes, states);
    std::vector<uint16_t> back(c.size(), 0xffff);
    segment_decode(bytes.data(), bytes.size(), c.size(), back.data());
    return back;
}
/// Where a rANS segment's initial states start: after the mode byte, three varints
/// (rANS length, raw-bit length, symbol count) and one varint frequency per used symbol.
std::size_t state_offset(const std::vector<uint8_t>& a) {
    std::size_t at = 1, varints = 3;
    for (std::size_t v = 0; v < varints; ++v) {
        uint64_t x = 0;
        for (int sh = 0;; sh += 7) {
            x |= uint64_t(a.at(at) & 0x7f) << sh;
            if (!(a.at(at++) & 0x80)) break;
        }
        if (v == 2) varints += std::size_t(x);
    }
    return at;
}
}  // namespace

TEST_CASE("rans segments round-trip exactly, near the entropy") {
    std::mt19937_64 rng(1);
    std::vector<uint8_t> bytes;
    // geometric small codes (exp_avg), zigzag Gaussian (exp_avg_sq), all symbols, extremes
    std::geometric_distribution<int> geo(0.3);
    std::normal_distribution<double> N(0, 40);
    std::uniform_int_distribution<int> any(0, 65535);
    for (int kind = 0; kind < 4; ++kind) {
        for (std::size_t n : {std::size_t(1), std::size_t(63), std::size_t(16384)}) {
            std::vector<uint16_t> c(n);
            for (auto& x : c) {
                if (kind == 0) x = uint16_t(std::min(geo(rng), 65535));
                else if (kind == 1) { const int j = int(std::lround(N(rng))); x = uint16_t(1 + (j >= 0 ? 2 * j : -2 * j - 1)); }
                else if (kind == 2) x = uint16_t(any(rng));
                else x = rng() % 2 ? 65535 : 0;
            }
            for (int states : {0, 16, 4, 2}) {
                CAPTURE(states);
                CHECK(roundtrip(c, bytes, states) == c);
                if (n == 16384 && kind == 0) CHECK(bytes.size() < n * 3 / 8);     // ~2.9 bits of entropy
                if (n == 16384 && kind == 1) CHECK(bytes.size() < n * 9 / 8);     // ~8.4 bits
                if (kind == 2) CHECK(bytes.size() <= 2 * n + 1);                   // raw fallback
            }
        }
    }
    std::vector<uint16_t> zeros(16384, 0);
    CHECK(roundtrip(zeros, bytes) == zeros);
    CHECK(bytes.size() < 100);
    std::vector<uint16_t> none;
    CHECK(roundtrip(none, bytes) == none);
}

TEST_CASE("rans segments: deterministic, and malformed bytes are refused") {
    std::mt19937_64 rng(2);
    std::geometric_distribution<int> geo(0.05);
    std::vector<uint16_t> c(5000);
    for (auto& x : c) x = uint16_t(geo(rng));
    std::vector<uint8_t> a, b;
    segment_encode(c.data(), c.size(), a);
    segment_encode(c.data(), c.size(), b);
    CHECK(a == b);
    std::vector<uint16_t> out(c.size());
    auto refuses = [&](std::vector<uint8_t> bad, std::size_t n) {
        try {
            segment_decode(bad.data(), bad.size(), n, out.data());
        } catch (const std::runtime_error&) {
            return true;
        }
        return false;
    };
    CHECK(refuses({}, c.size()));
    CHECK(refuses(std::vector<uint8_t>(a.begin(), a.end() - 1), c.size()));  // truncated
    std::vector<uint8_t> longer = a;
    longer.push_back(0);
    CHECK(refuses(longer, c.size()));                                          // trailing byte
    CHECK(refuses(a, c.size() + 1));                                           // wrong count
    std::vector<uint8_t> mode = a;
    mode[0] = 7;
    CHECK(refuses(mode, c.size()));
    std::vector<uint8_t> table = a;
    table[4] ^= 0x10;  // inside the frequency table: the sum is no longer 2^12
    CHECK(refuses(table, c.size()));
    // every single-byte flip is refused or decodes to n codes without reading past the end
    int refused = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        std::vector<uint8_t> f = a;
        f[i] ^= 0x01;
        refused += refuses(f, c.size());
    }
    CHECK(refused > int(a.size()) / 2);
}

TEST_CASE("rans segments: the decoder's fast and checked paths meet exactly") {
    // segment_decode reads the rANS bytes unchecked while a round's bytes surely remain
    // (modes 0 and 2: 2 per state and 2 of overread; mode 3: 32) and the raw bits with
    // 8-byte loads while 8 remain; every length from 1 to 48 codes (mode 3: 160) with raw
    // bits of every width crosses both ends at every phase, on every instruction-set level
    std::mt19937_64 rng(3);
    std::vector<uint8_t> bytes;
    const Isa before = active_isa();
    for (Isa isa : {Isa::Baseline, Isa::AVX2, Isa::AVX512}) {
        if (!isa_supported(isa)) continue;
        set_isa(isa);
        CAPTURE(isa_name(isa));
        for (int states : {2, 4, 16})
            for (std::size_t n = 1; n <= (states == 16 ? 160u : 48u); ++n) {
                for (int rep = 0; rep < 8; ++rep) {
                    std::vector<uint16_t> c(n);
                    for (auto& x : c) x = uint16_t(rng() % 4 ? rng() % 40 : (rng() & 0xffff) >> (rng() % 12));
                    CHECK(roundtrip(c, bytes, states) == c);
                    if (bytes[0] != 1) CHECK(bytes[0] == (states == 16 ? 3 : states == 4 ? 2 : 0));  // the mode byte, unless raw
                }
            }
    }
    set_isa(before);
}

TEST_CASE("rans segments: every code value 0..65535 round-trips through its symbol and raw bits") {
    // the encoder's vectorised split (symbol by float exponent, products for selects) and
    // the decoder's symbol table must agree on all 76 symbols at every raw width; each
    // segment is mostly small codes so that it stays rANS-coded (not the raw fallback)
    std::vector<uint8_t> bytes;
    for (uint32_t v0 = 0; v0 < 65536; v0 += 160) {
        std::vector<uint16_t> c(480);
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = uint16_t(i % 3 == 2 ? v0 + i / 3 : i % 5);
        REQUIRE(roundtrip(c, bytes, 16) == c);
        CHECK(bytes[0] == 3);
    }
}

TEST_CASE("rans segments: format version 2's two-state mode still decodes, byte for byte as written then") {
    // the mode-0 segment that the format-2 encoder (commit 0c600f5) wrote for these 200 codes
    std::vector<uint16_t> c(200);
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = uint16_t(i % 37 == 0 ? 300 + 11 * i : (i * i) % 5);
    std::vector<uint8_t> two, four;
    segment_encode(c.data(), c.size(), two, 2);
    segment_encode(c.data(), c.size(), four, 4);
    const std::vector<uint8_t> v2 = {0, 50, 6, 57, 168, 24, 253, 49, 0, 0, 245, 49, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 81, 0, 0, 0, 0, 81, 0, 0, 81, 81, 0, 81, 81, 39, 254, 155, 42, 181, 31, 154, 42, 227, 165, 76, 162, 193, 217, 25, 192, 236, 177, 254, 45, 64, 131, 172, 196, 80, 86, 88, 24, 164, 20, 176, 100, 247, 246, 137, 183, 119, 39, 21, 106, 185, 167, 171, 247, 2, 84, 99, 55, 154, 157, 236, 80, 43, 30, 241, 35};
    CHECK(two == v2);
    CHECK(four != v2);
    std::vector<uint16_t> back(c.size());
    segment_decode(v2.data(), v2.size(), c.size(), back.data());
    CHECK(back == c);
    segment_decode(four.data(), four.size(), c.size(), back.data());
    CHECK(back == c);
    CHECK_THROWS_AS(segment_encode(c.data(), c.size(), two, 3), std::invalid_argument);
    CHECK_THROWS_AS(segment_encode(c.data(), c.size(), two, 8), std::invalid_argument);
}

TEST_CASE("rans segments: the default keeps the smaller of modes 3 and 2 up to 4096 codes, mode 3 above") {
    std::mt19937_64 rng(4);
    std::geometric_distribution<int> geo(0.1);
    for (std::size_t n : {std::size_t(40), std::size_t(300), std::size_t(4096), std::size_t(4097), std::size_t(16384)}) {
        CAPTURE(n);
        std::vector<uint16_t> c(n);
        for (auto& x : c) x = uint16_t(geo(rng));
        std::vector<uint8_t> d, m3, m2;
        segment_encode(c.data(), n, d);
        segment_encode(c.data(), n, m3, 16);
        segment_encode(c.data(), n, m2, 4);
        if (n > 4096) CHECK(d == m3);
        else CHECK(d == (m2.size() < m3.size() ? m2 : m3));
        if (n == 300) CHECK(d == m2);                            // 64 state bytes are a lot for 300 codes
        if (n == 16384) CHECK(m3.size() < m2.size() + 64);       // and little for 16384
        std::vector<uint16_t> back(n);
        segment_decode(d.data(), d.size(), n, back.data());
        CHECK(back == c);
    }
}

TEST_CASE("rans segments: unused bits of the last raw byte must be zero") {
    // 3 codes of 12 bits (9 raw bits each): 27 raw bits, so the last byte has 5 unused bits
    std::vector<uint16_t> c(200, 0);
    for (std::size_t i = 0; i < 3; ++i) c[i] = uint16_t(2048 + 37 * i);
    std::vector<uint8_t> a;
    segment_encode(c.data(), c.size(), a, 16);
    REQUIRE(a[0] == 3);  // rANS mode (the zeros make it small)
    std::vector<uint16_t> out(c.size());
    segment_decode(a.data(), a.size(), c.size(), out.data());
    CHECK(out == c);
    a.back() |= 0x80;
    CHECK_THROWS_AS(segment_decode(a.data(), a.size(), c.size(), out.data()), std::runtime_error);
}

TEST_CASE("rans segments: an initial state outside the encoder's range is refused") {
    // no encoder writes one (mode 2: states in [2^23, 2^31); mode 3: [2^16, 2^32)); the
    // unchecked decoders rely on it (mode 2: below 2^23 a state could decode to y < 2^9 and
    // read more than 2 bytes a step; mode 3: below 2^16, to y < 16 and need two words)
    std::vector<uint16_t> c(500);
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = uint16_t(i % 5);
    for (int states : {4, 16}) {
        CAPTURE(states);
        std::vector<uint8_t> a;
        segment_encode(c.data(), c.size(), a, states);
        REQUIRE(a[0] == (states == 4 ? 2 : 3));
        const uint32_t lo = states == 4 ? 1u << 23 : 1u << 16;
        std::vector<uint16_t> out(c.size());
        segment_decode(a.data(), a.size(), c.size(), out.data());
        REQUIRE(out == c);
        const std::size_t at0 = state_offset(a);  // state 0, little-endian; state k at at0 + 4 k
        std::vector<uint32_t> bad = {lo - 1, 0u, 1u << 9};
        if (states == 4) bad.push_back(0x80000000u);
        for (int k = 0; k < states; ++k) {
            const std::size_t at = at0 + 4 * std::size_t(k);
            const uint32_t x = uint32_t(a[at]) | uint32_t(a[at + 1]) << 8 | uint32_t(a[at + 2]) << 16 | uint32_t(a[at + 3]) << 24;
            CHECK(x >= lo);
            if (states == 4) CHECK(x < (1u << 31));
            if (k == 0 && states == 4) bad.push_back(x | 0x80000000u);
        }
        for (int k : {0, states - 1})
            for (const uint32_t b : bad) {
                CAPTURE(k);
                CAPTURE(b);
                std::vector<uint8_t> d = a;
                for (int j = 0; j < 4; ++j) d[at0 + 4 * std::size_t(k) + std::size_t(j)] = uint8_t(b >> (8 * j));
                CHECK_THROWS_WITH_AS(segment_decode(d.data(), d.size(), c.size(), out.data()),
                                     "vlog segment: trailing or inconsistent data", std::runtime_error);
            }
    }
}

TEST_CASE("rans segments: mode 3 decodes the same on every instruction-set level, damaged segments too") {
    // the AVX2 and AVX-512 decoders (gather, expand) against the scalar one: for valid
    // segments of every length class, and for each with one byte flipped, the same codes
    // or the same refusal
    std::mt19937_64 rng(5);
    std::geometric_distribution<int> geo(0.05);
    const Isa before = active_isa();
    std::vector<Isa> levels;
    for (Isa isa : {Isa::Baseline, Isa::AVX2, Isa::AVX512})
        if (isa_supported(isa)) levels.push_back(isa);
    for (std::size_t n : {std::size_t(150), std::size_t(301), std::size_t(4099), std::size_t(16384)}) {
        std::vector<uint16_t> c(n);
        for (auto& x : c) x = uint16_t(std::min(geo(rng), 65535));
        std::vector<uint8_t> a;
        segment_encode(c.data(), c.size(), a, 16);
        REQUIRE(a[0] == 3);
        for (int trial = 0; trial < 60; ++trial) {
            std::vector<uint8_t> d = a;
            if (trial > 0) d[rng() % d.size()] ^= uint8_t(1u << (rng() % 8));
            std::vector<std::string> outcome;
            for (Isa isa : levels) {
                set_isa(isa);
                std::vector<uint16_t> out(n, 0);
                try {
                    segment_decode(d.data(), d.size(), n, out.data());
                    outcome.emplace_back(reinterpret_cast<const char*>(out.data()), 2 * n);
                } catch (const std::runtime_error& e) {
                    outcome.emplace_back(e.what());
                }
            }
            for (std::size_t l = 1; l < outcome.size(); ++l) CHECK(outcome[l] == outcome[0]);
            if (trial == 0) CHECK(outcome[0] == std::string(reinterpret_cast<const char*>(c.data()), 2 * n));
        }
    }
    set_isa(before);
}

TEST_CASE("rans segments: segment_decode2 gives two segment_decode calls' codes and first error") {
    // pairs of every mode (16 states, 4, raw) and length class (unequal lengths: one
    // segment's rounds go on alone), each valid, then with a byte flipped in one or both:
    // the same codes, or the same error, as segment_decode on segment 0 and then 1; on
    // every instruction-set level (AVX-512 interleaves the two)
    std::mt19937_64 rng(8);
    std::geometric_distribution<int> geo(0.05);
    const Isa before = active_isa();
    struct Seg { std::vector<uint16_t> codes; std::vector<uint8_t> bytes; };
    std::vector<Seg> segs;
    for (int states : {16, 4, 16})
        for (std::size_t n : {std::size_t(40), std::size_t(4099), std::size_t(16384)}) {
            Seg s;
            s.codes.resize(n);
            for (auto& x : s.codes) x = uint16_t(std::min(geo(rng), 65535));
            segment_encode(s.codes.data(), n, s.bytes, states);
            segs.push_back(s);
        }
    Seg raw;  // a few random 16-bit codes: the rANS form (tables, 16 states) is larger, stored raw
    raw.codes.resize(40);
    for (auto& x : raw.codes) x = uint16_t(rng() & 0xffff);
    segment_encode(raw.codes.data(), raw.codes.size(), raw.bytes);
    REQUIRE(raw.bytes[0] == 1);
    segs.push_back(raw);
    auto single = [](const std::vector<uint8_t>* b, const std::size_t* n) {
        std::string r;
        try {
            for (int a = 0; a < 2; ++a) {
                std::vector<uint16_t> out(n[a], 0);
                segment_decode(b[a].data(), b[a].size(), n[a], out.data());
                r.append(reinterpret_cast<const char*>(out.data()), 2 * n[a]);
            }
        } catch (const std::runtime_error& e) {
            r = e.what();
        }
        return r;
    };
    auto pair = [](const std::vector<uint8_t>* b, const std::size_t* n) {
        std::vector<uint16_t> out[2] = {std::vector<uint16_t>(n[0], 0), std::vector<uint16_t>(n[1], 0)};
        const uint8_t* p[2] = {b[0].data(), b[1].data()};
        const std::size_t size[2] = {b[0].size(), b[1].size()};
        uint16_t* codes[2] = {out[0].data(), out[1].data()};
        try {
            segment_decode2(p, size, n, codes);
        } catch (const std::runtime_error& e) {
            return std::string(e.what());
        }
        return std::string(reinterpret_cast<const char*>(out[0].data()), 2 * n[0]) +
               std::string(reinterpret_cast<const char*>(out[1].data()), 2 * n[1]);
    };
    int refused = 0, checked = 0;
    for (Isa isa : {Isa::Baseline, Isa::AVX2, Isa::AVX512}) {
        if (!isa_supported(isa)) continue;
        set_isa(isa);
        for (std::size_t i = 0; i < segs.size(); ++i)
            for (std::size_t j = 0; j < segs.size(); ++j)
                for (int damage = 0; damage < 4; ++damage) {  // none, segment 0, segment 1, both
                    std::vector<uint8_t> b[2] = {segs[i].bytes, segs[j].bytes};
                    for (int a = 0; a < 2; ++a)
                        if (damage & (1 << a)) b[a][rng() % b[a].size()] ^= uint8_t(1u << (rng() % 8));
                    const std::size_t n[2] = {segs[i].codes.size(), segs[j].codes.size()};
                    CAPTURE(i);
                    CAPTURE(j);
                    CAPTURE(damage);
                    const std::string want = single(b, n);
                    CHECK(pair(b, n) == want);
                    if (damage == 0)
                        CHECK(want == std::string(reinterpret_cast<const char*>(segs[i].codes.data()), 2 * n[0]) +
                                          std::string(reinterpret_cast<const char*>(segs[j].codes.data()), 2 * n[1]));
                    refused += want.rfind("vlog segment:", 0) == 0;
                    ++checked;
                }
    }
    set_isa(before);
    CHECK(refused > checked / 4);  // the damaged pairs mostly refused: the error paths ran
}

TEST_CASE("rans segments: segment_encode2 writes two segment_encode calls' bytes") {
    // lengths at and around the interleaving's condition (both > 4096 codes) and unequal
    // (one segment's rounds go on alone, from either side), codes of several shapes; on
    // every instruction-set level (AVX-512 interleaves); appended after existing bytes
    std::mt19937_64 rng(9);
    std::geometric_distribution<int> geo(0.05);
    const Isa before = active_isa();
    const std::size_t lens[] = {1, 4096, 4097, 5003, 16384};
    for (Isa isa : {Isa::Baseline, Isa::AVX2, Isa::AVX512}) {
        if (!isa_supported(isa)) continue;
        set_isa(isa);
        for (std::size_t n0 : lens)
            for (std::size_t n1 : lens) {
                std::vector<uint16_t> c[2] = {std::vector<uint16_t>(n0), std::vector<uint16_t>(n1)};
                for (int a = 0; a < 2; ++a)
                    for (auto& x : c[a]) x = uint16_t(a == 0 ? std::min(geo(rng), 65535) : int(rng() % 40));
                std::vector<uint8_t> want[2] = {{7}, {7, 7}}, got[2] = {{7}, {7, 7}};
                for (int a = 0; a < 2; ++a) segment_encode(c[a].data(), c[a].size(), want[a]);
                const uint16_t* codes[2] = {c[0].data(), c[1].data()};
                const std::size_t n[2] = {n0, n1};
                std::vector<uint8_t>* out[2] = {&got[0], &got[1]};
                segment_encode2(codes, n, out);
                CAPTURE(n0);
                CAPTURE(n1);
                CHECK(got[0] == want[0]);
                CHECK(got[1] == want[1]);
                std::vector<uint16_t> back(n1);
                segment_decode(got[1].data() + 2, got[1].size() - 2, n1, back.data());
                CHECK(back == c[1]);
            }
    }
    set_isa(before);
}

TEST_CASE("rans segments: segment_encode writes the same bytes on every instruction-set level") {
    // the AVX-512 rounds (gathers, compressed word stores, quotients from doubles) against
    // the scalar ones: lengths around whole rounds, one symbol only (frequency 2^12),
    // symbols of frequency 1, the largest codes, each mode
    std::mt19937_64 rng(6);
    const Isa before = active_isa();
    std::vector<Isa> levels;
    for (Isa isa : {Isa::Baseline, Isa::AVX2, Isa::AVX512})
        if (isa_supported(isa)) levels.push_back(isa);
    for (int kind = 0; kind < 5; ++kind)
        for (std::size_t n : {std::size_t(1), std::size_t(15), std::size_t(16), std::size_t(33), std::size_t(1000), std::size_t(16384)}) {
            std::vector<uint16_t> c(n);
            for (std::size_t i = 0; i < n; ++i) {
                if (kind == 0) c[i] = uint16_t(rng() % 7);
                else if (kind == 1) c[i] = 3;                                               // one symbol
                else if (kind == 2) c[i] = uint16_t(i % 997 == 0 ? 60000 + i % 5000 : rng() % 3);  // rare symbols: frequency 1
                else if (kind == 3) c[i] = uint16_t(rng() & 0xffff);
                else c[i] = uint16_t(std::min<uint64_t>(65535, uint64_t(std::exp2(double(rng() % 1600) / 100.0))));
            }
            for (int states : {0, 16, 4, 2}) {
                CAPTURE(kind);
                CAPTURE(n);
                CAPTURE(states);
                std::vector<std::vector<uint8_t>> out;
                for (Isa isa : levels) {
                    set_isa(isa);
                    out.emplace_back();
                    segment_encode(c.data(), n, out.back(), states);
                }
                for (std::size_t l = 1; l < out.size(); ++l) CHECK(out[l] == out[0]);
                std::vector<uint16_t> back(n);
                segment_decode(out[0].data(), out[0].size(), n, back.data());
                CHECK(back == c);
            }
        }
    set_isa(before);
}
