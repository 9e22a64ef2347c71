// Replay simulator (see simulate.h).
#include "replay/simulate.h"

#include <map>
#include <stdexcept>

#include <fmt/format.h>

namespace ckpt::replay {
namespace {

// Contents of a buffer: size + sorted disjoint pieces [begin, end) -> writer version.
struct Content {
    uint64_t size = 0;
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> pieces;  // begin -> (end, version)

    static Content initial(uint64_t size) {
        Content c;
        c.size = size;
        if (size) c.pieces[0] = {size, 0};
        return c;
    }
    // Cut a piece boundary at x.
    void split(uint64_t x) {
        auto it = pieces.upper_bound(x);
        if (it == pieces.begin()) return;
        --it;
        auto [end, v] = it->second;
        if (it->first < x && x < end) {
            it->second.first = x;
            pieces[x] = {end, v};
        }
    }
    void resize(uint64_t n) {
        if (n < size) {
            split(n);
            pieces.erase(pieces.lower_bound(n), pieces.end());
        } else if (n > size) {
            pieces[size] = {n, ~0ull};   // bytes of unknown origin until written
        }
        size = n;
        normalise();
    }
    void assign(uint64_t b, uint64_t e, uint64_t v) {
        if (b >= e) return;
        split(b);
        split(e);
        pieces.erase(pieces.lower_bound(b), pieces.lower_bound(e));
        pieces[b] = {e, v};
        normalise();
    }
    // Copy [b, e) from another content (same byte layout).
    void copy_from(const Content& o, uint64_t b, uint64_t e) {
        for (const auto& [pb, pe] : o.pieces) {
            uint64_t lo = std::max(b, pb), hi = std::min(e, pe.first);
            if (lo < hi) assign(lo, hi, pe.second);
        }
    }
    void normalise() {
        for (auto it = pieces.begin(); it != pieces.end();) {
            auto nx = std::next(it);
            if (nx != pieces.end() && it->second.first == nx->first &&
                it->second.second == nx->second.second) {
                it->second.first = nx->second.first;
                pieces.erase(nx);
            } else {
                it = nx;
            }
        }
    }
    bool operator==(const Content& o) const { return size == o.size && pieces == o.pieces; }
};

struct World {
    std::map<std::string, Content> buf;
    std::map<std::string, uint64_t> rng;   // draws so far per stream
};

// A recompute's writes are tagged apart from the forward's (bit 62), so writing the "same"
// version twice is seen as a leak.
constexpr uint64_t kRecomputeTag = 1ull << 62;

void apply_writes(World& w, const Segment& s, uint64_t tag) {
    for (const auto& a : s.state)
        if (a.written) {
            Content& c = w.buf[a.buffer];
            c.resize(a.bytes_written);
            for (const auto& r : a.regions) c.assign(r.offset, r.offset + r.length, a.version_written | tag);
        }
    for (const auto& g : s.rng) ++w.rng[g.stream];
}

}  // namespace

SimReport simulate(const Problem& p, const std::vector<Decision>& d) {
    const Trace& t = *p.trace;
    if (d.size() != t.segments.size()) throw std::invalid_argument("decision count mismatch");
    SimReport rep;
    World w;
    for (const auto& b : t.buffers) w.buf[b.id] = Content::initial(b.bytes);
    // Reference content of every (buffer, version), and the RNG position before each segment.
    std::map<std::pair<std::string, uint64_t>, Content> at_version;
    std::vector<std::map<std::string, uint64_t>> rng_before(t.segments.size());
    struct Kept {
        std::map<std::string, Content> whole;
        std::map<std::string, uint64_t> rng;
    };
    std::vector<Kept> kept(t.segments.size());

    for (size_t i = 0; i < t.segments.size(); ++i) {
        const Segment& s = t.segments[i];
        for (const auto& a : s.state) at_version[{a.buffer, a.version_read}] = w.buf[a.buffer];
        rng_before[i] = w.rng;
        if (d[i] == Decision::Snapshot || d[i] == Decision::Selective) {
            // What the runtime copies at forward time. Selective keeps only the contract's
            // regions: modelled as the current content with every other byte marked unknown.
            for (const auto& r : p.contracts[i].restore) {
                const Content& cur = w.buf[r.buffer];
                if (d[i] == Decision::Snapshot) {
                    kept[i].whole[r.buffer] = cur;
                } else {
                    Content part = Content::initial(cur.size);
                    part.assign(0, cur.size, ~0ull - 1);
                    for (const auto& g : r.regions) part.copy_from(cur, g.offset, g.offset + g.length);
                    kept[i].whole[r.buffer] = part;
                }
            }
            for (const auto& g : p.contracts[i].rng) kept[i].rng[g.stream] = w.rng[g.stream];
        }
        apply_writes(w, s, 0);
    }
    const World end = w;

    for (size_t i = t.segments.size(); i-- > 0;) {
        if (d[i] == Decision::Keep) continue;
        const Segment& s = t.segments[i];
        const Contract& c = p.contracts[i];
        ++rep.recomputes;
        if (!c.replayable)
            rep.violations.push_back(fmt::format("segment {}: recomputed but not replayable ({})",
                                                 s.name, s.non_replayable));
        World before = w;
        if (d[i] != Decision::Recompute) {
            for (const auto& r : c.restore) {
                Content& cur = w.buf[r.buffer];
                const Content& saved = kept[i].whole[r.buffer];
                if (d[i] == Decision::Snapshot) {
                    cur = saved;
                } else {
                    cur.resize(r.bytes);   // bytes appended after the read are dropped
                    for (const auto& g : r.regions) cur.copy_from(saved, g.offset, g.offset + g.length);
                }
            }
            for (const auto& [stream, pos] : kept[i].rng) w.rng[stream] = pos;
        }
        for (const auto& a : s.state) {
            if (!a.read) continue;
            ++rep.reads_checked;
            if (!(w.buf[a.buffer] == at_version.at({a.buffer, a.version_read})))
                rep.violations.push_back(fmt::format(
                    "segment {}: recompute reads '{}' but does not see version {}", s.name,
                    a.buffer, a.version_read));
        }
        for (const auto& g : s.rng) {
            ++rep.reads_checked;
            if (w.rng[g.stream] != rng_before[i][g.stream])
                rep.violations.push_back(fmt::format(
                    "segment {}: recompute draws RNG stream '{}' at position {} instead of {}",
                    s.name, g.stream, w.rng[g.stream], rng_before[i][g.stream]));
        }
        apply_writes(w, s, kRecomputeTag);
        if (d[i] != Decision::Recompute) {
            for (const auto& r : c.restore) w.buf[r.buffer] = before.buf[r.buffer];
            for (const auto& x : c.discard) w.buf[x.buffer] = before.buf[x.buffer];
            for (const auto& g : c.rng) w.rng[g.stream] = before.rng[g.stream];
        }
        for (const auto& [id, content] : w.buf)
            if (!(content == end.buf.at(id)))
                rep.violations.push_back(fmt::format(
                    "segment {}: recompute leaks a write to '{}'", s.name, id));
        for (const auto& [stream, pos] : w.rng)
            if (end.rng.count(stream) == 0 || pos != end.rng.at(stream))
                rep.violations.push_back(fmt::format(
                    "segment {}: recompute leaks RNG draws on stream '{}'", s.name, stream));
        w = end;   // report each leak once; later segments start from the forward's end state
    }
    return rep;
}

}  // namespace ckpt::replay
