// A safe unpickler for torch checkpoints (FACTS.md "torch.save zip format"): it builds
// ckpt::Value trees and executes nothing. GLOBAL is checked against an allowlist mirroring
// torch.load(weights_only=True); every other global, bad opcode, truncation, oversize
// length field, limit overflow or stack/MARK misuse is BadInput.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/file.h"

namespace ckpt::io {

/// A storage named by a persistent id ('storage', torch.<X>Storage, key, location, numel[, view]).
struct PickleStorage {
    std::string key;        ///< storage key ("0", or str(id) in legacy files)
    DType dtype = DType::U8;
    uint64_t numel = 0;     ///< elements of dtype (UntypedStorage: bytes)
    std::string location;   ///< "cpu", "cuda:0", ...
};

/// A tensor rebuilt by torch._utils._rebuild_tensor_v2/_v3: a strided view of a storage.
struct PickleTensor {
    std::size_t storage = 0;       ///< index into PickleResult::storages
    DType dtype = DType::F32;
    int64_t storage_offset = 0;    ///< elements
    std::vector<int64_t> shape;    ///< elements; empty for 0-d
    std::vector<int64_t> stride;   ///< elements
};

/// Which persistent ids the pickle may carry.
enum class PersistentIds {
    None,          ///< none allowed (legacy header pickles)
    TorchZip,      ///< 5-tuples of torch.save zip files
    TorchLegacy,   ///< 6-tuples (view metadata must be None) of legacy torch files
};

/// The unpickled object and what it references. Value::Tensor indices point into `tensors`.
struct PickleResult {
    Value root;
    std::vector<PickleStorage> storages;   ///< deduplicated by key, first-seen order
    std::vector<PickleTensor> tensors;
};

/// Unpickle one pickle (through STOP) from `in`, which is left just after STOP.
/// Protocols 2-5 opcodes as emitted by CPython's Pickler for plain data are understood.
/// Throws BadInput naming the file and the offending opcode offset.
PickleResult unpickle(RangeReader& in, const Limits& limits, PersistentIds ids);

}  // namespace ckpt::io
