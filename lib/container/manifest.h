// The container's manifest: one JSON document (root attribute "manifest") that says how
// to rebuild the source file from /raw and the moment streams. Layout and every field:
// formats/container.md. Parsing validates types and ranges so a hostile or damaged
// container gives a clear error instead of a crash.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codec/codec.h"
#include "container/h5.h"
#include "io/dtype.h"

namespace ckpt::container {

/// Format written: 4 (vlog segments in mode 3: sixteen rANS states, 16-bit words; 3 had
/// four byte-wise states, 2 added vlog and its segments with two). Readers accept 1 to 4.
constexpr int kFormatVersion = 6;
constexpr int kOldestFormatVersion = 1;
/// Dataset paths (formats/container.md).
constexpr const char* kRaw = "/raw";
extern const char* const kRoleNames[3];   ///< exp_avg, exp_avg_sq, max_exp_avg_sq
std::string codes_path(int role);          ///< /moments/codes/<role>
std::string params_path(int role);         ///< /moments/params/<role>
std::string escapes_path(int role);        ///< /moments/escapes/<role>
std::string segments_path(int role);       ///< /moments/segments/<role> (entropy-coded codecs)
constexpr const char* kEscapeIndex = "/moments/escapes/index";

constexpr const char* kManifestPath = "/manifest";   ///< uint8 JSON, zstd, xxh3

/// One storage (byte range) of the source file.
struct StorageEntry {
    uint64_t offset = 0, nbytes = 0;   ///< bytes, in the source file
    uint64_t xxh3 = 0;                 ///< of the original bytes
    int param = -1, role = -1;         ///< moment storage of params[param], role; -1 if raw
    std::vector<uint64_t> crc_offsets; ///< zip CRC-32 fields to rewrite after decoding
};

/// One parameter's encoded moments.
struct ParamEntry {
    std::string name;
    uint64_t numel = 0;
    std::vector<int64_t> shape;        ///< of exp_avg (report only; absent in older containers)
    DType dtype = DType::F32;          ///< of the moments: F32, F16 or BF16
    codec::AdamHyper hyper;
    codec::DomainRule domain;
    int64_t theta_storage = -1;        ///< storage index of theta (raw), -1 when absent
    std::optional<DType> theta_dtype;  ///< F32, F16 or BF16 when theta_storage >= 0, else none
    int theta_candidates = 0;          ///< > 0: theta not mapped; |theta| <= domain.theta_bound is the
                                       ///< max over this many same-shape model tensors
    uint64_t code_offset = 0;          ///< values into /moments/codes/* (x code bytes); for an
                                       ///< entropy-coded codec, segments into /moments/segments/*
    uint64_t block_offset = 0;         ///< blocks into /moments/params/* (x params/block)
    uint64_t escape_offset = 0, escapes = 0;  ///< rows of the escape table
    double max_bound = 0;              ///< largest certificate kept, lr units
    std::array<uint64_t, 3> escape_causes{};  ///< escapes per codec::EscapeCause (sum <= escapes; = from ckpt-compress)
    bool row_predict = false;          ///< vlog: exp_avg_sq codes sent row-predicted (codec::vlog_rows)
    int storage[3] = {-1, -1, -1};     ///< StorageEntry index per role
    int moments() const { return hyper.amsgrad ? 3 : 2; }
};

/// The codec's name for a moment float type (F32, F16 or BF16; any other type maps to BF16).
codec::MomentType moment_type(DType);
/// What the codec needs to encode or decode parameter e: its hyper-parameters, domain and
/// moment type, under the container's codec and tolerance (lr units), as container format
/// `format_version` decodes it (TensorSetup::format6 from 6).
codec::TensorSetup tensor_setup(const ParamEntry& e, codec::Kind kind, double tolerance,
                                int format_version = kFormatVersion);

/// An optimizer state kept exact (its moments stay in /raw), for the reports.
struct KeptEntry {
    std::string name;
    uint64_t values = 0, nbytes = 0;   ///< moment values, their bytes in the source
    std::string note;                  ///< why ("kept exact: NAdam state (not Adam)")
};

struct Manifest {
    int format_version = kFormatVersion;
    std::string tool_version;
    std::string source_format;         ///< torch-zip, torch-legacy, safetensors
    std::string source_name;
    uint64_t source_size = 0;
    codec::Kind codec = codec::Kind::Log8;
    int block = codec::kBlock;
    double tolerance = 0.01, grad_bound = 1.0;
    std::string optimizer = "auto";
    double param_bound = -1;           ///< --param-bound B, -1 when not given
    /// Updates the certificates cover: 0 every update after restore ("all", format 5), 1 the
    /// first (formats 1-4, and --horizon 1). Copied into every params entry's hyper.
    int horizon = 1;
    /// --bound param ("bound": "param", format 6; absent: the update): copied into every
    /// params entry's hyper.
    bool bound_param = false;
    std::vector<StorageEntry> storages;   ///< sorted by offset, non-overlapping
    std::vector<ParamEntry> params;
    std::vector<KeptEntry> kept;

    /// Compact JSON with sorted keys (nlohmann's dump formats numbers and strings; entries
    /// are written one by one, without a tree of the whole manifest).
    std::string to_json() const;
    /// to_json's text in pieces, in order, to sink (memory: one entry's text at a time).
    void write_json(const std::function<void(std::string_view)>& sink) const;
    /// Parse the JSON text (simdjson On-Demand: no tree; exactly one object, keys in any
    /// order): every field's type and its own range (known codec, block size, finite
    /// in-range hyper-parameters, moment dtypes, shape = numel, escapes <= numel).
    /// Throws std::runtime_error with the reason. Cross-references are validate()'s.
    static Manifest parse(const std::string&);
    /// The cross-references: storages sorted, non-overlapping and inside source_size (and
    /// their CRC fields), storage param/role indices known, parameters tiling the streams in
    /// order, every moment storage its parameter's and of numel x dtype bytes, theta storages
    /// raw. Throws std::runtime_error with the reason.
    void validate() const;
    /// parse, then validate: what read_manifest trusts.
    static Manifest from_json(const std::string&);
};

/// One piece of the source file: storage `storage` of the manifest, or (storage == -1) a gap
/// between storages; `moment` when its bytes are coded (kept in the moment streams, not in
/// /raw). Offsets are bytes of the source file, [begin, end).
struct SourceSpan {
    uint64_t begin = 0, end = 0;
    int storage = -1;
    bool moment = false;
    uint64_t size() const { return end - begin; }
};
/// The source file [0, source_size) in file order: every storage (empty ones too) and the
/// non-empty gaps around them. The one walk that writing /raw, restoring, hashing the kept
/// tensors and verify's view of the source share. Storages must be sorted and inside
/// source_size (from_json checks it).
std::vector<SourceSpan> source_spans(const Manifest&);

/// Uncompressed bytes of parameter p's streams under `kind`: codes (for an entropy-coded
/// codec: `coded`, its segments' bytes over all roles) and block parameters of its moments,
/// and its escape rows (8-byte index + 4 bytes per moment). The weight by which
/// ckpt/report.h tensor_rows shares the stored moment bytes among the parameters.
uint64_t stream_bytes(const ParamEntry& p, codec::Kind kind, uint64_t coded = 0);
/// Row length of parameter p for vlog's row prediction: numel / shape[0] when the shape
/// has at least two dimensions, else 0 (no prediction possible).
inline uint64_t row_length(const ParamEntry& p) {
    return p.shape.size() >= 2 && p.shape[0] > 0 ? p.numel / uint64_t(p.shape[0]) : 0;
}
/// The row length vlog_rows uses for p: row_length(p) when p.row_predict, else 0.
inline uint64_t vlog_row(const ParamEntry& p) { return p.row_predict ? row_length(p) : 0; }
/// Segments of a parameter of n values (entropy-coded codecs).
inline uint64_t segments_of(uint64_t n) { return (n + codec::kSegment - 1) / codec::kSegment; }

/// Write the manifest as the /manifest dataset; returns the xxh3 of its text.
uint64_t write_manifest(hid_t file, const Manifest&);
/// Read and validate /manifest (checksum, size <= 256 MiB, Manifest::from_json).
/// `written`: the manifest the caller wrote there itself (compress's self-check), and
/// `written_xxh3` the xxh3 of that text (write_manifest's): when the stored text hashes to
/// it, it is validated and returned without a parse (from_json(m.to_json()) is m; the
/// parse's indexes are several times the text: docs/design.md §3); any other text is parsed
/// as usual. `sizes`, when given, gets /manifest's stored (compressed) and text bytes.
/// Throws std::runtime_error with the reason.
struct ManifestSizes { uint64_t stored = 0, text = 0; };
Manifest read_manifest(hid_t file, const Manifest* written = nullptr, uint64_t written_xxh3 = 0,
                       ManifestSizes* sizes = nullptr);
/// Bytes of the stored manifest attributable to per-parameter metadata (its params part's
/// share of the JSON text of `manifest_text_bytes`), counted as moment bytes (docs/design.md
/// §3 byte accounting).
uint64_t param_metadata_bytes(const Manifest&, uint64_t manifest_stored_bytes, uint64_t manifest_text_bytes);

}  // namespace ckpt::container
