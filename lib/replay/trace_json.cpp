// Trace JSON parsing with simdjson's DOM (see trace_json.h): strict parse, one BadInput for
// an out-of-range number, duplicate keys refused at any depth.
#include "replay/trace_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"

namespace ckpt::replay {

namespace dom = simdjson::dom;

namespace {

// Length of the JSON number at the start of s (RFC 8259 grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), or 0 when s does not start with one.
size_t number_length(std::string_view s) {
    size_t k = 0;
    auto digits = [&] {
        const size_t from = k;
        while (k < s.size() && s[k] >= '0' && s[k] <= '9') ++k;
        return k > from;
    };
    if (k < s.size() && s[k] == '-') ++k;
    if (k < s.size() && s[k] == '0') ++k;
    else if (!digits()) return 0;
    if (k < s.size() && s[k] == '.' && (++k, !digits())) return 0;
    if (k < s.size() && (s[k] == 'e' || s[k] == 'E')) {
        ++k;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (!digits()) return 0;
    }
    return k;
}

// True when the well-formed number token n is outside what a trace value can be: a float
// that overflows a double, or an integer outside [INT64_MIN, UINT64_MAX].
bool out_of_range(std::string_view n) {
    if (n.find_first_of(".eE") != std::string_view::npos) {
        const std::string z(n);   // strtod: from_chars' range errors differ by library
        return std::isinf(std::strtod(z.c_str(), nullptr));
    }
    std::from_chars_result r;
    if (n.front() == '-') {
        int64_t v;
        r = std::from_chars(n.data(), n.data() + n.size(), v);
    } else {
        uint64_t v;
        r = std::from_chars(n.data(), n.data() + n.size(), v);
    }
    return r.ec == std::errc::result_out_of_range;
}

// The first number of the text, in document order, that is malformed or out of range; empty
// when that one is malformed (or there is none): simdjson stops at the first bad number.
std::string_view first_out_of_range(std::string_view text) {
    for (size_t k = 0; k < text.size();) {
        const char c = text[k];
        if (c == '"') {   // skip the string (escapes included)
            for (++k; k < text.size() && text[k] != '"'; ++k)
                if (text[k] == '\\') ++k;
            ++k;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            const size_t n = number_length(text.substr(k));
            if (n == 0) return {};
            if (out_of_range(text.substr(k, n))) return text.substr(k, n);
            k += n;
        } else {
            ++k;
        }
    }
    return {};
}

// Refuses a repeated key in any object below `e`; the message names the key and its path.
class DuplicateKeys {
public:
    explicit DuplicateKeys(const std::string& file) : file_(file) {}

    void check(dom::element e, size_t depth = 0) {
        dom::array a;
        if (e.get(a) == simdjson::SUCCESS) {
            size_t k = 0;
            for (dom::element v : a) {
                path_.push_back({{}, k++, true});
                check(v, depth + 1);
                path_.pop_back();
            }
            return;
        }
        dom::object o;
        if (e.get(o) != simdjson::SUCCESS) return;
        if (scratch_.size() <= depth) scratch_.resize(depth + 1);
        std::vector<std::string_view>& keys = scratch_[depth];
        keys.clear();
        for (dom::key_value_pair kv : o) keys.push_back(kv.key);
        std::sort(keys.begin(), keys.end());
        if (auto d = std::adjacent_find(keys.begin(), keys.end()); d != keys.end()) fail(*d);
        for (dom::key_value_pair kv : o) {
            path_.push_back({kv.key, 0, false});
            check(kv.value, depth + 1);
            path_.pop_back();
        }
    }

private:
    [[noreturn]] void fail(std::string_view key) const {
        std::string where;
        for (const Step& p : path_)
            where += p.is_index ? fmt::format("[{}]", p.index)
                                : fmt::format("{}{}", where.empty() ? "" : ".", p.key);
        throw BadInput(file_, fmt::format("duplicate key '{}' in {}", key.substr(0, 200),
                                          where.empty() ? "the top-level object" : where));
    }

    struct Step {   // one step of the JSON path: an object member or an array element
        std::string_view key;
        size_t index;
        bool is_index;
    };
    const std::string& file_;
    std::vector<Step> path_;
    std::vector<std::vector<std::string_view>> scratch_;      // keys per depth, reused
};

}  // namespace

void parse_trace_json(JsonDoc& doc, const std::string& text, size_t len, const std::string& file) {
    size_t skip = 0;
    if (len >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) skip = 3;   // a UTF-8 BOM
    if (len - skip > kMaxJsonBytes) throw BadInput(file, "larger than 4 GiB");
    const auto err = doc.parser.parse(text.data() + skip, len - skip, false).get(doc.root);
    switch (err) {
        case simdjson::SUCCESS:
            break;
        case simdjson::MEMALLOC:
            throw std::bad_alloc();
        case simdjson::CAPACITY:
            throw BadInput(file, "larger than 4 GiB");
        case simdjson::NUMBER_ERROR:
        case simdjson::NUMBER_OUT_OF_RANGE:
            if (auto n = first_out_of_range(std::string_view(text).substr(skip, len - skip)); !n.empty())
                throw BadInput(file, fmt::format("number {} is out of range",
                                                 n.size() > 24 ? std::string(n.substr(0, 20)) + "..."
                                                               : std::string(n)));
            [[fallthrough]];
        default:
            throw BadInput(file, std::string("not valid JSON: ") + simdjson::error_message(err));
    }
    DuplicateKeys(file).check(doc.root);
}

std::optional<dom::element> member(dom::element o, std::string_view key) {
    dom::object obj;
    dom::element v;
    if (o.get(obj) != simdjson::SUCCESS || obj.at_key(key).get(v) != simdjson::SUCCESS)
        return std::nullopt;
    return v;
}

}  // namespace ckpt::replay
