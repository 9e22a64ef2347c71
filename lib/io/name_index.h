// NameIndex: name -> position for names the caller already stores (zip entry names,
// pickle storage keys), in one flat array.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace ckpt::io {

/// Open addressing with linear probing over std::hash<std::string_view>, slots of (hash,
/// position + 1) in one array at most half full. A std::unordered_map spends a heap node per
/// name, and on files of 10^5 tensors each lookup then costs cache and TLB misses (the time
/// grew faster than the count: docs/benchmarks.md, "Measurements behind the code's
/// choices"); here a lookup reads one slot run and the one name it compares. `name_of(i)`
/// gives the caller's name at position i. Not thread-safe.
class NameIndex {
public:
    static constexpr std::size_t npos = ~std::size_t(0);

    /// Position of `name`, or npos.
    template <class NameOf>
    std::size_t find(std::string_view name, NameOf&& name_of) const {
        if (slots_.empty()) return npos;
        const Slot& s = slots_[probe(name, std::hash<std::string_view>{}(name), name_of)];
        return s.pos1 ? s.pos1 - 1 : npos;
    }

    /// Record `name` at position `pos` unless it is present; returns the position it has
    /// (pos when it was new).
    template <class NameOf>
    std::size_t insert(std::string_view name, std::size_t pos, NameOf&& name_of) {
        if (2 * (count_ + 1) > slots_.size()) grow();
        const uint64_t h = std::hash<std::string_view>{}(name);
        Slot& s = slots_[probe(name, h, name_of)];
        if (s.pos1) return s.pos1 - 1;
        s = {h, uint64_t(pos) + 1};
        ++count_;
        return pos;
    }

    /// Room for n names without growing.
    void reserve(std::size_t n) {
        while (2 * n > slots_.size()) grow();
    }

private:
    struct Slot {
        uint64_t hash = 0;
        uint64_t pos1 = 0;  ///< position + 1; 0 = empty
    };
    std::size_t mask() const { return slots_.size() - 1; }
    /// The slot holding `name` (hash h), or the empty slot that ends its run.
    template <class NameOf>
    std::size_t probe(std::string_view name, uint64_t h, NameOf& name_of) const {
        std::size_t s = h & mask();
        while (slots_[s].pos1 && !(slots_[s].hash == h && std::string_view(name_of(slots_[s].pos1 - 1)) == name))
            s = (s + 1) & mask();
        return s;
    }
    void grow() {
        std::vector<Slot> old(slots_.empty() ? 16 : 2 * slots_.size());
        old.swap(slots_);
        for (const Slot& o : old)
            if (o.pos1) {
                std::size_t s = o.hash & mask();
                while (slots_[s].pos1) s = (s + 1) & mask();
                slots_[s] = o;
            }
    }
    std::vector<Slot> slots_;
    std::size_t count_ = 0;
};

}  // namespace ckpt::io
