// libFuzzer target: vlog's entropy coder (codec/rans.h). First byte even: the rest is a
// segment to decode, its code count in the next two bytes (any count up to kSegment); a
// malformed segment must be refused with std::runtime_error, never read out of bounds.
// First byte odd: the rest are uint16 codes; encode (with 2 rANS states when bit 1 is set,
// else 4), decode and compare (the round trip must be exact, else abort). Both ways, the
// pair decoder (segment_decode2) must give the same codes or the same error as
// segment_decode, with the segment as either half and a valid one or itself beside it.
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/rans.h"

namespace {

using ckpt::codec::SegmentView;

/// segment_decode's error text ("" when it decodes) and codes.
std::string one(const uint8_t* p, std::size_t size, std::vector<uint16_t>& out) {
    try {
        ckpt::codec::segment_decode(p, size, out.size(), out.data());
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    return "";
}

/// The segment [p, p + size) of n codes decoded alone must match it decoded beside itself
/// and beside a valid segment, on either side.
void pairs_agree(const uint8_t* p, std::size_t size, std::size_t n) {
    std::vector<uint16_t> alone(n), a(n), b(n);
    const std::string err = one(p, size, alone);
    static const std::vector<uint16_t> good_codes = [] {
        std::vector<uint16_t> c(3000);
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = uint16_t(i % 7 == 0 ? 40 + 13 * i : i % 5);
        return c;
    }();
    static const std::vector<uint8_t> good = [] {
        std::vector<uint8_t> g;
        ckpt::codec::segment_encode(good_codes.data(), good_codes.size(), g);
        return g;
    }();
    std::vector<uint16_t> g(good_codes.size());
    const SegmentView self{p, size, n, a.data()}, self2{p, size, n, b.data()}, valid{good.data(), good.size(), g.size(), g.data()};
    auto pair = [&](const SegmentView& x, const SegmentView& y) -> std::string {
        try {
            ckpt::codec::segment_decode2(x, y);
        } catch (const std::runtime_error& e) {
            return e.what();
        }
        return "";
    };
    if (pair(self, self2) != err || (err.empty() && (a != alone || b != alone))) abort();
    if (pair(valid, self) != err || g != good_codes || (err.empty() && a != alone)) abort();
    std::fill(g.begin(), g.end(), 0);
    if (pair(self, valid) != err || (err.empty() && (a != alone || g != good_codes))) abort();
}

}  // namespace

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
        pairs_agree(bytes.data(), bytes.size(), codes.size());
        return 0;
    }
    const std::size_t n = std::size_t(data[1] | (data[2] << 8)) % (ckpt::codec::kSegment + 1);
    pairs_agree(data + 3, size - 3, n);
    return 0;
}
