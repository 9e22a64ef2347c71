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

}  // namespace ckpt::codec
