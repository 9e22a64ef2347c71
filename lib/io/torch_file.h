// Readers for torch.save files (torch/serialization.py): the zip format (torch >= 1.6) and the legacy
// non-zip format (_use_new_zipfile_serialization=False). Both return a Checkpoint whose
// storages are not yet sorted; read_checkpoint() runs finalize_checkpoint() on it.
#pragma once
#include "io/checkpoint.h"
#include "io/file.h"

namespace ckpt::io {

/// Read a torch.save zip: prefix from the first entry, <prefix>/data.pkl unpickled safely,
/// each storage from <prefix>/data/<key> with size == numel * dtype size. Throws BadInput
/// for a missing or short storage record, a big-endian file, or any zip/pickle error.
Checkpoint read_torch_zip(const InputFile&, const Limits&);

/// True when the file starts with the pickled legacy magic number 0x1950a86a20f9469cfc6c.
bool is_torch_legacy(const InputFile&);

/// Read a legacy torch file: magic, protocol 1001, sys_info (little-endian only), main
/// pickle, pickled key list, then per key an int64 element count and the raw bytes.
/// Throws BadInput when any part is malformed or the file does not end after the last storage.
Checkpoint read_torch_legacy(const InputFile&, const Limits&);

}  // namespace ckpt::io
