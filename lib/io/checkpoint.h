// The format-neutral view of a checkpoint file that every reader produces.
// A checkpoint file is a byte string; readers locate every tensor storage in it
// (a byte range) and describe every tensor as a view of one storage.
// Everything that is not a storage range (pickle, zip headers, JSON header) is
// kept verbatim by the container, so a restore can rebuild the file exactly.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace ckpt {

/// Element types met in torch.save and safetensors files (FACTS.md).
enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool, C64, C128,
                   F8_E5M2, F8_E4M3, U16, U32, U64 };
/// Bytes per element.
std::size_t dtype_size(DType);
/// safetensors spelling ("F32", "BF16", ...).
const char* dtype_name(DType);
/// Parse a safetensors spelling; nullopt when unknown.
std::optional<DType> dtype_from_name(const std::string&);

/// Configurable size limits for untrusted input (SPEC §4). Exceeding one is BadInput.
struct Limits {
    uint64_t max_header_bytes = 100'000'000;   ///< safetensors JSON header (reference reader)
    uint64_t max_pickle_bytes = 1ull << 30;    ///< data.pkl / legacy pickle
    uint64_t max_memo_entries = 1u << 24;      ///< pickle memo size
    uint64_t max_objects = 1u << 26;           ///< pickle stack + containers, total
    uint64_t max_zip_entries = 1u << 20;       ///< central-directory records
};

/// One storage: a contiguous byte range of the input file.
struct StorageInfo {
    std::string key;              ///< torch storage key ("0", "1", ...) or safetensors tensor name
    DType dtype = DType::U8;      ///< element type of the storage
    uint64_t numel = 0;           ///< elements
    uint64_t file_offset = 0;     ///< bytes from start of file
    uint64_t nbytes = 0;          ///< == numel * dtype_size(dtype)
    /// File offsets of little-endian u32 CRC-32 fields covering exactly this range
    /// (zip local header / data descriptor / central directory). A restore that changes
    /// the bytes must rewrite them. Empty for formats without checksums.
    std::vector<uint64_t> crc_offsets;
};

/// One tensor: a strided view of a storage.
struct TensorInfo {
    std::string path;              ///< object path, '/'-joined: "optimizer/state/3/exp_avg"
    std::size_t storage = 0;       ///< index into Checkpoint::storages
    DType dtype = DType::F32;
    std::vector<int64_t> shape;    ///< elements; empty for 0-d
    std::vector<int64_t> stride;   ///< elements
    int64_t storage_offset = 0;    ///< elements
};

/// A decoded Python value from the checkpoint's object tree (pickle or safetensors header).
/// Tensors appear as Tensor{index into Checkpoint::tensors}.
struct Value {
    struct None {};
    struct Tensor { std::size_t index; };
    using List = std::vector<Value>;                              // list or tuple
    using Dict = std::vector<std::pair<Value, Value>>;            // dict / OrderedDict, insertion order
    std::variant<None, bool, int64_t, double, std::string, Tensor, List, Dict> v;
    bool is_tuple = false;   ///< List came from a tuple
    bool is_bytes = false;   ///< string holds raw bytes (python bytes)

    // Special members are defined out of line (checkpoint.cpp), where Value is complete:
    // defaulted in the class, clang 14 with libstdc++ 12 in C++20 instantiates the variant's
    // constexpr destructor, hence ~vector<pair<Value, Value>>, while pair<Value, Value> is
    // still incomplete, and rejects the type. GCC accepts either form.
    Value();                                  ///< None
    ~Value();                                 ///< destroys the subtree
    Value(const Value&);                      ///< deep copy
    Value(Value&&) noexcept;                  ///< move
    Value& operator=(const Value&);           ///< deep copy
    Value& operator=(Value&&) noexcept;       ///< move

    const Value* get(const std::string& key) const;   ///< Dict lookup by str or int key text; nullptr if absent
    bool is_dict() const { return std::holds_alternative<Dict>(v); }
    bool is_list() const { return std::holds_alternative<List>(v); }
    std::string key_text() const;                      ///< str or int rendered as text (for paths)
};

enum class Format { TorchZip, TorchLegacy, Safetensors };
const char* format_name(Format);

/// A parsed checkpoint: its storages (byte ranges of the file), tensors and object tree.
/// Readers validate every offset before returning: each storage range lies inside the
/// file, ranges do not overlap, and each tensor view lies inside its storage.
struct Checkpoint {
    std::string path;
    Format format = Format::TorchZip;
    uint64_t file_size = 0;                ///< bytes
    std::vector<StorageInfo> storages;     ///< sorted by file_offset
    std::vector<TensorInfo> tensors;
    Value root;                            ///< the unpickled object / safetensors dict (+ "__metadata__")
};

/// Open any supported checkpoint by sniffing its first bytes. Throws BadInput.
Checkpoint read_checkpoint(const std::string& path, const Limits& = {});

}  // namespace ckpt
