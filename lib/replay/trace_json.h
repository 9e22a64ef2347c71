// Reading trace JSON (internal to ckpt_replay): the one JSON model for traces is simdjson's
// DOM (simdjson 3.0.1). parse_trace_json() parses, refuses what a trace may not hold (numbers
// no double or 64-bit integer holds, duplicate keys) with one BadInput naming it; the readers
// trace.cpp (ckptkit traces) and et_import.cpp (PyTorch Execution Traces) walk the element.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <simdjson.h>

#include "replay/trace.h"

namespace ckpt::replay {

/// Bytes of zero padding simdjson reads past the end of a text (SIMDJSON_PADDING).
constexpr size_t kJsonPadding = simdjson::SIMDJSON_PADDING;

/// Largest trace text simdjson's DOM parses (bytes; its 32-bit tape offsets).
constexpr uint64_t kMaxJsonBytes = simdjson::SIMDJSON_MAXSIZE_BYTES;

/// A parsed trace document. `root` points into `parser`: it lives as long as this object.
struct JsonDoc {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
};

/// Parse the first `len` bytes of `text` (strict JSON; a leading UTF-8 byte-order mark is
/// skipped). text.size() must be >= len + kJsonPadding (the padding bytes are not part of the
/// JSON). Throws BadInput{file, ...}: "not valid JSON: <simdjson's reason>", "number N is out
/// of range" (a number no double holds, e.g. 1e999, or an integer outside int64/uint64, e.g.
/// 400 digits; N cut to 20 characters + "..."), "duplicate key 'K' in WHERE" (any object at
/// any depth; WHERE is the JSON path, e.g. segments[3].state[0], or "the top-level object"),
/// "larger than 4 GiB". std::bad_alloc when the parser's memory cannot be had.
void parse_trace_json(JsonDoc& doc, const std::string& text, size_t len, const std::string& file);

/// Member `key` of object `o`, or nullopt (also when `o` is no object).
std::optional<simdjson::dom::element> member(simdjson::dom::element o, std::string_view key);

/// True for a JSON integer that simdjson holds as int64 or uint64 (a float, even 2.0, is not).
inline bool is_integer(simdjson::dom::element v) { return v.is_int64() || v.is_uint64(); }

/// Read a ckptkit trace (formats/trace.md) from its root element; hash left empty. Throws
/// BadInput{file, "<json path>: <what is wrong>"}.
Trace read_ckptkit_trace(simdjson::dom::element root, const std::string& file);

/// Import a PyTorch Execution Trace from its root element (see import_execution_trace in
/// trace.h); hash left empty. Throws BadInput.
Trace read_execution_trace(simdjson::dom::element root, const std::string& file);

}  // namespace ckpt::replay
