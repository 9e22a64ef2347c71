// libFuzzer target: vlog's entropy coder (codec/rans.h). First byte even: the rest is a
// segment to decode, its code count in the next two bytes (any count up to kSegment); a
// malformed segment must be refused with std::runtime_error, never read out of bounds, and
// every instruction-set level this CPU runs must give the same codes or the same refusal
// (else abort); so must segment_decode2 on the segment paired with itself (the same codes
// twice, or the same refusal: at AVX-512 the two run interleaved). First byte odd: the rest are uint16 codes; encode (with 2 rANS states when
// bit 1 is set, else 4 when bit 2 is, else the writer's default when bit 3 is, else 16),
// decode and compare (the round trip must be exact, else abort).
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/rans.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace ckpt::codec;
    if (size < 3) return 0;
    if (data[0] & 1) {
        std::vector<uint16_t> codes((size - 1) / 2);
        if (codes.size() > std::size_t(kSegment)) codes.resize(kSegment);
        for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = uint16_t(data[1 + 2 * i] | (data[2 + 2 * i] << 8));
        std::vector<uint8_t> bytes;
        segment_encode(codes.data(), codes.size(), bytes, (data[0] & 2) ? 2 : (data[0] & 4) ? 4 : (data[0] & 8) ? 0 : 16);
        std::vector<uint16_t> back(codes.size());
        segment_decode(bytes.data(), bytes.size(), back.size(), back.data());
        if (back != codes) abort();
        return 0;
    }
    const std::size_t n = std::size_t(data[1] | (data[2] << 8)) % (kSegment + 1);
    const Isa before = active_isa();
    std::string first;
    bool have = false;
    for (Isa isa : {Isa::Baseline, Isa::AVX2, Isa::AVX512}) {
        if (!isa_supported(isa)) continue;
        set_isa(isa);
        std::vector<uint16_t> out(n);
        std::string outcome;
        try {
            segment_decode(data + 3, size - 3, n, out.data());
            outcome.assign(reinterpret_cast<const char*>(out.data()), 2 * n);
        } catch (const std::runtime_error& e) {
            outcome = std::string("refused: ") + e.what();
        }
        if (have && outcome != first) abort();
        std::vector<uint16_t> o0(n), o1(n);
        const uint8_t* p[2] = {data + 3, data + 3};
        const std::size_t sz[2] = {size - 3, size - 3}, nn[2] = {n, n};
        uint16_t* codes[2] = {o0.data(), o1.data()};
        std::string pair;
        try {
            segment_decode2(p, sz, nn, codes);
            pair.assign(reinterpret_cast<const char*>(o0.data()), 2 * n);
            pair.append(reinterpret_cast<const char*>(o1.data()), 2 * n);
        } catch (const std::runtime_error& e) {
            pair = std::string("refused: ") + e.what();
        }
        if (pair != (outcome.rfind("refused: ", 0) == 0 ? outcome : outcome + outcome)) abort();
        first = std::move(outcome);
        have = true;
    }
    set_isa(before);
    return 0;
}
