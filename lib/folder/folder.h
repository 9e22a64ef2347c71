// Folder mode of ckpt-compress / ckpt-verify / ckpt-restore: a whole checkpoint folder (HF
// Trainer checkpoint-N/, DeepSpeed global_stepN/ or its parent, a DCP folder, or any tree of
// files) in, a mirrored folder out. Every file holding Adam/AdamW moments becomes
// "<relative path>.ckz.h5" (ckpt::compress), every other file is copied byte for byte, and a
// manifest (formats/folder.md) at the output's root lists every file with its XXH3-64 hash.
// The output is built in a temporary sibling folder and renamed at the very end, so a killed
// run leaves no partial output (an existing one, replaced under --force, stays whole until
// that rename). Under MPI (folder/comm.h) whole files are shared among ranks by size; the
// output is the same as one process's; rank 0 writes the manifest and the summary.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "folder/comm.h"
#include "ckpt/pipeline.h"

namespace ckpt::folder {

/// Name of the manifest at the root of a compressed folder.
inline constexpr const char* kManifestName = "ckptkit-folder.json";
/// Value of the manifest's "format" key.
inline constexpr const char* kManifestFormat = "ckptkit-folder";
/// Manifest format version (formats/folder.md).
inline constexpr int kManifestVersion = 1;   ///< version 2: files in a save folder (`save_dir`, ckptkit.dcp's writer)

/// A layout recognised from the files of one folder (relative path "" is the root).
struct Layout {
    std::string kind;     ///< "hf-trainer", "deepspeed-zero", "megatron", "dcp"
    std::string dir;      ///< folder relative to the input root ("" = the root)
    std::string evidence; ///< which files said so ("optimizer.pt + model.safetensors")
    std::string note;     ///< what the tools do with it, e.g. DCP moment items kept exact
};

/// Layouts found under `root` from the file list `files` (relative paths, '/'-separated,
/// sorted). DCP `.metadata` files are parsed (pickled Metadata, opaque objects) to count
/// the moment items; an unreadable one is reported in the note, never an error.
std::vector<Layout> detect_layouts(const std::string& root, const std::vector<std::string>& files);

/// Megatron-LM: the note of a distrib_optim.pt with no model_optim_rng.pt beside it.
inline constexpr const char* kMegatronAlone =
    "no model_optim_rng.pt beside distrib_optim.pt: its hyper-parameters and step are unknown, the file is copied exact";

/// Megatron-LM: what the model_optim_rng.pt at `path` states for the distrib_optim.pt beside
/// it (ckpt::megatron_hyper); null when there is no such file or it holds no Megatron param
/// groups. Throws BadInput when it cannot be read.
std::shared_ptr<const CompanionHyper> megatron_companion(const std::string& path, const Limits& limits);

/// One file's line of the summary.
struct FileRow {
    std::string file;          ///< relative path in the input (compress: source; verify/restore: output entry)
    std::string stored;        ///< relative path in the compressed folder ("x.pt.ckz.h5" or "x.pt")
    std::string action;        ///< "compressed", "copied", "verified", "intact", "restored"
    std::string layout;        ///< kind of the layout the file belongs to, or ""
    uint64_t bytes_in = 0, bytes_out = 0;      ///< file sizes
    uint64_t moment_values = 0, escapes = 0;
    uint64_t moment_bytes_fp32 = 0, moment_bytes_out = 0;
    double max_bound = 0;      ///< lr units
    bool ok = true;
    std::string note;          ///< why copied, which optimizer was assumed, what failed
    std::string report_json;   ///< the single-file Report::json() for containers ("" otherwise)
    uint64_t xxh3 = 0, source_xxh3 = 0;   ///< XXH3-64 of the stored file and of the original
    std::string manifest_extra;   ///< JSON object of extra manifest keys (DCP: virtual, shell, moments, cuts)
    bool virtual_input = false;   ///< DCP gathered moments: not a file of the input (not in the byte totals)
};

/// Summary of one folder run, printed by rank 0 (table or one JSON object).
struct FolderReport {
    std::string tool, input, output;
    double tolerance = 0, grad_bound = 0;
    std::string codec;
    int ranks = 1;
    std::vector<Layout> layouts;
    std::vector<FileRow> files;   ///< sorted by path
    bool ok = true;
    std::vector<std::string> failures;   ///< "FILE: what failed"
    std::vector<std::string> notes;      ///< "FILE: what", not failures (verify: leftovers of an unfinished ckptkit.dcp save)

    uint64_t bytes_in() const;   ///< sum of the input files' sizes (DCP gathered moments not counted)
    uint64_t bytes_out() const;  ///< sum of the written / stored files' sizes
    std::string table() const;   ///< per-file lines and the total
    std::string json() const;    ///< one object: totals, "layouts", "files" (each with its report)
};

/// True when `path` is a folder (following symlinks).
bool is_folder(const std::string& path);

/// Options of the folder jobs beyond the single-file ones.
struct FolderOptions {
    bool force = false;           ///< replace an existing output folder (at the very end)
    bool progress = false;        ///< per-file progress lines on stderr (rank 0)
    uint64_t dcp_unit_bytes = 256ull << 20;   ///< compress: DCP .distcp bytes per gathered-moments container (at least)
    std::string dcp_unit_tag;   ///< compress: "ckptkit-dcp-moments-<tag><n>" (ckptkit.dcp's writer: "<rank>-")
    bool serial = false;        ///< one process whatever launched it (serial_comm, not world_comm)
};

/// ckpt-compress DIR -o OUT_DIR. Files are sniffed (torch zip / legacy / safetensors); those
/// compress() refuses with NoAdamState are copied, any other refusal
/// fails the run (BadInput naming the file; every rank throws it, nothing is left). An HF
/// Trainer optimizer.pt that compress() refuses for lack of theta (Adam's L2 domain) is
/// compressed with param_bound = the largest |value| of the model file(s) next to it.
/// Throws BadInput for an unreadable input, an output inside the input, or an existing
/// output without force.
FolderReport compress_folder(const std::string& in, const std::string& out, const CompressOptions&,
                             const FolderOptions&, Comm& = world_comm());

/// ckpt-verify OUT_DIR [--original DIR]: every container verify()-ed (with its original when
/// `original` is set), every other file's size and XXH3 checked against the manifest, no file
/// missing or extra (with `original`: each original file's hash too). Report::ok false (exit 1)
/// when any check fails; BadInput when OUT_DIR has no readable manifest.
FolderReport verify_folder(const std::string& dir, const std::optional<std::string>& original,
                           const VerifyOptions&, Comm& = world_comm());

/// ckpt-restore OUT_DIR -o DIR2: containers restore()-d under their source names, other files
/// copied with their hash checked (CheckFailed on a mismatch); same temporary-folder rule.
FolderReport restore_folder(const std::string& dir, const std::string& out, const RestoreOptions&,
                            const FolderOptions&, Comm& = world_comm());

/// The bytes of one original file `path` (manifest path) of the compressed folder `dir`,
/// written to the descriptor `fd` (the package's memfd): a DCP shell rebuilt with its moments
/// restored, a container restored, a copy checked against its hash. What ckptkit.dcp's reader
/// opens instead of restoring the whole folder. Returns its size. Throws BadInput (not in the
/// manifest, unreadable) / CheckFailed (a hash or checksum differs).
uint64_t restore_folder_file(const std::string& dir, const std::string& path, int fd, const RestoreOptions&);

/// One read of ckptkit.dcp's reader: `count` elements from element `begin` (row-major) of
/// the gathered moment tensor `tensor` (a DCP shell's cut names it) of the gathered-moments
/// entry `moments` (its manifest path); `numel` and `element_size` are that tensor's as the
/// DCP metadata gives them (checked against the container).
struct DcpMomentRead {
    std::string moments, tensor;
    uint64_t begin = 0, count = 0, numel = 0, element_size = 0;
};

/// The reads decoded from the compressed folder `dir`: their bytes, concatenated in the order
/// of `reads` (count * element_size each), handed to sink(byte offset, bytes, n) piece by
/// piece as the chunks are decoded. Only the parameters the reads name are decoded, straight
/// from their containers (no file is rebuilt); each container's stored file is checked
/// against the manifest's size and XXH3 first and its datasets' checksums after. Returns the
/// total bytes. Throws BadInput (not in the manifest, a read outside its tensor, unreadable) /
/// CheckFailed (a hash or checksum differs). `memory`, when given: memory(byte offset) is
/// where the output byte at that offset lies, each read's bytes contiguous and 4-byte
/// aligned: fp32 chunks a read covers whole are decoded there, with no copy and no sink call.
uint64_t read_dcp_moments(const std::string& dir, const std::vector<DcpMomentRead>& reads,
                          const std::function<void(uint64_t, const uint8_t*, std::size_t)>& sink,
                          const std::function<uint8_t*(uint64_t)>& memory = nullptr);

/// The stored file of `path` (manifest path) in the compressed folder `dir` checked against
/// the manifest's size and XXH3 (what ckptkit.dcp's reader does before reading a file in
/// place). Throws BadInput (not listed) / CheckFailed (differs), naming the stored file.
void check_stored_file(const std::string& dir, const std::string& path);

/// Pieces [first, first + count) of `unit` bytes of the stored file `stored` (relative to
/// `dir`) checked against the manifest's `xxh3_units` (`units_hex`, all of them, as listed:
/// they must cover `size`), and the file against the manifest's `size` (ckptkit.dcp's reader:
/// a rank checks the pieces it reads). Throws BadInput (units not covering the size, a
/// missing or unreadable file) / CheckFailed (differs), naming the stored file.
void check_stored_units(const std::string& dir, const std::string& stored, uint64_t size, uint64_t unit,
                        const std::vector<std::string>& units_hex, uint64_t first, uint64_t count);

/// ckptkit.dcp.FileSystemWriter's commit of the save `tag` (16 hex digits) into the DCP folder
/// `dir`, by the coordinator once every rank's part is written: each part's stored files (the
/// per-rank compressed folders `parts`; their own `.metadata` and `.ckptkit-*` rows left out)
/// move into `dir`/ckptkit-<tag>/, the manifest is written (crash-safely) with their rows and
/// the row of `metadata` (the .metadata torch pickled), `metadata` is renamed onto
/// `dir`/.metadata, and only then is removed what the checkpoint it replaces and earlier
/// saves left: the files the old manifest listed and the new one does not, files named as a
/// plain save's (or an older writer's) of the new rows, other ckptkit-<tag>/ folders and the
/// writer's transient folders (dcp_writer_folder). Until that rename the checkpoint already in
/// `dir`, if any, is untouched. Throws BadInput.
void commit_dcp_save(const std::string& dir, const std::vector<std::string>& parts, const std::string& metadata,
                     const std::string& tag);

/// Whether `name` is a save's folder of ckptkit.dcp.FileSystemWriter: "ckptkit-<16 lowercase hex
/// digits>" (manifest version 2's `save_dir`).
bool dcp_save_folder(const std::string& name);
/// Whether `name`, at the top of a DCP folder, is ckptkit.dcp.FileSystemWriter's own folder: a
/// save's (dcp_save_folder) or a transient ".ckptkit-*" / "..ckptkit-*" one.
bool dcp_writer_folder(const std::string& name);

}  // namespace ckpt::folder
