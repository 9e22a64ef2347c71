// Finding the Adam/AdamW state in a parsed checkpoint: for every parameter, its moment
// tensors (exp_avg, exp_avg_sq[, max_exp_avg_sq]), step, param-group hyper-parameters and,
// when it can be located, the parameter tensor itself (theta, for the Adam L2 domain).
// Sources: torch.optim.Optimizer.state_dict layout (docs/design.md); safetensors files carry the
// state flattened as state.<idx>.<name> with hyper-parameters in __metadata__.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codec/guard.h"
#include "io/checkpoint.h"
#include "io/file.h"

namespace ckpt {

/// Hyper-parameters a sibling file states for a file holding moments without them:
/// Megatron-LM's distrib_optim.pt, whose param groups and step are in the model_optim_rng.pt
/// beside it (megatron_hyper). Taken by the flat buffers of such a file as their own
/// statements (stated bits set: ckpt-verify compares them with the sibling's).
struct CompanionHyper {
    std::string file;                 ///< the sibling's name, for notes
    codec::AdamHyper hyper;
    unsigned stated = 0;              ///< HyperKey bits (and kStepNumber) the sibling states
    int stated_bits[5] = {0, 0, 0, 0, 0};
    std::optional<bool> decoupled;    ///< AdamW (true) / Adam (false) when the sibling says so
    bool lr_divides = false;          ///< capturable / differentiable
    std::string why_not;              ///< why the moments stay exact ("" when certifiable)
};

/// Hyper-parameters given on the command line; each one set overrides the file's.
struct HyperOverrides {
    std::optional<double> lr, beta1, beta2, eps, weight_decay;
    std::optional<bool> amsgrad, maximize;
    /// ckpt-verify re-deriving the plan from the source: what the file does not state came
    /// from the flags at compress time (the manifest holds it), so it is no reason to keep a
    /// state exact.
    bool unstated_ok = false;
    /// With unstated_ok: the states the manifest lists as kept exact for a hyper-parameter
    /// their file does not state (KeptEntry names whose note holds kUnstated): kept again.
    std::vector<std::string> kept_unstated;
    /// Megatron-LM distrib_optim.pt: what its model_optim_rng.pt states (folder mode reads it);
    /// null: the file's flat buffers are kept exact (unless unstated_ok).
    std::shared_ptr<const CompanionHyper> companion;
};

/// Why an override `name` = x (lr, beta1, beta2, eps, weight_decay) is outside what
/// torch.optim.Adam's constructor accepts, as "x is ..." ("" when inside): finite; lr, eps
/// and weight_decay >= 0; betas in [0, 1) (torch/optim/adam.py's argument checks).
/// ckpt-compress checks each flag with it and the package each keyword before any work; a
/// file's own values outside that are kept exact instead (out_of_range), never refused.
std::string override_out_of_range(const std::string& name, double x);

/// The reason a flat safetensors state is kept exact for a hyper-parameter its
/// `__metadata__` does not state (followed by its name): "... states no beta1 (pass --beta1)".
inline constexpr const char* kUnstated = "__metadata__ states no";

/// Hyper-parameter keys a file may state (ParamState::stated bits).
enum HyperKey : unsigned { kLr = 1, kBeta1 = 2, kBeta2 = 4, kEps = 8, kWeightDecay = 16, kAmsgrad = 32, kMaximize = 64 };
/// ParamState::stated bit (not a hyper-parameter): the step is a number in the file, which
/// torch Adam / AdamW load as a float32 tensor (certified as one: step_bits 24).
constexpr unsigned kStepNumber = 128;
/// ParamState::stated bit: the file states no step at all (a Megatron distrib_optim.pt read
/// without its model_optim_rng.pt under unstated_ok): ckpt-verify takes the manifest's.
constexpr unsigned kStepUnstated = 256;

/// One parameter's optimizer state.
struct ParamState {
    std::string name;                 ///< parameter name when the file gives it (param_names, FQN key,
                                      ///< the model's key), else the state entry path "optimizer/state/3"
    std::string index;                ///< the state key (param index or fqn)
    int tensor[3] = {-1, -1, -1};     ///< Checkpoint::tensors index of exp_avg, exp_avg_sq, max_exp_avg_sq
    int theta = -1;                   ///< parameter tensor when the mapping is proven, else -1
    /// Where theta is not proven: the model tensor the state is named after by parameter
    /// order (names_by_order), for reports only (never a certificate); else -1.
    int theta_likely = -1;
    /// The state's other non-scalar tensors (Adamax's exp_inf, SGD's momentum_buffer, ...):
    /// counted in a kept-exact state's report row.
    std::vector<int> other_tensors;
    /// Model tensors of the right shape when the mapping is not proven (the Adam L2 domain
    /// is then certified over the union of their domains, as |theta| <= max over them).
    /// Shared by every state of the same shape (null when none).
    std::shared_ptr<const std::vector<int>> theta_candidates;
    codec::AdamHyper hyper;
    unsigned stated = 0;              ///< HyperKey bits the file states
    /// Significant bits of the dtype each of lr, beta1, beta2, eps, weight_decay is stated
    /// in (24 for a float32 tensor such as torch 2.x's 0-d lr; 0: a Python number, exact):
    /// an override is compared with the file's value in that dtype.
    int stated_bits[5] = {0, 0, 0, 0, 0};
    std::optional<bool> decoupled;    ///< AdamW (true) / Adam (false) when the file says so
    bool lr_divides = false;          ///< capturable / differentiable: torch divides by lr/bc1
    bool compressible = false;        ///< provably Adam/AdamW, moments are whole, contiguous,
                                      ///< unshared FP32/F16/BF16 storages, hyper-parameters in range
    std::string why_not;              ///< reason when !compressible ("NAdam state (not Adam)")
};

/// Scan a checkpoint for optimizer states holding exp_avg / exp_avg_sq. States that are
/// not provably torch Adam/AdamW (NAdam, RAdam, Adafactor, ...: decided from the
/// param_groups keys and the state keys) come back with compressible = false and a reason.
/// Overrides fill in hyper-parameters the file does not state; one that contradicts a
/// stated value is BadInput, as are `optimizer` = "adam"/"adamw" against the file's
/// decoupled_weight_decay, a missing param group or an unreadable step. An input without
/// such state gives an empty list (the caller decides whether that is an error).
std::vector<ParamState> find_param_states(const Checkpoint&, const io::InputFile&,
                                          const HyperOverrides&, const std::string& optimizer = "auto");

/// A module state_dict's float tensors, (key, shape) in state_dict order.
using ModelTensors = std::vector<std::pair<std::string, std::vector<int64_t>>>;
/// An optimizer state_dict's param groups in order: per param, (param id, exp_avg shape or
/// null when it has no state).
using GroupShapes = std::vector<std::vector<std::pair<std::string, const std::vector<int64_t>*>>>;

/// Report names for optimizer param ids a file does not name (docs/design.md §2, "Report
/// rows"): torch numbers params group by group, and with each group in model order the
/// groups interleave a subsequence of a model's tensors (frozen parameters and float buffers
/// skipped; BatchNorm statistics left out). The exp_avg shapes must fit exactly one way;
/// several models (a model and its EMA copy) must agree. Returns param id -> model key, or
/// an empty map and why not ("no parameter names in the file", ...). Names only, never theta.
std::pair<std::map<std::string, std::string>, std::string> names_by_order(const std::vector<ModelTensors>& models,
                                                                          const GroupShapes& groups);

/// Why a distrib_optim.pt buffer needs its param groups to agree (megatron_hyper's why_not).
inline constexpr const char* kMegatronBufferMixes =
    "a distrib_optim.pt buffer mixes their parameters and neither file says which coordinate is whose";

/// Megatron-LM's model_optim_rng.pt (megatron/training/checkpointing.py generate_state_dict):
/// the param groups of its 'optimizer' (DistributedOptimizer.state_dict(): 'optimizer' /
/// 'param_groups' without 'params', each with the step; a ChainedOptimizer's list of them) as
/// the hyper-parameters of the distrib_optim.pt beside it. torch Adam / AdamW groups (Megatron
/// without TE / Apex: the step a number torch loads as float32) and TE / Apex FusedAdam groups
/// (bias_correction; an exact int step; AdamW vs Adam from args.decoupled_weight_decay when
/// the file's args has it, else unknown). A distrib_optim.pt buffer mixes the parameters of
/// every group and neither file says which coordinate is whose, so the groups must agree on
/// everything the certificate uses (lr, betas, eps, step, amsgrad, kind); weight decay may
/// differ under decoupled decay (AdamW's does not enter the certificate), or when every
/// group's is 0 or the largest (the Adam L2 domain is then the union of the plain one and the
/// one shifted by the largest: the kind is left unknown); weight_decay is then the largest and
/// not stated. Disagreement sets why_not (ending in `mixed`: why the groups must agree). Nullopt
/// when the file holds no such param groups; BadInput when one cannot be read.
std::optional<CompanionHyper> megatron_hyper(const Checkpoint&, const io::InputFile&,
                                             const std::string& mixed = kMegatronBufferMixes);

/// The param groups of a Megatron DistributedOptimizer.state_dict() value (its 'optimizer' /
/// 'param_groups'), of a ChainedOptimizer's list of them, or of the inner state_dict itself
/// (dp_reshardable's ShardedObject "optimizer.distributed.dp_group_idx_<G>.optimizer"); empty
/// when it holds none.
std::vector<const Value*> megatron_param_groups(const Value& optimizer);

/// args.decoupled_weight_decay of a Megatron file's pickled args (FusedAdam's adam_w_mode), if stated.
std::optional<bool> megatron_args_decoupled(const Checkpoint&);

/// One Megatron param group and the file it was read from.
struct MegatronGroup {
    const Checkpoint* ck;
    const io::InputFile* f;
    const Value* group;
};

/// megatron_hyper over groups gathered from one or more files (`file` names them in why_not).
std::optional<CompanionHyper> megatron_groups_hyper(const std::vector<MegatronGroup>& groups, std::optional<bool> args_decoupled,
                                                    const std::string& file, const std::string& mixed = kMegatronBufferMixes);

/// Read every element of a tensor (any float dtype, any strides) as double. For small
/// tensors only (step); throws BadInput.
std::vector<double> read_small_tensor(const Checkpoint&, const io::InputFile&, int tensor);

}  // namespace ckpt
