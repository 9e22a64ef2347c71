// Results of compress / verify / restore, printed as a table (stdout) or one JSON object
// (--json, for CI), and the figures a container gives them (rows, bits, escape causes,
// param groups, read through container/reader.h). Keys: docs/design.md §3 byte accounting,
// issue "main job" JSON contract.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

namespace container {
class ContainerReader;
}

/// Per-parameter row of the summary table.
struct TensorRow {
    std::string name;           ///< parameter name where the file gives one, else the state path
    std::vector<int64_t> shape; ///< of exp_avg (empty when unknown)
    uint64_t values = 0;        ///< moment values (coordinates x moments)
    uint64_t escapes = 0;       ///< escaped moment values
    uint64_t bytes_fp32 = 0;    ///< 4 bytes x values
    uint64_t bytes_out = 0;     ///< bytes encoding these moments in the container
    double max_bound = 0;       ///< largest certificate kept, lr units
    /// ckpt-compress under the default bound (on the update): coded coordinates (escapes
    /// excluded) whose |theta| > 2^23 tolerance lr, where the parameter after a step may differ
    /// by 1 ulp of theta more than tolerance x lr; -1 where not counted (theta not in the file,
    /// --bound param, verify / restore).
    int64_t ulp_regime = -1;
    std::string note;           ///< e.g. why a tensor was kept exact
};

/// Where the stored moment bits go: per role (exp_avg, exp_avg_sq, max_exp_avg_sq) the
/// stored bytes of its codes, block parameters, segment index and escape rows over the
/// values it codes; `shared` = the escape index and per-parameter metadata over all coded
/// values (so the total bits per value is the values-weighted sum plus shared).
struct MomentBits {
    std::array<double, 3> role{};
    std::array<uint64_t, 3> values{};   ///< coded values per role
    double shared = 0;
};

/// What was certified for one param group (tensors with the same hyper-parameters and
/// gradient domain).
struct GroupRow {
    std::string optimizer;      ///< "adam", "adamw", or "adam|adamw" (auto: union of domains)
    std::string domain;         ///< e.g. "|g| <= 1", "|g| <= 1 shifted by wd*theta", "|g| <= inf"
    double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, step = 0;
    bool amsgrad = false, maximize = false;
    uint64_t tensors = 0;
};

struct Report {
    Report(std::string tool_, std::string input_, std::string output_, std::string codec_,
           double tolerance_, double grad_bound_)
        : tool(std::move(tool_)), input(std::move(input_)), output(std::move(output_)),
          codec(std::move(codec_)), tolerance(tolerance_), grad_bound(grad_bound_) {}
    std::string tool, input, output, codec;
    double tolerance = 0, grad_bound = 0;
    /// ckpt-verify: the largest certificate it accepts (VerifyOptions::tolerance); -1 elsewhere.
    double accepted_tolerance = -1;
    /// Updates the certificates cover: 0 every update after restore, 1 the first
    /// (container::Manifest::horizon); -1 where no container is involved.
    int horizon = -1;
    bool bound_param = false;  ///< --bound param (container::Manifest::bound_param)
    std::vector<TensorRow> rows;
    std::vector<GroupRow> groups;
    MomentBits bits;                      ///< of the coded moments (container readers fill it)
    std::array<uint64_t, 3> escape_causes{};  ///< escaped moment values per codec::EscapeCause
    uint64_t file_bytes_in = 0, file_bytes_out = 0;
    bool ok = true;
    std::vector<std::string> failures;   ///< verify: what failed
    std::vector<std::string> checks;     ///< verify: what was checked

    uint64_t moment_values() const;
    uint64_t escapes() const;
    uint64_t moment_bytes_fp32() const;
    uint64_t moment_bytes_out() const;
    double moment_reduction() const;     ///< 1 - out / fp32
    double max_bound() const;
    /// Sum of the rows' counted ulp_regime; -1 when no row was counted.
    int64_t ulp_regime() const;
    /// The table's "ulp regime:" line (empty when nothing was counted).
    std::string ulp_line() const;

    std::string table() const;           ///< human-readable summary
    std::string json() const;            ///< one JSON object
};

/// A container's summary rows, one accounting for every tool: coded parameters get the
/// stored moment bytes (ContainerReader::moment_bytes) apportioned by the uncompressed size
/// of their streams (codes, block parameters, escape rows), kept-exact states their source
/// bytes; stored max bound.
std::vector<TensorRow> tensor_rows(const container::ContainerReader&);
/// A container's stored bits per coded moment value, per role and shared.
MomentBits moment_bits(const container::ContainerReader&);
/// A container's escaped moment values per codec::EscapeCause (the manifest's
/// escape_causes x moments).
std::array<uint64_t, 3> escape_causes(const container::ContainerReader&);
/// What a container certified, per distinct (hyper-parameters, gradient domain).
std::vector<GroupRow> param_groups(const container::ContainerReader&);

}  // namespace ckpt
