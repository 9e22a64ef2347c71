// Replay simulator (docs/design.md §5 validation (a)): executes a plan over its trace with a logical
// model of every buffer (an interval map byte range -> version that last wrote it, plus the
// size) and of every RNG stream (a draw counter), independently of the contract derivation.
//
// Forward: segments in order; reads are checked, writes applied, preservations taken as the
// decision says (snapshot: the whole map; selective: the contract's regions + the size).
// Backward: segments in reverse; a recomputed segment gets its preservations restored (plain
// recompute: nothing), then every read must see exactly the content of the recorded version
// and every RNG stream its recorded position; its writes are applied, the contract's discard
// puts the pre-recompute state back, and no buffer or stream may differ from the state at the
// end of the forward (no leak).
#pragma once
#include <string>
#include <vector>

#include "replay/planner.h"

namespace ckpt::replay {

/// Result of a simulation: ok when violations is empty.
struct SimReport {
    std::vector<std::string> violations;   ///< one line each, naming segment and buffer/stream
    size_t reads_checked = 0;              ///< recomputed reads verified (buffers + RNG)
    size_t recomputes = 0;                 ///< segments recomputed
    bool ok() const { return violations.empty(); }
};

/// Simulate decisions `d` (one per segment) over p's trace. Throws std::invalid_argument when
/// d has the wrong size.
SimReport simulate(const Problem& p, const std::vector<Decision>& d);

}  // namespace ckpt::replay
