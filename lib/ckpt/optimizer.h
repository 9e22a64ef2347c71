// Finding the Adam/AdamW state in a parsed checkpoint: for every parameter, its moment
// tensors (exp_avg, exp_avg_sq[, max_exp_avg_sq]), step, param-group hyper-parameters and,
// when it can be located, the parameter tensor itself (theta, for the Adam L2 domain).
// Sources: torch.optim.Optimizer.state_dict layout (FACTS.md); safetensors files carry the
// state flattened as state.<idx>.<name> with hyper-parameters in __metadata__.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "codec/guard.h"
#include "io/checkpoint.h"
#include "io/file.h"

namespace ckpt {

/// Hyper-parameters given on the command line; each one set overrides the file's.
struct HyperOverrides {
    std::optional<double> lr, beta1, beta2, eps, weight_decay;
    std::optional<bool> amsgrad, maximize;
};

/// One parameter's optimizer state.
struct ParamState {
    std::string name;                 ///< path of its state entry, e.g. "optimizer/state/3"
    std::string index;                ///< the state key (param index or fqn)
    int tensor[3] = {-1, -1, -1};     ///< Checkpoint::tensors index of exp_avg, exp_avg_sq, max_exp_avg_sq
    int theta = -1;                   ///< parameter tensor, -1 when not located
    codec::AdamHyper hyper;
    std::optional<bool> decoupled;    ///< AdamW (true) / Adam (false) when the file says so
    bool compressible = false;        ///< moments are whole, contiguous, unshared FP32/F16/BF16 storages
    std::string why_not;              ///< reason when !compressible
};

/// Scan a checkpoint. Throws BadInput (e.g. a state entry whose moments disagree in
/// shape, a missing param group, unreadable step). An input without Adam state gives an
/// empty list (the caller decides whether that is an error).
std::vector<ParamState> find_param_states(const Checkpoint&, const io::InputFile&,
                                          const HyperOverrides&);

/// Read every element of a tensor (any float dtype, any strides) as double. For small
/// tensors only (step); throws BadInput.
std::vector<double> read_small_tensor(const Checkpoint&, const io::InputFile&, int tensor);

}  // namespace ckpt
