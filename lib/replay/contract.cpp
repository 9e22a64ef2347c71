// Contract derivation (docs/design.md §5, "Hazardous = read by the segment and overwritten before its
// backward recompute").
#include "replay/contract.h"

#include <algorithm>
#include <iterator>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

namespace ckpt::replay {

uint64_t RestoreEntry::region_bytes() const {
    uint64_t s = 0;
    for (const auto& r : regions) s += r.length;
    return s;
}

std::vector<Region> region_union(const std::vector<Region>& a, const std::vector<Region>& b,
                                 uint64_t limit) {
    std::vector<Region> all(a);
    all.insert(all.end(), b.begin(), b.end());
    std::sort(all.begin(), all.end(),
              [](const Region& x, const Region& y) { return x.offset < y.offset; });
    std::vector<Region> out;
    for (const auto& r : all) {
        uint64_t begin = r.offset, end = std::min(r.offset + r.length, limit);
        if (begin >= end) continue;
        if (!out.empty() && begin <= out.back().offset + out.back().length) {
            uint64_t e = std::max(out.back().offset + out.back().length, end);
            out.back().length = e - out.back().offset;
        } else {
            out.push_back({begin, end - begin});
        }
    }
    return out;
}

std::vector<Region> coalesce_regions(const std::vector<Region>& rs, uint64_t max_gap) {
    std::vector<Region> out;
    for (const auto& r : rs) {
        if (!out.empty() && r.offset - (out.back().offset + out.back().length) < max_gap)
            out.back().length = r.offset + r.length - out.back().offset;
        else
            out.push_back(r);
    }
    return out;
}

std::vector<Contract> derive_contracts(const Trace& t) {
    // Writes per buffer in segment order (segment index, access), so a read only visits the
    // writes of its own buffer at or after its segment: O(reads x later writes) instead of
    // O(reads x all accesses of all later segments) with a string compare each.
    std::unordered_map<std::string_view, std::vector<std::pair<size_t, const StateAccess*>>>
        writes;
    for (size_t j = 0; j < t.segments.size(); ++j)
        for (const auto& w : t.segments[j].state)
            if (w.written) writes[w.buffer].emplace_back(j, &w);
    std::vector<Contract> out(t.segments.size());
    std::vector<Region> regions;
    std::vector<std::string_view> writers;
    for (size_t s = 0; s < t.segments.size(); ++s) {
        const Segment& seg = t.segments[s];
        Contract& c = out[s];
        std::string versions;
        for (const auto& a : seg.state) {
            auto it = a.read ? writes.find(a.buffer) : writes.end();
            if (it != writes.end()) {
                const auto& ws = it->second;
                auto w = std::lower_bound(ws.begin(), ws.end(), s,
                                          [](const auto& x, size_t j) { return x.first < j; });
                if (w != ws.end()) {
                    // Every later write's regions, and the tail a shrinking write loses; the
                    // union is a set, so one sort + merge gives the same list as merging in
                    // write order.
                    regions.clear();
                    writers.clear();
                    for (; w != ws.end(); ++w) {
                        const StateAccess& x = *w->second;
                        regions.insert(regions.end(), x.regions.begin(), x.regions.end());
                        if (x.bytes_written < a.bytes_read)   // shrunk: the tail is lost
                            regions.push_back({x.bytes_written, a.bytes_read - x.bytes_written});
                        writers.push_back(t.segments[w->first].name);
                    }
                    c.restore.push_back({a.buffer, a.version_read, a.bytes_read,
                                         coalesce_regions(region_union(regions, {}, a.bytes_read),
                                                          kRegionMetaBytes)});
                    c.hazards.push_back(fmt::format(
                        "reads '{}' at version {}, overwritten before its recompute by segment(s) "
                        "{}", a.buffer, a.version_read, fmt::join(writers, ",")));
                }
            }
            if (a.written) {
                c.discard.push_back({a.buffer, a.version_written, a.bytes_written, a.regions});
                c.hazards.push_back(fmt::format("writes '{}' (version {} -> {}): a recompute "
                                                "would write it again", a.buffer,
                                                a.version_read, a.version_written));
            }
            fmt::format_to(std::back_inserter(versions), "{}{}@{}", versions.empty() ? "" : ",",
                           a.buffer, a.version_read);
        }
        for (const auto& r : seg.rng) {
            c.rng.push_back(r);
            c.hazards.push_back(fmt::format("consumes RNG stream '{}': a recompute would draw "
                                            "different numbers", r.stream));
            fmt::format_to(std::back_inserter(versions), "{}rng:{}", versions.empty() ? "" : ",",
                           r.stream);
        }
        if (!seg.non_replayable.empty()) {
            c.replayable = false;
            c.hazards.push_back("non-replayable: " + seg.non_replayable);
        }
        c.id = fmt::format("{}:{}:{}", t.hash, seg.name, versions);
    }
    return out;
}

}  // namespace ckpt::replay
