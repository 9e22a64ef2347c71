// The three jobs behind ckpt-compress, ckpt-verify and ckpt-restore.
// Errors: BadInput (exit 2) for unreadable or malformed inputs and unwritable outputs,
// CheckFailed (exit 1) when stored data fails an integrity check during restore.
// Outputs are written under a temporary name, fsynced and renamed (never partial).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/optimizer.h"
#include "ckpt/report.h"
#include "codec/codec.h"

namespace ckpt {

struct CompressOptions {
    double tolerance = 0.01;          ///< tau, in units of lr
    double grad_bound = 1.0;          ///< G per coordinate, may be +inf
    codec::Kind codec = codec::Kind::VLog;
    std::string optimizer = "auto";   ///< auto | adam | adamw
    std::optional<double> param_bound;  ///< |theta| bound for L2 when theta is absent
    /// Updates certified after restore: 0 every update (--horizon all, the default), 1 the
    /// first only (--horizon 1: smaller files).
    int horizon = 0;
    /// What the tolerance bounds: false the update torch subtracts (--bound update, the
    /// default), true also the parameter it writes at the first update after restore
    /// (--bound param: coordinates where one float32 ulp of theta does not fit are kept exact).
    bool bound_param = false;
    HyperOverrides hyper;
    /// Coordinates per chunk (bounded memory); 0: the backend's (codec/backend.h:
    /// kCpuChunk on the CPU, kDeviceChunk on a CUDA device). Any value gives the same datasets (codes, escapes, segments); only
    /// where HDF5 places their chunks in the file follows the order of the appends.
    std::size_t chunk = 0;
    bool progress = false;            ///< progress line on stderr
    Limits limits;                    ///< reader limits (header, pickle, memo sizes)
    std::string device = "auto";      ///< cpu | cuda | auto (cuda when a device is present)
    /// A checkpoint with no optimizer state at all (model-only, EMA or best-weights
    /// exports) is stored exactly (a container with no coded moments, one warning saying
    /// nothing was coded) instead of refused with NoAdamState. The Python package's save
    /// sets it; the tools and folder mode do not (ckpt-compress exits 2, a folder copies it).
    bool allow_no_state = false;
    /// Warnings name options as the Python package spells them (`tolerance=0.02`,
    /// `codec='bf16'`) instead of as the CLI does (`--tolerance 0.02`). The package sets it.
    bool python_names = false;
};

/// Compress `in` (torch.save zip/legacy or safetensors) into the container `out`.
Report compress(const std::string& in, const std::string& out, const CompressOptions&);

namespace io { class InputFile; }
/// The same from an open input: a file, or the bytes of a checkpoint in memory
/// (io::InputFile's spans: the Python package's save, no file of the checkpoint). Errors
/// about the input name in.path().
Report compress(const io::InputFile& in, const std::string& out, const CompressOptions&);

struct Layout;  // layout.h

struct VerifyOptions {
    std::optional<std::string> original;  ///< also check against the original checkpoint
    /// The largest certificate accepted (lr units; ckpt-verify --tolerance, default
    /// ckpt-compress's): a certificate above it fails whatever tolerance the manifest states
    /// (a manifest's tolerance is the writer's word, not a proof). compress's self-check
    /// passes its own --tolerance.
    double tolerance = 0.01;
    int grid = 257;                       ///< gradient points per coordinate on the dense grid
    bool strict = false;                  ///< read the original with Limits::strict
    /// Re-derive every certificate from the codes (ckpt-verify always does). compress's
    /// self-check turns it off on the CPU path: its encoder computed the certificates with
    /// the same function on the same decoded cells (block.h), so only decoding, integrity
    /// and the manifest-against-source checks remain to be shown there.
    bool certificates = true;
    /// compress's self-check (with certificates off): xxh3 of the codes it encoded, per
    /// parameter and role (code bytes as stored before entropy coding, escaped coordinates
    /// 0). The pass then decodes codes only and each parameter's must hash to these, which
    /// shows the entropy coding and row prediction undo exactly; values are a function of
    /// the codes and the checksummed block parameters (no decode of values needed).
    const std::vector<std::array<uint64_t, 3>>* code_hashes = nullptr;
    /// compress's self-check: the plan compress made from the source. Check 2 compares the
    /// manifest as written with it instead of re-deriving the plan from the source bytes in
    /// /raw (which check 1 shows are the bytes compress read: plan_layout reads no moment
    /// byte, so the re-derived plan is this one); no temporary copy of the source, no second
    /// parse.
    const Layout* planned = nullptr;
    /// With `planned`: the xxh3 of the manifest text compress wrote from planned->man; the
    /// container's manifest is then that one, not parsed again (container::read_manifest).
    uint64_t manifest_xxh3 = 0;
    bool progress = false;
    /// What a sibling file states for the source (folder mode: the model_optim_rng.pt beside a
    /// Megatron distrib_optim.pt): check 2 then compares the manifest's hyper-parameters and
    /// step with it, not only with the source's own.
    std::shared_ptr<const CompanionHyper> companion;
    /// Messages name options as the Python API spells them (`tolerance=0.05`, not
    /// `--tolerance 0.05`): the package's calls set it.
    bool python_names = false;
};

/// Check integrity, re-derive every certificate from the codes, optionally compare with
/// the original. Report::ok is false when a check fails (exit 1).
Report verify(const std::string& container, const VerifyOptions&);

struct RestoreOptions {
    bool progress = false;
};

/// Rebuild the checkpoint (same format as the source) from the container.
Report restore(const std::string& container, const std::string& out, const RestoreOptions&);

/// The same into the open descriptor `fd` (no file name: the package's memfd, which the
/// interpreter maps), sized to the restored bytes; Report::output is "" and file_bytes_out
/// their count. Written with pwrite, so the writer maps none of its pages.
Report restore_to_fd(const std::string& container, int fd, const RestoreOptions&);

}  // namespace ckpt
