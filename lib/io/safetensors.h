// safetensors reader applying every rule of the reference implementation (docs/design.md
// "safetensors"; huggingface/safetensors `SafeTensors::read_metadata`/`validate`).
#pragma once
#include "io/checkpoint.h"
#include "io/file.h"

namespace ckpt::io {

/// Read the header of a safetensors file: u64 little-endian N (<= limits.max_header_bytes),
/// N bytes of UTF-8 JSON starting with '{' (trailing spaces allowed), no duplicate keys,
/// `__metadata__` string -> string, entries {dtype, shape, data_offsets} whose sorted
/// ranges tile the buffer exactly from 0 to end of file with e-b == numel * dtype size.
/// Each tensor becomes its own storage (key = name) and a contiguous tensor (path = name).
/// Root = dict name -> Tensor in header order, plus "__metadata__" when present. Throws BadInput.
Checkpoint read_safetensors(const InputFile&, const Limits&);

}  // namespace ckpt::io
