// DCP (torch.distributed.checkpoint) moments in folder mode (internal to lib/folder).
//
// A DCP folder keeps every item (one torch.save zip per tensor chunk or bytes object) in
// .distcp files at the offsets its .metadata records (storage_data: MetadataIndex(fqn, offset)
// -> _StorageInfo(relative_path, offset, length); torch distributed/checkpoint filesystem.py,
// metadata.py; torch 1.13 one item per file, 2.x several per file). The moments of a
// parameter P are the items `<X>.state.P.exp_avg` / `exp_avg_sq` [/ `max_exp_avg_sq`], its
// step `<X>.state.P.step` and its hyper-parameters the items `<X>.param_groups.P.<key>`.
//
// Folder mode gathers them into one safetensors file in the form ckpt::compress reads
// (state.P.<moment>, state.P.step, __metadata__ param_groups as JSON) and compresses that;
// each .distcp file that held a moment storage is stored as a *shell*: the file with those
// byte ranges cut out. Restore puts the restored moment bytes back at the cuts and rewrites
// the zip CRC-32 fields that cover them, so torch's DCP reader loads the file.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file.h"
#include "ckpt/optimizer.h"
#include "io/checkpoint.h"

namespace ckpt::folder {

/// Prefix of the gathered moments' names inside a DCP folder (virtual inputs: they never
/// exist in the input folder; the output holds each as "<name>.ckz.h5").
inline constexpr const char* kDcpMomentsPrefix = "ckptkit-dcp-moments-";
/// Name of the gathered moments of DCP work unit `n`: "ckptkit-dcp-moments-<tag><n>.safetensors".
std::string dcp_moments_name(std::size_t n, const std::string& tag = "");

/// Suffix of a shell file in the output folder.
inline constexpr const char* kShellSuffix = ".ckz-shell";

/// One item of a DCP .metadata's storage_data.
struct DcpItem {
    std::string fqn;            ///< MetadataIndex.fqn
    std::string file;           ///< _StorageInfo.relative_path
    uint64_t offset = 0, length = 0;   ///< bytes in that file
    std::string chunk;          ///< MetadataIndex.offset of a tensor chunk as "0,4"; "" for bytes items
};

/// Every storage_data item of `dir`/.metadata (a pickled Metadata, opaque objects, nothing
/// run). Throws BadInput when it cannot be read or an entry is malformed.
std::vector<DcpItem> dcp_items(const std::string& dir);

/// A moment item's FQN taken apart. torch names them "<X>.state.<P>.<moment>" (get_state_dict,
/// optimizer.state_dict()); Megatron-LM "optimizer.state.<moment>.<P>", its main parameters
/// "optimizer.state.fp32_param.<P>" (DistributedOptimizer.sharded_state_dict's
/// fully_sharded_model_space) or "optimizer.state.param.<P>" (fully_reshardable), P the model
/// ShardedTensor's key (megatron/core/optimizer/distrib_optimizer.py). Megatron's default
/// dp_reshardable sharding saves flat buckets instead: "<B>.exp_avg", "<B>.exp_avg_sq" and the
/// main parameters "<B>.param", B = "optimizer.distributed.dp_group_idx_<G>.gbuf_idx_<I>.
/// dtype_<D>.bucket_idx_<K>", one chunk per parameter range and padding (X = P = B).
struct DcpMomentName {
    std::string X, P;        ///< optimizer prefix, parameter
    int moment = 0;          ///< 0 exp_avg, 1 exp_avg_sq, 2 max_exp_avg_sq
    bool megatron = false;   ///< Megatron's order
    bool bucket = false;     ///< a dp_reshardable bucket (megatron too)
    /// The FQN of this parameter's item `key` ("exp_avg", "step", "fp32_param") in the same order.
    std::string fqn(const std::string& key) const;
};
/// The parts of a moment FQN (exp_avg / exp_avg_sq / max_exp_avg_sq, either order); nullopt else.
std::optional<DcpMomentName> dcp_moment_name(const std::string& fqn);

/// True for an optimizer moment FQN (dcp_moment_name finds one).
bool is_moment_fqn(const std::string& fqn);

/// One moment storage cut out of a .distcp file.
struct DcpCut {
    uint64_t offset = 0, length = 0;      ///< byte range in the .distcp file
    std::string tensor;                   ///< its name in the moments file ("state.P.exp_avg")
    std::vector<uint64_t> crc_offsets;    ///< offsets in the .distcp file of the CRC-32 fields covering it
};

/// The cuts of one .distcp file (relative to the DCP folder), sorted by offset.
struct DcpFile {
    std::string file;
    std::vector<DcpCut> cuts;
};

/// What gather_dcp_moments found.
struct DcpMoments {
    std::vector<DcpFile> files;   ///< .distcp files holding moment storages, sorted
    uint64_t params = 0;          ///< parameter chunks whose moments were gathered ("P", or "P@i,j" per chunk)
    std::string note;             ///< parameters left exact and why (sharded chunks, odd items)
    uint64_t megatron = 0;        ///< of params, Megatron's (hyper-parameters and step from common.pt)
    std::string megatron_source;  ///< where Megatron's param groups were read (common.pt, or dp_reshardable's items)
};

/// Where an item of a DCP folder's .metadata lies now (ckpt-verify of a compressed folder: in
/// a shell, at an offset shifted by the cuts before it); the identity when empty.
using DcpItemRemap = std::function<DcpItem(const DcpItem&)>;

/// Megatron's param groups in the DCP folder `dir` as gather_dcp_moments reads them for
/// Megatron's moment items: common.pt's (dist_checkpointing's common state), else, under
/// dp_reshardable, the ShardedObject items "optimizer.distributed.dp_group_idx_<G>.optimizer/
/// shard_*" (the inner optimizer's state_dict without its state): their agreed
/// hyper-parameters and step; null, and `why_not` set, when there are none or they cannot be
/// certified. Throws BadInput when one cannot be read.
std::shared_ptr<const CompanionHyper> dcp_megatron_hyper(const std::string& dir, const Limits&, std::string& why_not,
                                                         const DcpItemRemap& remap = {});

/// Read `dir`/.metadata and the items it names; write the moments file to `out` (safetensors).
/// Megatron's moment items take their hyper-parameters and step from Megatron's common.pt in
/// `dir` (dist_checkpointing's common state: the param groups of DistributedOptimizer.state_dict(),
/// read as megatron_hyper reads model_optim_rng.pt; an "optimizer.state.step.<P>" item first
/// when there is one), and theta (the moments file's tensor named as the parameter, cut out of
/// its .distcp file as the moments are) from the main-parameter item, else the model item P;
/// groups that must agree and do not leave them all exact with one note.
/// `scratch` is a folder for item copies. A parameter whose moments are chunked (ShardedTensor,
/// FSDP) gives one gathered parameter per chunk ("P@i,j", the chunk offset), its moments
/// paired by chunk offset. Chunks whose moments are not each one whole, contiguous
/// F32/F16/BF16 item, or whose step / param_groups items are missing or
/// not plain numbers, are left out (their items stay in the copied files). Returns params = 0
/// (and writes nothing) when none is left. Throws BadInput for an unreadable item.
/// Only parameter chunks whose moment items all lie in `files` (relative to `dir`) are gathered.
DcpMoments gather_dcp_moments(const std::string& dir, const std::vector<std::string>& files, const std::string& out,
                              const std::string& scratch, const Limits&);

/// Work units of a DCP folder: groups of .distcp files (relative to `dir`, each group sorted)
/// that hold moment items (exp_avg, exp_avg_sq, max_exp_avg_sq under `<X>.state.`), such that
/// the moments of one parameter chunk never span two groups (files linked by a chunk's
/// moments are one component; torch 1.13 puts each moment in its own file, 2.x one file per
/// rank), consecutive components merged until a group reaches `unit_bytes` (file sizes).
/// Same result on every rank. Throws BadInput when the .metadata cannot be read.
std::vector<std::vector<std::string>> dcp_units(const std::string& dir, uint64_t unit_bytes);

/// The largest |value| of the DCP folder's model tensors: every float tensor item that is not
/// optimizer state (not under `<X>.state.` / `<X>.param_groups.`), and every bytes item that
/// holds a module state_dict (a dict of tensors: torch 1.13's nested
/// `save_state_dict({"model": sd, "optimizer": ..., ...})` pickles each value whole). A
/// |theta| bound for Adam's L2 domain; nullopt when the folder holds no model tensor (no
/// bound). Throws BadInput on a non-finite value.
std::optional<double> dcp_param_bound(const std::string& dir, const std::string& scratch, const Limits&);

/// Write `src` without the byte ranges of `f.cuts` to `dst`. Throws BadInput.
void write_shell(const std::string& src, const DcpFile& f, const std::string& dst);

/// Rebuild a .distcp file: `shell` with the restored bytes of each cut's tensor (from the
/// safetensors `moments`) put back, CRC-32 fields recomputed. Throws BadInput / CheckFailed.
void rebuild_from_shell(const std::string& shell, const DcpFile& f, const std::string& moments, const std::string& dst);
/// The same into an open writer (closed here).
void rebuild_from_shell(const std::string& shell, const DcpFile& f, const std::string& moments, FileWriter& w);

/// Where bytes [offset, offset + length) of a .distcp file stored as a shell lie in the
/// shell: `offset` less the bytes of the cuts that end at or before it; nullopt when they
/// overlap a cut (a moment storage, not in the shell). `cuts`: sorted and disjoint, as
/// cuts_from gives them.
std::optional<uint64_t> shell_offset(const std::vector<DcpCut>& cuts, uint64_t offset, uint64_t length);

/// JSON of the cuts (manifest "cuts") and back.
nlohmann::json cuts_json(const std::vector<DcpCut>&);
std::vector<DcpCut> cuts_from(const nlohmann::json&);

}  // namespace ckpt::folder
