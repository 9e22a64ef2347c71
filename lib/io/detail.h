// Helpers shared by the readers in lib/io (not part of the public interface).
#pragma once
#include "io/checkpoint.h"
#include "io/file.h"

namespace ckpt::io {

/// Checked a*b for sizes; nullopt on overflow.
std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b);

/// Final validation every reader runs: each storage has nbytes == numel * dtype size and lies
/// inside the file, storages are sorted by file_offset (tensor indices remapped) and do not
/// overlap, and every tensor view (offset + extent from shape/stride, in bytes of the tensor
/// dtype) lies inside its storage. Throws BadInput naming the first violation.
void finalize_checkpoint(Checkpoint& ck);

}  // namespace ckpt::io
