// Contract derivation (SPEC §3.2, "Hazardous = read by the segment and overwritten before its
// backward recompute").
#include "replay/contract.h"

#include <algorithm>

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
    std::vector<Contract> out(t.segments.size());
    for (size_t s = 0; s < t.segments.size(); ++s) {
        const Segment& seg = t.segments[s];
        Contract& c = out[s];
        std::string versions;
        for (const auto& a : seg.state) {
            if (a.read) {
                std::vector<Region> regions;
                bool overwritten = false;
                std::vector<std::string> writers;
                for (size_t j = s; j < t.segments.size(); ++j)
                    for (const auto& w : t.segments[j].state)
                        if (w.buffer == a.buffer && w.written) {
                            overwritten = true;
                            regions = region_union(regions, w.regions, a.bytes_read);
                            if (w.bytes_written < a.bytes_read)   // shrunk: the tail is lost
                                regions = region_union(
                                    regions, {{w.bytes_written, a.bytes_read - w.bytes_written}},
                                    a.bytes_read);
                            writers.push_back(t.segments[j].name);
                        }
                if (overwritten) {
                    c.restore.push_back({a.buffer, a.version_read, a.bytes_read,
                                         coalesce_regions(regions, kRegionMetaBytes)});
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
            versions += fmt::format("{}{}@{}", versions.empty() ? "" : ",", a.buffer,
                                    a.version_read);
        }
        for (const auto& r : seg.rng) {
            c.rng.push_back(r);
            c.hazards.push_back(fmt::format("consumes RNG stream '{}': a recompute would draw "
                                            "different numbers", r.stream));
            versions += fmt::format("{}rng:{}", versions.empty() ? "" : ",", r.stream);
        }
        c.id = fmt::format("{}:{}:{}", t.hash, seg.name, versions);
    }
    return out;
}

}  // namespace ckpt::replay
