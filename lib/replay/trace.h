// The execution trace of one training step (formats/trace.md, docs/design.md §5): segments in forward
// order with their activation sizes, times and state accesses. Framework-neutral; produced by
// scripts/record_trace.py, scripts/fixtures/synth_trace.py or imported from a PyTorch Execution Trace.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ckpt::replay {

/// A byte range [offset, offset + length) of a buffer.
struct Region {
    uint64_t offset = 0;
    uint64_t length = 0;
    bool operator==(const Region&) const = default;
};

/// One segment's access to one mutable buffer. Versions are logical: 0 before the step,
/// +1 for every segment that writes the buffer. bytes_* are the buffer's size (bytes) when
/// read / after the write; regions are the byte ranges the write changed (layout after it).
struct StateAccess {
    std::string buffer;
    bool read = true;             ///< the segment reads the buffer (at version_read)
    bool written = false;         ///< the segment writes it (then version_written, regions)
    uint64_t version_read = 0;
    uint64_t version_written = 0;
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
    std::vector<Region> regions;
    int64_t arg = -1;             ///< v2: index of the segment's tensor argument that is this
                                  ///< state (a buffer passed in, the segment's input); -1: none
};

/// RNG consumption of a segment: which stream and the size of its state (bytes).
struct RngUse {
    std::string stream;
    uint64_t state_bytes = 0;
};

/// One op of a segment's forward (v2, optional `ops[]`, the torch recorder's op table): the
/// aten op (`aten.mm.default`), its occurrence `k` among that op's calls in the segment (the
/// key torch's selective checkpointing counts by), the bytes of the fresh storages it outputs
/// and its measured time (ms). `fixed` non-empty: why it must stay under the segment's replay
/// (inplace, view, random, state, mutated, ignored, empty); else an op plan may save it.
struct OpCost {
    std::string op;
    uint64_t k = 0;
    uint64_t bytes = 0;
    double ms = 0;
    std::string fixed;
    bool saveable() const { return fixed.empty() && bytes > 0; }
};

/// A segment: forward/backward time (ms), bytes it keeps for backward (saved_bytes), bytes of
/// its input and output at the boundary, transient peak above saved_bytes while it runs
/// forward or backward (the incoming output gradient and backward temporaries included).
struct Segment {
    std::string name;
    double forward_ms = 0;
    double backward_ms = 0;
    uint64_t saved_bytes = 0;
    uint64_t input_bytes = 0;
    uint64_t output_bytes = 0;
    uint64_t transient_bytes = 0;
    std::vector<StateAccess> state;
    std::vector<RngUse> rng;
    /// Empty when the segment can be recomputed; else why not (format v2: the recorder's
    /// replay probe found hidden state, e.g. a Python global or a non-tensor attribute, or it
    /// touches a tensor no contract can restore). Planners always keep such a segment.
    std::string non_replayable;
    /// v2, optional: XXH3-64 (16 hex digits) of the segment's forward op sequence as the
    /// recorder saw it (ops, dtypes, scalar arguments; formats/trace.md). Plans copy it so a
    /// runtime can refuse a plan for a model whose segment now computes something else.
    std::string ops_hash;
    /// v2, optional: the forward's ops with their output bytes and times (OpCost), for
    /// op-level plans (planner_ops.cpp); empty when not recorded.
    std::vector<OpCost> ops;
};

/// A piece of mutable state (id, size in bytes before the step). kind (format v2): "buffer"
/// (a module buffer, id = its name), "param" (a parameter written in place), "input" (a
/// segment's input tensor, id = "SEGMENT.input[k]"); v1 traces have buffers only.
struct BufferInfo {
    std::string id;
    uint64_t bytes = 0;
    std::string kind = "buffer";
};

/// The whole trace. hash identifies it in plans: trace_hash() of the bytes it was read from.
struct Trace {
    int format_version = 2;           ///< 1 or 2 as read (written: always 2)
    std::string source;
    std::string model;
    std::string fingerprint;          ///< v2: hash of the model's parameter / buffer names,
                                      ///< shapes and dtypes ("" when unknown)
    double copy_gbps = 10.0;          ///< device copy bandwidth for snapshot costs (GB/s)
    uint64_t param_bytes = 0;
    uint64_t grad_bytes = 0;
    uint64_t optimizer_bytes = 0;
    uint64_t outside_bytes = 0;       ///< v2, optional: live outside every segment during the
                                      ///< step (batch, loss, outputs computed outside segments)
    uint64_t step_bytes = 0;          ///< v2, optional: the optimizer step's temporaries (above
                                      ///< the fixed memory, after the activations are freed)
    std::vector<BufferInfo> buffers;
    std::vector<Segment> segments;    ///< forward order; backward runs in reverse
    bool op_tables = false;           ///< v2: the segments carry ops[] (recorded with ops=True)
    std::string hash;                 ///< trace_hash() of the text read (16 hex digits)

    /// Params + grads + optimizer state + memory outside segments + the mutable buffers at
    /// their initial size (bytes): what every plan holds whatever it recomputes.
    uint64_t fixed_bytes() const {
        uint64_t b = param_bytes + grad_bytes + optimizer_bytes + outside_bytes;
        for (const auto& x : buffers) b += x.bytes;
        return b;
    }
};

/// Read a trace file: the ckptkit format, a PyTorch Execution Trace (schema 1.0.1) or the
/// Chakra-style nested schema (detected from the JSON). Trace::hash = trace_hash() of the
/// file's bytes. Throws ckpt::BadInput{path, what} for unreadable, malformed or inconsistent
/// input (duplicate keys and numbers no double / 64-bit integer holds included).
Trace load_trace(const std::string& path);

/// As load_trace for `text` held in memory (either kind, detected); `file` names it in
/// errors. Trace::hash = trace_hash(text). Throws BadInput{file, what}.
Trace parse_trace(std::string_view text, const std::string& file);

/// A ckptkit trace from a nlohmann value (tests, the fuzz round trip): parse_trace() of
/// j.dump(), so the one reader validates it; hash = trace_hash(j.dump()). Throws BadInput,
/// also when j is an Execution Trace.
Trace trace_from_json(const nlohmann::json& j, const std::string& file);

/// Serialise to the ckptkit trace format (formats/trace.md).
nlohmann::json trace_to_json(const Trace& t);

/// Import a PyTorch Execution Trace (torch 1.13 ExecutionGraphObserver schema 1.0.1, or the
/// Chakra-style nested schema) given as a nlohmann value: parse_trace() of j.dump() (load_trace
/// reads files the same way). Segments are the record_function nodes named
/// "ckpt.segment:NAME"; writes come from `(a!)` annotations in op_schema (plus
/// native_batch_norm's unannotated running stats); sizes from the tensor tuples
/// [tensor_id, storage_id, offset, numel, itemsize, device]; RNG from random ops. Forward time
/// is the node's `dur` (us) when present, else 0.01 ms per op (schema 1.0.1 has no times).
/// Throws BadInput, also when j is a ckptkit trace.
Trace import_execution_trace(const nlohmann::json& j, const std::string& file);

/// The trace hash plans carry (formats/trace.md, formats/plan.md): XXH3-64 (seed 0) of the
/// trace's bytes exactly as stored, as 16 lowercase hex digits (python: xxhash.xxh3_64_hexdigest).
std::string trace_hash(std::string_view bytes);

/// Name of trace_hash()'s algorithm, as plans record it ("trace": {"hash_algorithm": ...}).
inline constexpr const char* kTraceHashAlgorithm = "xxh3-64";

}  // namespace ckpt::replay
