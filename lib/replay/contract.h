// Replay contracts (docs/design.md §5): what a recomputed segment must restore and discard so that
// its recompute sees exactly the state versions and RNG state of its original forward and
// leaks no write. Derived from the trace alone.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "replay/trace.h"

namespace ckpt::replay {

/// A buffer a recomputed segment must see at `version` (its bytes_read size). `regions` are
/// the byte ranges (layout at read time) overwritten between the segment's read and its
/// recompute: a selective preservation copies exactly these; a snapshot copies `bytes` whole.
struct RestoreEntry {
    std::string buffer;
    uint64_t version = 0;
    uint64_t bytes = 0;                 ///< buffer size at read time
    std::vector<Region> regions;        ///< hazardous byte ranges (sorted, disjoint)
    uint64_t region_bytes() const;      ///< sum of region lengths
};

/// A write of the segment that its recompute must not leak (the buffer's current contents are
/// put back after the recompute).
struct DiscardEntry {
    std::string buffer;
    uint64_t version_written = 0;
    uint64_t bytes = 0;                 ///< buffer size after the write
    std::vector<Region> regions;
};

/// The versioned contract of one segment. id = "<trace hash>:<segment>:<buffer@version,...>"
/// so a runtime can refuse a plan made for another trace or other versions.
struct Contract {
    std::string id;
    std::vector<RestoreEntry> restore;
    std::vector<RngUse> rng;            ///< RNG states to restore before, and put back after
    std::vector<DiscardEntry> discard;
    std::vector<std::string> hazards;   ///< human-readable reasons plain recompute is unsafe
    bool replayable = true;             ///< false: no contract makes a recompute exact (the
                                        ///< trace's non_replayable reason is in hazards)

    /// True when plain recompute would break the contract (anything to restore or discard,
    /// or the segment is not replayable at all).
    bool stateful() const {
        return !replayable || !restore.empty() || !rng.empty() || !discard.empty();
    }
};

/// Bytes of index metadata per preserved region (offset and length, 2 x int64).
constexpr uint64_t kRegionMetaBytes = 16;

/// Per-segment contracts for a trace (same order as trace.segments). A read of buffer B by
/// segment s is hazardous when s or any later segment writes B (the recompute runs in backward,
/// after the whole forward); the regions are the union of those writes clipped to the size at
/// read time (bytes appended later are dropped by truncation, nothing to copy).
std::vector<Contract> derive_contracts(const Trace& t);

/// Merge sorted disjoint regions separated by fewer than max_gap bytes. Used with
/// kRegionMetaBytes for selective preservation: copying a short unchanged gap costs less than
/// one more region's metadata, and restoring unchanged bytes is harmless, so selective never
/// holds more than a whole snapshot + kRegionMetaBytes.
std::vector<Region> coalesce_regions(const std::vector<Region>& rs, uint64_t max_gap);

/// Union of sorted disjoint region lists, clipped to [0, limit).
std::vector<Region> region_union(const std::vector<Region>& a, const std::vector<Region>& b,
                                 uint64_t limit);

}  // namespace ckpt::replay
