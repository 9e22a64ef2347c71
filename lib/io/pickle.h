// A safe unpickler for torch checkpoints (torch/serialization.py _save/_load): it builds
// ckpt::Value trees and calls nothing. Globals on the allowlist of torch.load(weights_only=True)
// (torch/_weights_only_unpickler.py) are modelled: tensors, OrderedDict, torch.Size, ...; any
// other global and what REDUCE / NEWOBJ / NEWOBJ_EX / BUILD / APPEND(S) / SETITEM(S) do with it
// is recorded as an opaque Value::Object, or refused when Limits::strict is set. Globals that
// can run code when the file is torch.load-ed (os.*, subprocess.*, builtins.eval, torch.load,
// ...) are BadInput in every mode, as is a bad opcode, truncation, oversize length field,
// limit overflow or stack/MARK misuse.
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

/// A tensor rebuilt by torch._utils._rebuild_tensor/_v2/_v3 (also under _rebuild_parameter*,
/// nn.Parameter and _rebuild_from_type_v2), or a bare storage seen as a 1-d view of all of it.
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
/// Every opcode of protocols 2-5 that does not need the running interpreter is understood,
/// plus the protocol-0 text forms INT, LONG, FLOAT, PUT and GET; EXT1/2/4 (copyreg registry),
/// NEXT_BUFFER/READONLY_BUFFER (out-of-band buffers) and the protocol-0/1 string and calling
/// opcodes (STRING, UNICODE, PERSID, INST, OBJ) are refused. Throws BadInput naming the file
/// and the offending opcode offset.
PickleResult unpickle(RangeReader& in, const Limits& limits, PersistentIds ids);

}  // namespace ckpt::io
