// Test helper: one chunk through the codec and back, with each coordinate's certificate.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "codec/codec.h"

/// The decoded moments (dec[k]), each coordinate's certificate as verify re-derives it from
/// the codes (bounds) and the escaped coordinates (esc) of m, v (and vmax with amsgrad).
struct ChunkRoundtrip {
    std::array<std::vector<float>, 3> dec;
    std::vector<double> bounds;
    std::vector<bool> esc;
};

inline ChunkRoundtrip encode_decode(const ckpt::codec::TensorSetup& s, const std::vector<float>& m,
                                    const std::vector<float>& v, const std::vector<float>& vm) {
    using namespace ckpt::codec;
    const std::size_t n = m.size();
    const bool ams = s.hyper.amsgrad;
    const ChunkIn in{m.data(), v.data(), ams ? vm.data() : nullptr, nullptr, n};
    const ChunkOut out = encode_chunk(s, in);
    ChunkRoundtrip r;
    r.bounds.resize(n);
    for (auto& d : r.dec) d.assign(n, 0);
    decode_chunk(s, {out.codes[0].data(), out.codes[1].data(), ams ? out.codes[2].data() : nullptr},
                 {out.params[0].data(), out.params[1].data(), ams ? out.params[2].data() : nullptr}, n,
                 {r.dec[0].data(), r.dec[1].data(), ams ? r.dec[2].data() : nullptr}, nullptr, r.bounds.data());
    r.esc.assign(n, false);
    for (uint32_t e : out.escapes) r.esc[e] = true;
    return r;
}
