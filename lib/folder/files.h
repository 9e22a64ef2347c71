// File-tree helpers of folder mode (internal to lib/folder): listing a tree,
// hashing and copying files with XXH3-64, the temporary output folder and its final rename.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/file.h"

namespace ckpt::folder {

/// A folder's contents, relative paths '/'-separated, each list sorted.
struct Tree {
    std::vector<std::string> dirs;    ///< every sub-folder (not the root)
    std::vector<std::string> files;   ///< every regular file
};

/// Walk `root` (not following symlinks). Throws BadInput(root-relative path) for a symlink,
/// socket, fifo or device inside the tree: a folder copy would change what it means.
Tree list_tree(const std::string& root);

/// Size and XXH3-64 of a file, read in 1 MiB pieces; with `unit` > 0 also the XXH3-64 of
/// each `unit`-byte piece [k unit, (k + 1) unit) (the last one shorter), so that a reader
/// checks only the pieces it reads (formats/folder.md, `xxh3_units`). Throws BadInput(path).
struct Digest {
    uint64_t size = 0;
    uint64_t xxh3 = 0;
    std::vector<uint64_t> units;   ///< per `unit` bytes (empty without a unit)
};
Digest hash_file(const std::string& path, uint64_t unit = 0);

/// Copy `src` to the new file `dst` (fsynced) byte for byte; returns the source digest
/// (with `unit`: as hash_file). Throws BadInput(src) on a read error, BadInput(dst) on a
/// write error.
Digest copy_file(const std::string& src, const std::string& dst, uint64_t unit = 0);

/// The XXH3-64 of pieces [first, first + count) of `unit` bytes of the file `path` (the
/// last piece of the file shorter), as hash_file's `units`. Throws BadInput(path) on a read
/// error or when the file ends before piece first + count - 1 begins.
std::vector<uint64_t> hash_units(const std::string& path, uint64_t unit, uint64_t first, uint64_t count);

/// 16 lower-case hex digits.
std::string hex64(uint64_t);
/// Inverse of hex64; throws std::invalid_argument.
uint64_t parse_hex64(const std::string&);

/// "a/b" joined with '/', "" parts skipped.
std::string join(const std::string& a, const std::string& b);
/// A folder path without trailing '/' ("out/" -> "out"; "/" stays "/").
std::string without_trailing_slash(std::string p);
/// Folder part of a relative path ("" at the root) and its last component.
std::string parent_of(const std::string& rel);
std::string base_of(const std::string& rel);

/// The largest |value| over every F32/F16/BF16 storage of `ck` (read from `f` in 1 MiB
/// pieces). Throws BadInput(f) naming `what` on a non-finite value.
double max_abs_storages(const Checkpoint& ck, const io::InputFile& f, const std::string& what);

/// The temporary sibling of an output folder: "<parent>/.<name>.tmp-<pid>".
std::string temp_sibling(const std::string& out, long pid);

/// Checks on an output folder before any work: not the input, not inside it and the input
/// not inside it, not an existing non-folder, existing only with `force`. Throws BadInput(out).
void check_output_folder(const std::string& in, const std::string& out, bool force);

/// Make the folder `tmp` the output `out`: fsync every file is the caller's job; this fsyncs
/// `tmp`, then renames it onto `out` (an existing `out` is swapped out atomically with
/// renameat2(RENAME_EXCHANGE) and removed afterwards), then fsyncs the parent.
/// Throws BadInput(out).
void commit_folder(const std::string& tmp, const std::string& out);

/// HF Trainer folders: the largest |value| over every float (F32/F16/BF16) storage of the
/// model files next to optimizer.pt (model.safetensors, pytorch_model.bin and their shards
/// model-*.safetensors, pytorch_model-*.bin) in `dir`, read in 1 MiB pieces, with the names
/// of the files read. A sound |theta| bound for Adam's L2 gradient domain (the model file
/// holds the parameters the next step starts from). Nullopt when no model file is there;
/// BadInput when one cannot be read or holds a non-finite value.
std::optional<std::pair<double, std::string>> model_param_bound(const std::string& dir, const Limits& limits);

}  // namespace ckpt::folder
