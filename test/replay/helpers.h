// Shared helpers of the replay units: example trace paths and a tiny trace builder.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay/trace.h"

namespace replay_test {

/// data/traces/NAME
inline std::string trace_path(const std::string& name) {
    return std::string(CKPT_SOURCE_DIR) + "/data/traces/" + name;
}

/// The recorder traces of the seven failure-pattern models.
inline std::vector<std::string> model_traces() {
    return {"bn.trace.json", "dropout.trace.json", "kvcache.trace.json", "counter.trace.json",
            "ema.trace.json", "sparse_write.trace.json", "dense_queue.trace.json"};
}

/// Validate a hand-built trace through the JSON reader (fills hash; throws BadInput).
inline ckpt::replay::Trace finish(const ckpt::replay::Trace& t) {
    return ckpt::replay::trace_from_json(ckpt::replay::trace_to_json(t), "<test>");
}

/// A stateless segment.
inline ckpt::replay::Segment seg(const std::string& name, double fwd_ms, uint64_t saved,
                                 uint64_t in, uint64_t transient) {
    ckpt::replay::Segment s;
    s.name = name;
    s.forward_ms = fwd_ms;
    s.backward_ms = 2 * fwd_ms;
    s.saved_bytes = saved;
    s.input_bytes = in;
    s.output_bytes = in;
    s.transient_bytes = transient;
    return s;
}

}  // namespace replay_test
