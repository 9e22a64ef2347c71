// Checked numbers from nlohmann::json documents we did not write ourselves (folder
// manifests, DCP cut lists). nlohmann's get<uint64_t>() / get<int>() convert a float such
// as 1e300 with undefined behaviour and wrap a negative integer; these accessors accept
// only what the field can hold and throw std::invalid_argument naming the field otherwise
// (callers turn it into BadInput for the file).
#pragma once
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace ckpt {

/// `v` as a count: a JSON integer >= 0. `what` names the field in the error.
inline uint64_t json_count_of(const nlohmann::json& v, const std::string& what) {
    if (!v.is_number_unsigned()) throw std::invalid_argument(what + ": expected a non-negative integer");
    return v.get<uint64_t>();
}

/// j.at(key) as a count (throws std::invalid_argument when missing or not a count).
inline uint64_t json_count(const nlohmann::json& j, const char* key) {
    if (!j.is_object() || !j.contains(key)) throw std::invalid_argument(std::string(key) + ": missing");
    return json_count_of(j.at(key), key);
}

/// j.at(key) as an int: a JSON integer in [INT_MIN, INT_MAX].
inline int json_int(const nlohmann::json& j, const char* key) {
    if (!j.is_object() || !j.contains(key)) throw std::invalid_argument(std::string(key) + ": missing");
    const nlohmann::json& v = j.at(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT_MAX)) ||
        (!v.is_number_unsigned() && (v.get<int64_t>() < INT_MIN || v.get<int64_t>() > INT_MAX)))
        throw std::invalid_argument(std::string(key) + ": expected an integer");
    return int(v.get<int64_t>());
}

}  // namespace ckpt
