// libFuzzer target: vlog's entropy coder (codec/rans.h). First byte even: the rest is a
// segment to decode, its code count in the next two bytes (any count up to kSegment); a
// malformed segment must be refused with std::runtime_error, never read out of bounds.
// First byte odd: the rest are uint16 codes; encode (with 2 rANS states when bit 1 is set,
// else 4), decode and compare (the round trip must be exact, else abort).
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "codec/codec.h"
#include "codec/rans.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 3) return 0;
    if (data[0] & 1) {
        std::vector<uint16_t> codes((size - 1) / 2);
        if (codes.size() > std::size_t(ckpt::codec::kSegment)) codes.resize(ckpt::codec::kSegment);
        for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = uint16_t(data[1 + 2 * i] | (data[2 + 2 * i] << 8));
        std::vector<uint8_t> bytes;
        ckpt::codec::segment_encode(codes.data(), codes.size(), bytes, (data[0] & 2) ? 2 : 4);
        std::vector<uint16_t> back(codes.size());
        ckpt::codec::segment_decode(bytes.data(), bytes.size(), back.size(), back.data());
        if (back != codes) abort();
        return 0;
    }
    const std::size_t n = std::size_t(data[1] | (data[2] << 8)) % (ckpt::codec::kSegment + 1);
    std::vector<uint16_t> out(n);
    try {
        ckpt::codec::segment_decode(data + 3, size - 3, n, out.data());
    } catch (const std::runtime_error&) {
    }
    return 0;
}
