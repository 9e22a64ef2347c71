#include "codec/blockwise8.h"

#include <algorithm>
#include <vector>

namespace ckpt::codec {

DynamicMap::DynamicMap(bool is_signed) {
    // bitsandbytes functional.create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)
    std::vector<double> data;
    const int max_exp = 7, non_sign_bits = 7;
    for (int i = 0; i < max_exp; ++i) {
        const int items = is_signed ? (1 << (i + non_sign_bits - max_exp)) + 1
                                    : (1 << (i + non_sign_bits - max_exp + 1)) + 1;
        const double scale = std::pow(10.0, -(max_exp - 1) + i);
        for (int j = 0; j + 1 < items; ++j) {
            const double b0 = 0.1 + 0.9 * j / (items - 1), b1 = 0.1 + 0.9 * (j + 1) / (items - 1);
            const double mean = (b0 + b1) / 2;
            data.push_back(scale * mean);
            if (is_signed) data.push_back(-scale * mean);
        }
    }
    data.push_back(0);
    data.push_back(1.0);
    while (data.size() < 256) data.push_back(0);
    std::sort(data.begin(), data.end());
    for (int k = 0; k < 256; ++k) v[k] = float(data[k]);
}

const DynamicMap& Blockwise8::map(Role r) {
    static const DynamicMap s(true), u(false);
    return r == Role::ExpAvg ? s : u;
}

bool Blockwise8::encode(float x, Role r, const int16_t* p, double, uint16_t* code) {
    if (!std::isfinite(x)) return false;
    const float am = absmax(p);
    if (!(am > 0)) { if (x != 0) return false; }
    // nearest decoded value; ties go down
    int lo = 0, hi = 255;
    const double xd = x;
    while (lo < hi) {  // first k whose upper midpoint is >= x
        const int k = (lo + hi) / 2;
        const double mid = (dec(k, r, p) + dec(k + 1, r, p)) / 2;
        if (xd <= mid) hi = k; else lo = k + 1;
    }
    *code = uint16_t(lo);
    const Cell c = cell(*code, r, p);
    return c.lo <= xd && xd <= c.hi;
}

Cell Blockwise8::cell(uint16_t code, Role r, const int16_t* p, double) {
    const int k = code & 0xff;
    Cell c;
    c.dec = dec(k, r, p);
    c.lo = k == 0 ? (r == Role::ExpAvg ? c.dec : 0.0) : (c.dec + dec(k - 1, r, p)) / 2;
    c.hi = k == 255 ? c.dec : (c.dec + dec(k + 1, r, p)) / 2;
    if (r != Role::ExpAvg && c.lo < 0) c.lo = 0;
    return c;
}

void Blockwise8::choose(const float* x, int n, Role, const double*, const GuardConst&, int16_t* p) {
    float am = 0;
    for (int i = 0; i < n; ++i)
        if (std::isfinite(x[i])) am = std::max(am, std::fabs(x[i]));
    std::memcpy(p, &am, 4);
}

}  // namespace ckpt::codec
