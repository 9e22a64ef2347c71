#include "ckpt/optimizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "codec/bf16.h"
#include "common/error.h"

namespace ckpt {

namespace {

const char* kMomentNames[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

bool contiguous(const TensorInfo& t) {
    int64_t expect = 1;
    for (std::size_t i = t.shape.size(); i-- > 0;) {
        if (t.shape[i] != 1 && t.stride[i] != expect) return false;
        expect *= t.shape[i];
    }
    return true;
}

double as_double(const Value& v, const std::string& what, const std::string& file) {
    if (auto d = std::get_if<double>(&v.v)) return *d;
    if (auto i = std::get_if<int64_t>(&v.v)) return double(*i);
    if (auto b = std::get_if<bool>(&v.v)) return *b ? 1.0 : 0.0;
    throw BadInput(file, "param_groups value '" + what + "' is not a number");
}

const char* kHyperNames[7] = {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize"};
double* hyper_field(codec::AdamHyper& h, int k) {
    double* f[5] = {&h.lr, &h.beta1, &h.beta2, &h.eps, &h.weight_decay};
    return k < 5 ? f[k] : nullptr;
}

/// Hyper-parameters of one param group given as a key -> number/bool lookup; sets the
/// HyperKey bit of every key the group states, and lr_divides when torch 2.x's
/// `capturable` or `differentiable` is set (out_of_range).
template <class Get>
void read_group(codec::AdamHyper& h, unsigned& stated, std::optional<bool>& decoupled, bool& lr_divides, Get get) {
    for (int k = 0; k < 7; ++k)
        if (auto v = get(kHyperNames[k])) {
            stated |= 1u << k;
            if (k < 5) *hyper_field(h, k) = *v;
            else (k == 5 ? h.amsgrad : h.maximize) = *v != 0;
        }
    if (auto v = get("decoupled_weight_decay")) decoupled = *v != 0;
    for (const char* k : {"capturable", "differentiable"})
        if (auto v = get(k)) lr_divides = lr_divides || *v != 0;
}

/// Overrides fill in what the file does not state; a different value for a stated key is
/// BadInput (the guarantee must hold for the hyper-parameters torch will load). A key the
/// file states in a narrower dtype (bits[k], ParamState::stated_bits) is compared in that
/// dtype, and the file's value is kept.
void apply(codec::AdamHyper& h, unsigned stated, const int* bits, const HyperOverrides& o, const std::string& file,
           const std::string& name) {
    const std::optional<double> num[5] = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
    const std::optional<bool> flag[2] = {o.amsgrad, o.maximize};
    for (int k = 0; k < 7; ++k) {
        const bool given = k < 5 ? num[k].has_value() : flag[k - 5].has_value();
        if (!given) continue;
        const double want = k < 5 ? *num[k] : (*flag[k - 5] ? 1.0 : 0.0);
        const double have = k < 5 ? *hyper_field(h, k) : ((k == 5 ? h.amsgrad : h.maximize) ? 1.0 : 0.0);
        if ((stated >> k & 1u) && k < 5 && bits[k] && codec::round_to_bits(want, bits[k]) == have) continue;
        if ((stated >> k & 1u) && want != have)
            throw BadInput(file, fmt::format("--{} {} contradicts the file's {} = {} for {}; overrides only fill in "
                                             "what the file does not state",
                                             kHyperNames[k] == std::string("weight_decay") ? "weight-decay" : kHyperNames[k],
                                             want, kHyperNames[k], have, name));
        if (k < 5) *hyper_field(h, k) = want;
        else (k == 5 ? h.amsgrad : h.maximize) = want != 0;
    }
}

/// Why hyper-parameters are outside what the guard covers ("" when inside): torch.optim.Adam's
/// own argument checks (0 <= betas < 1, eps >= 0, lr >= 0), a whole step count >= 0, and
/// lr / (1 - beta1^t) <= 2 (the FP32 range argument of the guard, codec/guard.h fp32_gate).
/// load_state_dict accepts all of these, so such states are kept exact, never refused.
/// With `lr_divides` (torch 2.x's capturable / differentiable Adam: denom =
/// sqrt(v) / (sqrt(bc2) * lr / bc1) + eps / (lr / bc1), torch/optim/adam.py) lr must be at
/// least 2^-40: then sqrt(v) <= 2^64 over sqrt(bc2) lr / bc1 >= 2^-60 cannot overflow FP32
/// (beta2 <= 1 - 2^-40, eps <= 2^60 there), and the update keeps the FP32 margin's roundings; below it
/// one run's denominator can become inf and its update 0 (issue: 118x tolerance at lr 5e-20).
std::string out_of_range(const codec::AdamHyper& h, bool lr_divides) {
    for (double x : {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step})
        if (!std::isfinite(x)) return "non-finite hyper-parameter";
    if (!(h.lr >= 0)) return fmt::format("lr = {} < 0", h.lr);
    if (!(h.beta1 >= 0 && h.beta1 < 1)) return fmt::format("beta1 = {} outside [0, 1)", h.beta1);
    if (!(h.beta2 >= 0 && h.beta2 < 1)) return fmt::format("beta2 = {} outside [0, 1)", h.beta2);
    if (!(h.eps >= 0)) return fmt::format("eps = {} < 0", h.eps);
    if (!(h.step >= 0) || h.step != std::floor(h.step) || h.step > 1e15) return fmt::format("step = {} is not a whole count >= 0", h.step);
    if (h.lr / (1 - std::pow(h.beta1, h.step + 1)) > 2) return "lr / (1 - beta1^t) > 2 (outside the FP32-safe range)";
    if (lr_divides && !(h.lr >= 0x1p-40 && h.beta2 <= 1 - 0x1p-40 && h.eps <= 0x1p60))
        return fmt::format("capturable / differentiable Adam divides by lr (lr = {}, beta2 = {}): certified only for "
                           "lr >= 2^-40, beta2 <= 1 - 2^-40 and eps <= 2^60", h.lr, h.beta2);
    return "";
}

/// Why an optimizer state is not torch Adam/AdamW ("" when it is), from its param group's
/// keys and its state keys (torch/optim/{adam,adamw,nadam,radam,adamax}.py, transformers
/// Adafactor and AdamW, bitsandbytes): Adam and AdamW have 'amsgrad' and 'betas' in every
/// group and only step / exp_avg / exp_avg_sq / max_exp_avg_sq in the state.
std::string not_adam(const std::vector<std::string>& group_keys, const std::vector<std::string>& state_keys) {
    auto has = [](const std::vector<std::string>& v, const char* k) { return std::find(v.begin(), v.end(), k) != v.end(); };
    if (has(group_keys, "momentum_decay") || has(state_keys, "mu_product")) return "NAdam state (not Adam)";
    if (has(state_keys, "momentum_buffer")) return "SGD state (not Adam)";
    if (has(state_keys, "exp_inf")) return "Adamax state (not Adam)";
    for (const char* k : {"clip_threshold", "decay_rate", "relative_step", "scale_parameter", "warmup_init"})
        if (has(group_keys, k)) return "Adafactor state (not Adam)";
    for (const auto& k : state_keys)
        if (k.rfind("exp_avg_sq_", 0) == 0 || k == "RMS") return "Adafactor state (not Adam)";
    if (has(group_keys, "correct_bias")) return "transformers AdamW state (not torch's AdamW update)";
    for (const auto& k : state_keys)
        if (k.rfind("state1", 0) == 0 || k.rfind("state2", 0) == 0 || k.rfind("qmap", 0) == 0 || k.rfind("absmax", 0) == 0)
            return "bitsandbytes quantized state (not FP32 Adam)";
    for (const auto& k : state_keys)
        if (k != "step" && k != "exp_avg" && k != "exp_avg_sq" && k != "max_exp_avg_sq")
            return "optimizer state with '" + k + "' (not Adam)";
    if (!has(group_keys, "betas")) return "param group without 'betas' (not Adam)";
    if (!has(group_keys, "amsgrad")) return "param group without 'amsgrad' (RAdam or another Adam variant, not Adam)";
    for (const char* k : {"momentum", "nesterov", "dampening", "lr_decay", "rho", "lambd", "alpha", "t0", "etas",
                          "step_sizes", "beta3", "initial_accumulator_value", "rectify", "degenerated_to_sgd"})
        if (has(group_keys, k)) return std::string("param group with '") + k + "' (not Adam)";
    return "";
}

/// Tensor references per storage over the whole object tree: a memo-shared tensor object
/// counts once per place it appears, so a moment shared with any other leaf is seen.
void count_refs(const Checkpoint& ck, const Value& v, std::map<std::size_t, int>& refs) {
    if (auto t = std::get_if<Value::Tensor>(&v.v)) { refs[ck.tensors[t->index].storage]++; return; }
    if (auto d = std::get_if<Value::Dict>(&v.v))  // tensors as dict keys count too
        for (const auto& kv : *d) count_refs(ck, kv.first, refs);
    v.for_each_child([&](const std::string&, const Value& c) { count_refs(ck, c, refs); });
}

/// The significant bits of a float dtype d (24 F32, 11 F16, 8 BF16; 0 for the exact ones:
/// integers, F64): a step tensor's +1 (AdamHyper::step_bits), a stated hyper-parameter.
int significant_bits(DType d) { return d == DType::F32 ? 24 : d == DType::F16 ? 11 : d == DType::BF16 ? 8 : 0; }

/// The dtype torch steps the state's parameter in: the mapped parameter's; else, with FP32
/// moments, FP32 (torch creates moments as zeros_like(param) and load_state_dict casts them
/// to the parameter's dtype, so a 16-bit parameter never leaves FP32 moments: same-shape
/// 16-bit tensors are copies, e.g. ultralytics' ema.half()); else a 16-bit one among the
/// same-shape candidates (any could be it), FP32 when all are; else, with no model tensor in
/// the file, the moments' own dtype `moments`.
DType parameter_dtype(const Checkpoint& ck, const ParamState& p, DType moments) {
    if (p.theta >= 0) return ck.tensors[std::size_t(p.theta)].dtype;
    if (moments == DType::F32) return DType::F32;
    if (p.theta_candidates && !p.theta_candidates->empty()) {
        for (int t : *p.theta_candidates) {
            const DType d = ck.tensors[std::size_t(t)].dtype;
            if (d == DType::BF16 || d == DType::F16) return d;
        }
        return DType::F32;
    }
    return moments;
}

/// Decide whether the moments can be replaced by codes: each one a whole, contiguous
/// storage of FP32/F16/BF16 with the same element count, referenced once in the whole
/// file (not shared with another moment or any other leaf).
void check_compressible(const Checkpoint& ck, const std::map<std::size_t, int>& refs, ParamState& p) {
    if (!p.why_not.empty()) return;  // not Adam, or hyper-parameters out of range
    const int nm = p.hyper.amsgrad ? 3 : 2;
    int64_t n = -1;
    DType dt{};
    std::set<std::size_t> used;
    for (int k = 0; k < nm; ++k)
        if (p.tensor[k] >= 0 && !used.insert(ck.tensors[std::size_t(p.tensor[k])].storage).second) {
            p.why_not = std::string(kMomentNames[k]) + " is the same tensor as another moment";
            return;
        }
    for (int k = 0; k < nm; ++k) {
        if (p.tensor[k] < 0) { p.why_not = std::string(kMomentNames[k]) + " is missing"; return; }
        const TensorInfo& t = ck.tensors[std::size_t(p.tensor[k])];
        const StorageInfo& s = ck.storages[t.storage];
        if (!float_dtype_size(t.dtype)) { p.why_not = "dtype " + std::string(dtype_name(t.dtype)); return; }
        if (k == 0) { n = t.numel(); dt = t.dtype; }
        if (t.numel() != n || t.dtype != dt) { p.why_not = "moments differ in size or dtype"; return; }
        if (t.storage_offset != 0 || int64_t(s.numel) != n || s.dtype != t.dtype) { p.why_not = "moment is a view"; return; }
        if (!contiguous(t)) {   // a whole storage in another element order (channels_last)
            p.why_not = std::string(kMomentNames[k]) + " is not contiguous (a memory format such as channels_last)";
            return;
        }
        const auto r = refs.find(t.storage);
        if (r == refs.end() || r->second != 1) { p.why_not = std::string(kMomentNames[k]) + " shares its storage with another leaf"; return; }
    }
    if (n == 0) { p.why_not = "empty"; return; }
    auto shape_ok = [&](int th) {
        const TensorInfo& x = ck.tensors[std::size_t(th)];
        return x.numel() == n && x.shape == ck.tensors[std::size_t(p.tensor[0])].shape;
    };
    if (p.theta >= 0 && !shape_ok(p.theta)) p.theta = -1;
    // torch steps a parameter in its own dtype and casts loaded moments to it
    // (_single_tensor_adam, Optimizer.load_state_dict): a 16-bit parameter's update rounds
    // to its ulp (~0.4% of |theta| for BF16), far above any tolerance in lr units, so no
    // certificate in FP32 arithmetic holds for it
    const DType pd = parameter_dtype(ck, p, dt);
    if (pd == DType::BF16 || pd == DType::F16) {
        const char* d = pd == DType::BF16 ? "bfloat16" : "float16";
        p.why_not = fmt::format("{} parameter (torch steps it in {}: each update rounds to a {} ulp of the parameter, "
                                "above the tolerance)", d, d, d);
        return;
    }
    p.compressible = true;
}

/// Float tensors of a module state_dict by key (the model's parameters and buffers).
std::vector<std::pair<std::string, int>> model_tensors(const Checkpoint& ck, const Value& model) {
    std::vector<std::pair<std::string, int>> out;
    for (const auto& [k, v] : std::get<Value::Dict>(model.v)) {
        auto t = std::get_if<Value::Tensor>(&v.v);
        if (!t) continue;
        const DType d = ck.tensors[t->index].dtype;
        if (d != DType::F32 && d != DType::F16 && d != DType::BF16 && d != DType::F64) continue;
        out.push_back({k.key_text(), int(t->index)});
    }
    return out;
}

/// The model tensors of a file, indexed once for map_theta (which runs per optimizer
/// state): by key, and per shape the candidates deduplicated by (storage, offset) (tied
/// weights appear once), in model order. A shape's candidate list is built once and shared
/// by every state of that shape, so a file of many same-shape tensors costs linear time and
/// memory, not quadratic.
class ModelIndex {
public:
    /// `model`: (key, Checkpoint::tensors index) of every model tensor, in file order.
    ModelIndex(const Checkpoint& ck, const std::vector<std::pair<std::string, int>>& model) : ck_(ck), model_(model) {
        for (const auto& [k, t] : model) by_key_[k].push_back(t);
    }
    /// The first tensor named `key` with this shape, or -1.
    int by_key(const std::string& key, const std::vector<int64_t>& shape) const {
        auto it = by_key_.find(key);
        if (it != by_key_.end())
            for (int t : it->second)
                if (ck_.tensors[std::size_t(t)].shape == shape) return t;
        return -1;
    }
    /// Candidates of one shape and the key of the last one (the name when it is the only one).
    struct Group {
        std::shared_ptr<const std::vector<int>> tensors;
        std::string last_key;
    };
    const Group& by_shape(const std::vector<int64_t>& shape) {
        if (by_shape_.empty() && !model_.empty()) build_shapes();
        static const Group kNone{std::make_shared<const std::vector<int>>(), std::string()};
        auto it = by_shape_.find(shape);
        return it == by_shape_.end() ? kNone : it->second;
    }

private:
    void build_shapes() {
        std::map<std::vector<int64_t>, std::vector<int>> lists;
        std::map<std::vector<int64_t>, std::string> last;
        std::set<std::pair<std::size_t, int64_t>> seen;
        for (const auto& [k, t] : model_) {
            const TensorInfo& ti = ck_.tensors[std::size_t(t)];
            if (!seen.insert({ti.storage, ti.storage_offset}).second) continue;
            lists[ti.shape].push_back(t);
            last[ti.shape] = k;
        }
        for (auto& [shape, l] : lists)
            by_shape_[shape] = Group{std::make_shared<const std::vector<int>>(std::move(l)), last[shape]};
    }
    const Checkpoint& ck_;
    const std::vector<std::pair<std::string, int>>& model_;
    std::unordered_map<std::string, std::vector<int>> by_key_;
    std::map<std::vector<int64_t>, Group> by_shape_;
};

/// The model tensor stored under `name` (or "model." / "module." + name) with this shape; -1 if none.
int tensor_named(ModelIndex& model, const std::string& name, const std::vector<int64_t>& shape) {
    for (const std::string& pre : {std::string(), std::string("model."), std::string("module.")})
        if (const int t = model.by_key(pre + name, shape); t >= 0) return t;
    return -1;
}

/// Map one optimizer state to its parameter: by name (param_names or an FQN state key,
/// also with the "model." / "module." prefixes Lightning and DDP add) when one is given,
/// otherwise every model tensor of the same shape is a candidate (one candidate: mapped;
/// several: theta_candidates, the union of their domains is certified).
void map_theta(const Checkpoint& ck, ModelIndex& model, const std::string& given_name, ParamState& p) {
    if (p.tensor[0] < 0) return;
    const auto& shape = ck.tensors[std::size_t(p.tensor[0])].shape;
    if (!given_name.empty()) {
        p.name = given_name;
        if (const int t = tensor_named(model, given_name, shape); t >= 0) { p.theta = t; return; }
    }
    const ModelIndex::Group& g = model.by_shape(shape);
    if (g.tensors->size() == 1) {
        p.theta = (*g.tensors)[0];
        if (given_name.empty()) p.name = g.last_key;
    } else if (!g.tensors->empty()) {
        p.theta_candidates = g.tensors;
    }
}

/// A module state_dict's float tensors as names_by_order takes them: (key, shape) in file
/// order, deduplicated (tied weights appear once, as in model.parameters()).
ModelTensors model_params(const Checkpoint& ck, const Value& model) {
    ModelTensors out;
    std::set<std::tuple<std::size_t, int64_t, std::vector<int64_t>>> seen;
    for (const auto& [k, v] : std::get<Value::Dict>(model.v)) {
        auto t = std::get_if<Value::Tensor>(&v.v);
        if (!t) return {};
        const TensorInfo& ti = ck.tensors[t->index];
        if (!float_dtype_size(ti.dtype) && ti.dtype != DType::F64) continue;
        if (!seen.insert({ti.storage, ti.storage_offset, ti.shape}).second) continue;
        out.push_back({k.key_text(), ti.shape});
    }
    return out;
}

/// names_by_order for one model: param id -> key, or an empty map and why.
std::pair<std::map<std::string, std::string>, std::string> order_one(const ModelTensors& model, const GroupShapes& groups) {
    std::size_t total = 0;
    for (const auto& g : groups) total += g.size();
    // model tensors of a shape no state has are buffers (a causal mask, position ids) when
    // every state's shape is known: left out; so are BatchNorm statistics
    std::set<std::vector<int64_t>> shapes;
    bool all_known = true;
    for (const auto& g : groups)
        for (const auto& [id, shape] : g) {
            if (shape) shapes.insert(*shape);
            else all_known = false;
        }
    std::vector<const std::pair<std::string, std::vector<int64_t>>*> params;
    for (const auto& t : model) {
        if (t.first.ends_with("running_mean") || t.first.ends_with("running_var") || t.first.ends_with("num_batches_tracked")) continue;
        if (!all_known || shapes.count(t.second)) params.push_back(&t);
    }
    if (params.size() < total)
        return {{}, fmt::format("the model state_dict has {} tensors for the {} parameters of the param groups", params.size(), total)};
    // Depth-first search, iterative (one level per model tensor: a recursive search
    // overflowed the stack at 10^5 parameters). choice[k] is the group that model tensor k is
    // taken from, or G: skipped (only while enough tensors remain for the parameters left).
    // The search stops at a second solution or when the step budget (enough for one pass
    // down and back per group) runs out.
    const std::size_t G = groups.size();
    std::vector<std::size_t> pos(G, 0);
    std::vector<int> choice(params.size() + 1, -1);
    std::map<std::string, std::string> found;
    int solutions = 0;
    std::size_t assigned = 0;
    long budget = 200000 + 4 * long(params.size()) * long(G + 2);
    auto undo = [&](std::size_t i) {
        if (choice[i] < int(G)) { --pos[std::size_t(choice[i])]; --assigned; }
    };
    std::size_t k = 0;
    while (solutions <= 1 && --budget >= 0) {
        if (k == params.size()) {
            if (assigned == total && ++solutions == 1) {
                std::vector<std::size_t> at(G, 0);
                for (std::size_t i = 0; i < k; ++i)
                    if (const std::size_t g = std::size_t(choice[i]); g < G) found[groups[g][at[g]++].first] = params[i]->first;
            }
            if (k == 0) break;
            undo(--k);
            continue;  // try the next choice for model tensor k
        }
        const auto& shape = params[k]->second;
        std::size_t g = std::size_t(choice[k] + 1);
        for (; g < G; ++g) {
            if (pos[g] >= groups[g].size()) continue;
            const auto* want = groups[g][pos[g]].second;
            if (!want || *want == shape) break;
        }
        if (g < G || (g == G && params.size() - k - 1 >= total - assigned)) {
            choice[k] = int(g);
            if (g < G) { ++pos[g]; ++assigned; }
            choice[++k] = -1;
        } else {
            choice[k] = -1;
            if (k == 0) break;
            undo(--k);
        }
    }
    if (budget < 0) return {{}, "too many ways to match the model state_dict's tensors to the param groups"};
    if (solutions == 0) return {{}, "the model state_dict's tensors do not fit the param groups in order"};
    if (solutions > 1) return {{}, "same-shape tensors fit the param groups in more than one way"};
    return {found, ""};
}

/// The parameters of an nn.Module pickled whole (torch.save(model)) as model.parameters()
/// lists them: its own _parameters, then each child's in _modules, recursively, a tied
/// parameter once; keys as named_parameters() gives them. Appends nothing for other values.
void module_params(const Checkpoint& ck, const Value& v, const std::string& prefix, int depth, ModelTensors& out,
                   std::set<std::pair<std::size_t, int64_t>>& seen) {
    const Value::Object* o = v.object();
    const Value* ps = o ? o->attr("_parameters") : nullptr;
    const Value* ms = o ? o->attr("_modules") : nullptr;
    const auto* pd = ps ? std::get_if<Value::Dict>(&ps->v) : nullptr;
    const auto* md = ms ? std::get_if<Value::Dict>(&ms->v) : nullptr;
    if (!pd || depth > 64) return;
    for (const auto& [k, x] : *pd)
        if (const auto* t = std::get_if<Value::Tensor>(&x.v)) {   // None: a parameter registered unset
            const TensorInfo& ti = ck.tensors[t->index];
            if (seen.insert({ti.storage, ti.storage_offset}).second) out.push_back({prefix + k.key_text(), ti.shape});
        }
    if (md)
        for (const auto& [k, c] : *md) module_params(ck, c, prefix + k.key_text() + ".", depth + 1, out, seen);
}

/// Report names from the file's module state_dicts (names_by_order over each).
std::pair<std::map<std::string, std::string>, std::string> names_from_models(
        const Checkpoint& ck, const std::vector<std::pair<const Value*, std::string>>& models, const GroupShapes& seq) {
    std::vector<ModelTensors> tensors;
    for (const auto& [m, path] : models) tensors.push_back(model_params(ck, *m));
    return names_by_order(tensors, seq);
}

bool is_integer_key(const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> dict_keys(const Value& v) {
    std::vector<std::string> k;
    if (auto d = std::get_if<Value::Dict>(&v.v)) for (const auto& kv : *d) k.push_back(kv.first.key_text());
    return k;
}

/// DeepSpeed FusedAdam (deepspeed/ops/adam/fused_adam.py) has torch Adam's update when
/// bias_correction is on; Adam vs AdamW is its adam_w_mode, which only the engine's
/// ds_config records (`optimizer.type` Adam/AdamW, `params.adam_w_mode`, default True in
/// runtime/config.py). Sets p.decoupled; returns why not Adam ("" when it is).
std::string fused_adam(const Value& g, const Value* ds_config, ParamState& p) {
    const Value* bc = g.get("bias_correction");
    if (!bc || !std::holds_alternative<bool>(bc->v) || !std::get<bool>(bc->v)) return "FusedAdam without bias correction (not Adam)";
    const Value* oc = ds_config ? ds_config->get("optimizer") : nullptr;
    const Value* type = oc ? oc->get("type") : nullptr;
    const auto* ts = type ? std::get_if<std::string>(&type->v) : nullptr;
    if (!ts) return "DeepSpeed FusedAdam state without ds_config.optimizer (adam_w_mode unknown)";
    std::string t = *ts;
    std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (t != "adam" && t != "adamw" && t != "fusedadam") return "ds_config optimizer '" + *ts + "' (not Adam)";
    bool w = true;
    if (const Value* prm = oc->get("params"))
        if (const Value* m = prm->get("adam_w_mode"))
            if (auto b = std::get_if<bool>(&m->v)) w = *b;
    p.decoupled = t == "adamw" || w;
    p.hyper.amsgrad = false;  // FusedAdam has no amsgrad
    return "";
}

/// The hyper-parameters a torch param group `g` states (read_group: lr, betas, eps, weight
/// decay, amsgrad, maximize, decoupled_weight_decay, capturable / differentiable) into p; a
/// value held as a 0-d tensor (capturable's lr) sets its stated_bits.
void read_torch_group(const Checkpoint& ck, const io::InputFile& f, const Value& g, ParamState& p) {
    read_group(p.hyper, p.stated, p.decoupled, p.lr_divides, [&](const char* key) -> std::optional<double> {
        std::string kk = key;
        if (kk == "beta1" || kk == "beta2") {
            const Value* b = g.get("betas");
            const auto* bl = b ? std::get_if<Value::List>(&b->v) : nullptr;
            if (!bl || bl->size() != 2) return std::nullopt;
            return as_double((*bl)[kk == "beta1" ? 0 : 1], "betas", f.path());
        }
        const Value* v = g.get(kk);
        if (!v || std::holds_alternative<Value::None>(v->v)) return std::nullopt;
        if (auto ti = std::get_if<Value::Tensor>(&v->v)) {  // lr as a 0-d tensor (capturable)
            const auto x = read_small_tensor(ck, f, int(ti->index));
            if (x.size() != 1) throw BadInput(f.path(), "param_groups value '" + kk + "' is not a scalar");
            for (int k = 0; k < 5; ++k)
                if (kk == kHyperNames[k]) p.stated_bits[k] = significant_bits(ck.tensors[ti->index].dtype);
            return x[0];
        }
        return as_double(*v, kk, f.path());
    });
}

/// The states of one optimizer state_dict `opt` found at `prefix`; `models` the file's
/// module state_dicts (for report names), `masters` DeepSpeed's fp32 partitions for its flat
/// groups (or null), `modules` the parameters of nn.Modules pickled whole (tried first). A
/// state the file does not name is reported by its path and why ("optimizer/state/3 (no
/// parameter names in the file)"). Appends to out.
void scan_optimizer(const Checkpoint& ck, const io::InputFile& f, const HyperOverrides& o, const Value& opt,
                    const std::string& prefix, const std::vector<std::pair<const Value*, std::string>>& models,
                    const std::vector<ModelTensors>& modules,
                    ModelIndex& model_index, const Value::List* masters, const std::map<std::size_t, int>& refs, const Value* ds_config,
                    std::vector<ParamState>& out) {
    const auto* groups = std::get_if<Value::List>(&opt.get("param_groups")->v);
    if (!groups) throw BadInput(f.path(), "param_groups is not a list");
    // index -> (group, name from param_names when the group has them)
    std::map<std::string, std::pair<const Value*, std::string>> where;
    for (const Value& g : *groups) {
        const Value* ps = g.get("params");
        const auto* pl = ps ? std::get_if<Value::List>(&ps->v) : nullptr;
        if (!pl) throw BadInput(f.path(), "a param group has no 'params' list");
        const Value* pn = g.get("param_names");
        const auto* nl = pn ? std::get_if<Value::List>(&pn->v) : nullptr;
        for (std::size_t i = 0; i < pl->size(); ++i) {
            std::string name;
            if (nl && nl->size() == pl->size())
                if (auto s = std::get_if<std::string>(&(*nl)[i].v)) name = *s;
            where[(*pl)[i].key_text()] = {&g, name};
        }
    }
    std::map<std::string, std::string> likely_name;  // state index -> model key (reports only)
    std::string unnamed_why;                          // why likely_name is empty
    if (masters) {
        unnamed_why = "a DeepSpeed flat partition of many parameters";
    } else {
        GroupShapes seq;
        std::unordered_map<std::string, const Value*> state_of;  // one pass: Value::get is linear
        if (const auto* sd = std::get_if<Value::Dict>(&opt.get("state")->v))
            for (const auto& [k, st] : *sd) state_of.emplace(k.key_text(), &st);
        for (const Value& g : *groups) {
            seq.emplace_back();
            for (const Value& p : std::get<Value::List>(g.get("params")->v)) {
                const std::vector<int64_t>* shape = nullptr;
                const auto found_st = state_of.find(p.key_text());
                if (const Value* st = found_st == state_of.end() ? nullptr : found_st->second)
                    if (const Value* m = st->get("exp_avg"))
                        if (auto ti = std::get_if<Value::Tensor>(&m->v)) shape = &ck.tensors[ti->index].shape;
                seq.back().push_back({p.key_text(), shape});
            }
        }
        std::tie(likely_name, unnamed_why) = names_by_order(modules, seq);
        if (modules.empty() || !unnamed_why.empty()) {   // the state_dicts, unless a module fits
            auto [names, why] = names_from_models(ck, models, seq);
            if (why.empty() || modules.empty()) std::tie(likely_name, unnamed_why) = std::tie(names, why);
        }
    }
    // the path when neither param_names, an FQN key, the model state_dicts nor a unique
    // shape name it, and why
    auto say_why = [&](ParamState& p) {
        if (p.name != prefix + "state/" + p.index) return;
        if (!is_integer_key(p.index)) p.name = p.index;
        else p.name += " (" + (unnamed_why.empty() ? std::string("in no param group") : unnamed_why) + ")";
    };
    for (const auto& [k, st] : std::get<Value::Dict>(opt.get("state")->v)) {
        if (!st.is_dict()) continue;
        ParamState p;
        p.index = k.key_text();
        p.name = prefix + "state/" + p.index;
        for (int m = 0; m < 3; ++m)
            if (const Value* t = st.get(kMomentNames[m]))
                if (auto ti = std::get_if<Value::Tensor>(&t->v)) p.tensor[m] = int(ti->index);
        for (const auto& [sk, sv] : std::get<Value::Dict>(st.v)) {  // exp_inf, momentum_buffer, ...
            const std::string key = sk.key_text();
            const auto* t = std::get_if<Value::Tensor>(&sv.v);
            if (t && !ck.tensors[t->index].shape.empty() && key != "step" &&
                std::find(std::begin(kMomentNames), std::end(kMomentNames), key) == std::end(kMomentNames))
                p.other_tensors.push_back(int(t->index));
        }
        auto w = where.find(p.index);
        if (p.tensor[0] < 0 && p.tensor[1] < 0) {  // no Adam-like moments (SGD, ...): kept exact, named
            if (p.other_tensors.empty()) continue;  // nothing stored (SGD without momentum)
            std::string why = not_adam(w == where.end() ? std::vector<std::string>{} : dict_keys(*w->second.first), dict_keys(st));
            p.why_not = why.empty() ? "optimizer state without exp_avg / exp_avg_sq (not Adam)" : why;
            if (w != where.end() && !w->second.second.empty()) p.name = w->second.second;
            else if (likely_name.count(p.index)) p.name = likely_name[p.index];
            say_why(p);
            out.push_back(std::move(p));
            continue;
        }
        if (w == where.end()) throw BadInput(f.path(), "optimizer state " + p.index + " belongs to no param group");
        const Value& g = *w->second.first;
        read_torch_group(ck, f, g, p);
        const Value* step = st.get("step");
        const bool fused = g.get("bias_correction") != nullptr;  // DeepSpeed FusedAdam keeps step in the group
        if (!step && fused) step = g.get("step");
        if (!step) throw BadInput(f.path(), "optimizer state " + p.index + " has no step");
        if (auto ti = std::get_if<Value::Tensor>(&step->v)) {
            const auto s = read_small_tensor(ck, f, int(ti->index));
            if (s.size() != 1) throw BadInput(f.path(), "step of state " + p.index + " is not a scalar");
            p.hyper.step = s[0];
            p.hyper.step_bits = significant_bits(ck.tensors[ti->index].dtype);
        } else {
            p.hyper.step = as_double(*step, "step", f.path());
            if (!fused) {
                // torch's Adam / AdamW turn a number step into a float32 tensor when they load
                // it (__setstate__: torch.tensor(float(step)); 16777217 becomes 16777216) and
                // count on in float32: certify for that count. DeepSpeed's FusedAdam keeps an
                // exact int in its group.
                p.hyper.step = codec::round_to_bits(p.hyper.step, 24);
                p.hyper.step_bits = 24;
                p.stated |= kStepNumber;
            }
        }
        if (masters) {  // DeepSpeed: state i of flat group g <-> master partition g
            const auto gi = std::size_t(std::find_if(groups->begin(), groups->end(), [&](const Value& x) { return &x == &g; }) - groups->begin());
            if (gi < masters->size())
                if (auto t = std::get_if<Value::Tensor>(&(*masters)[gi].v)) p.theta = int(t->index);
        } else {
            map_theta(ck, model_index, !w->second.second.empty() ? w->second.second : is_integer_key(p.index) ? "" : p.index, p);
        }
        // parameter order over the map_theta's key of a unique shape (a module's own key, "bias")
        if (w->second.second.empty() && is_integer_key(p.index) && likely_name.count(p.index)) {
            p.name = likely_name[p.index];
            if (p.theta < 0 && p.tensor[0] >= 0)
                p.theta_likely = tensor_named(model_index, p.name, ck.tensors[std::size_t(p.tensor[0])].shape);
        }
        apply(p.hyper, p.stated, p.stated_bits, o, f.path(), p.name);
        p.why_not = fused ? fused_adam(g, ds_config, p) : not_adam(dict_keys(g), dict_keys(st));
        if (p.why_not.empty()) p.why_not = out_of_range(p.hyper, p.lr_divides);
        check_compressible(ck, refs, p);
        say_why(p);
        out.push_back(std::move(p));
    }
}


/// Where optimizer state_dicts and module state_dicts sit in a checkpoint's object tree.
struct Found {
    std::vector<std::pair<const Value*, std::string>> opts;   ///< state_dict, path prefix ("optimizer/")
    std::vector<std::pair<const Value*, std::string>> models; ///< dicts of tensors (module state_dicts)
    std::vector<const Value*> modules;                         ///< nn.Modules pickled whole (outermost)
    /// DeepSpeed ZeRO: the fp32 master partitions next to base_optimizer_state (ZeRO-1/2, bf16)
    /// or optimizer_state_dict (ZeRO-3), per opt
    std::map<const Value*, const Value::List*> masters;
    /// Megatron-LM distrib_optim.pt: the flat buffers {"param", "exp_avg", "exp_avg_sq", ...}
    /// of DistributedOptimizer.get_parameter_state_dp_zero, with their paths
    std::vector<std::pair<const Value*, std::string>> flat;
};

/// A Megatron-LM distrib_optim.pt buffer (megatron/core/optimizer/distrib_optimizer.py
/// get_parameter_state_dp_zero: state[model chunk][(param dtype, grad dtype)] = {"param",
/// "exp_avg", "exp_avg_sq": 1-D fp32 world tensors, "numel_unpadded"}): a dict whose "param",
/// "exp_avg" and "exp_avg_sq" are tensors, with no "state" / "param_groups" (a torch
/// optimizer state_dict is never one).
bool is_megatron_buffer(const Value& v) {
    if (!v.is_dict() || v.get("state")) return false;
    for (const char* k : {"param", "exp_avg", "exp_avg_sq"}) {
        const Value* t = v.get(k);
        if (!t || !std::holds_alternative<Value::Tensor>(t->v)) return false;
    }
    return true;
}

bool is_opt(const Value& v) {
    return v.is_dict() && v.get("state") && v.get("param_groups") && v.get("state")->is_dict() &&
           v.get("param_groups")->is_list();
}

/// Search the whole tree (dicts, lists, tuples, opaque objects' arguments and state) for
/// optimizer state_dicts (a dict with a 'state' dict and a 'param_groups' list: torch,
/// HF optimizer.pt, Lightning's optimizer_states list, DeepSpeed's base_optimizer_state,
/// several optimizers per file) and module state_dicts (a non-empty dict of tensors).
void find_tree(const Value& v, const std::string& path, int depth, Found& out, bool in_module = false) {
    if (depth > 64) return;
    if (is_opt(v)) {
        out.opts.push_back({&v, path});
        return;
    }
    if (const Value::Object* o = v.object(); o && o->attr("_parameters") && o->attr("_modules")) {
        if (!in_module) out.modules.push_back(&v);
        in_module = true;
    }
    if (is_megatron_buffer(v)) {
        out.flat.push_back({&v, path});
        return;
    }
    if (auto d = std::get_if<Value::Dict>(&v.v); d && !d->empty()) {
        bool all = true;
        for (const auto& kv : *d) all = all && std::holds_alternative<Value::Tensor>(kv.second.v);
        if (all) { out.models.push_back({&v, path}); return; }
        // DeepSpeed ZeRO 1/2 (runtime/zero/stage_1_and_2.py state_dict): the master weights
        // of base_optimizer_state's flat groups
        if (const Value* b = v.get("base_optimizer_state"); b && is_opt(*b))
            if (const Value* m = v.get("single_partition_of_fp32_groups"))
                if (auto l = std::get_if<Value::List>(&m->v)) out.masters[b] = l;
        // ZeRO-3 (runtime/zero/stage3.py _rigid_state_dict): optimizer_state_dict's flat
        // groups, their masters in fp32_flat_groups
        if (const Value* b = v.get("optimizer_state_dict"); b && is_opt(*b))
            if (const Value* m = v.get("fp32_flat_groups"))
                if (auto l = std::get_if<Value::List>(&m->v)) out.masters[b] = l;
    }
    v.for_each_child([&](const std::string& seg, const Value& c) { find_tree(c, path + seg + "/", depth + 1, out, in_module); });
}

/// A dict key as a report path segment: key_text, with a tuple's items in parentheses and a
/// class by its name ((torch.bfloat16, torch.float32) -> "(bfloat16, float32)").
std::string key_label(const Value& k) {
    if (const auto* l = std::get_if<Value::List>(&k.v)) {
        std::string s;
        for (const Value& x : *l) s += (s.empty() ? "" : ", ") + key_label(x);
        return "(" + s + ")";
    }
    if (const Value::Object* o = k.object()) return o->name;
    return k.key_text();
}

/// The path of the Megatron buffer `buf` under `v` ("0/(bfloat16, float32)"; a ChainedOptimizer's
/// list index first) in key_label segments; nullopt when not within 4 levels.
std::optional<std::string> megatron_label(const Value& v, const Value* buf, int depth) {
    if (&v == buf) return std::string();
    if (depth > 4) return std::nullopt;
    auto below = [&](const std::string& seg, const Value& c) -> std::optional<std::string> {
        if (auto r = megatron_label(c, buf, depth + 1)) return r->empty() ? seg : seg + "/" + *r;
        return std::nullopt;
    };
    if (const auto* d = std::get_if<Value::Dict>(&v.v))
        for (const auto& [k, c] : *d)
            if (auto r = below(key_label(k), c)) return r;
    if (const auto* l = std::get_if<Value::List>(&v.v))
        for (std::size_t i = 0; i < l->size(); ++i)
            if (auto r = below(std::to_string(i), (*l)[i])) return r;
    return std::nullopt;
}

/// The state of one Megatron distrib_optim.pt buffer `buf` at `path`: its exp_avg /
/// exp_avg_sq, theta its "param" (the fp32 main parameters of the same coordinates), the
/// hyper-parameters and step o.companion states (model_optim_rng.pt); without one, kept
/// exact (or, under unstated_ok, ckpt-verify re-deriving the plan: the manifest's, step
/// unstated). Appends to out.
void scan_megatron(const Checkpoint& ck, const io::InputFile& f, const HyperOverrides& o, const Value& buf,
                   const std::string& path, const std::map<std::size_t, int>& refs, std::vector<ParamState>& out) {
    ParamState p;
    p.index = path;
    p.name = "distrib_optim/" + path;
    while (p.name.back() == '/') p.name.pop_back();
    p.tensor[0] = int(std::get<Value::Tensor>(buf.get("exp_avg")->v).index);
    p.tensor[1] = int(std::get<Value::Tensor>(buf.get("exp_avg_sq")->v).index);
    p.theta = int(std::get<Value::Tensor>(buf.get("param")->v).index);
    if (o.companion) {
        const CompanionHyper& c = *o.companion;
        p.hyper = c.hyper;
        p.stated = c.stated;
        std::copy(std::begin(c.stated_bits), std::end(c.stated_bits), p.stated_bits);
        p.decoupled = c.decoupled;
        p.lr_divides = c.lr_divides;
        p.why_not = c.why_not;
    } else if (o.unstated_ok) {
        p.stated = kStepUnstated;
    } else {
        p.why_not = "a Megatron distrib_optim.pt buffer: its hyper-parameters and step are in the model_optim_rng.pt "
                    "beside it, not in this file (folder mode reads them)";
    }
    apply(p.hyper, p.stated, p.stated_bits, o, f.path(), p.name);
    if (p.why_not.empty()) p.why_not = out_of_range(p.hyper, p.lr_divides);
    check_compressible(ck, refs, p);
    out.push_back(std::move(p));
}

std::vector<ParamState> scan_torch(const Checkpoint& ck, const io::InputFile& f, const HyperOverrides& o) {
    Found found;
    find_tree(ck.root, "", 0, found);
    std::vector<ParamState> out;
    std::vector<std::pair<std::string, int>> mt;  // every model tensor in the file (theta candidates)
    for (const auto& [m, path] : found.models)
        for (auto& kv : model_tensors(ck, *m)) mt.push_back(kv);
    ModelIndex model_index(ck, mt);
    std::vector<ModelTensors> modules(found.modules.size());
    for (std::size_t i = 0; i < modules.size(); ++i) {
        std::set<std::pair<std::size_t, int64_t>> seen;
        module_params(ck, *found.modules[i], "", 0, modules[i], seen);
    }
    std::map<std::size_t, int> refs;
    count_refs(ck, ck.root, refs);
    for (const auto& [opt, prefix] : found.opts)
        scan_optimizer(ck, f, o, *opt, prefix, found.models, modules, model_index,
                       found.masters.count(opt) ? found.masters.at(opt) : nullptr, refs,
                       ck.root.is_dict() ? ck.root.get("ds_config") : nullptr, out);
    for (const auto& [buf, path] : found.flat) scan_megatron(ck, f, o, *buf, megatron_label(ck.root, buf, 0).value_or(path), refs, out);
    return out;
}

std::vector<ParamState> scan_safetensors(const Checkpoint& ck, const io::InputFile& f, const HyperOverrides& o) {
    std::map<std::string, ParamState> by_index;
    std::map<std::string, std::vector<std::string>> fields;
    std::map<std::string, int> step_tensor;
    std::vector<std::pair<std::string, int>> model;
    for (const auto& [k, v] : std::get<Value::Dict>(ck.root.v)) {
        auto t = std::get_if<Value::Tensor>(&v.v);
        if (!t) continue;
        const std::string name = k.key_text();
        if (name.rfind("state.", 0) != 0) {
            const DType d = ck.tensors[t->index].dtype;
            if (d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64) model.push_back({name, int(t->index)});
            continue;
        }
        const auto dot = name.rfind('.');
        if (dot <= 6) continue;
        const std::string idx = name.substr(6, dot - 6), field = name.substr(dot + 1);
        ParamState& p = by_index[idx];
        p.index = idx;
        p.name = "state." + idx;
        fields[idx].push_back(field);
        for (int m = 0; m < 3; ++m)
            if (field == kMomentNames[m]) p.tensor[m] = int(t->index);
        if (field == "step") step_tensor[idx] = int(t->index);
    }
    std::map<std::string, std::string> meta;
    if (const Value* md = ck.root.get("__metadata__"); md && md->is_dict())
        for (const auto& [k, v] : std::get<Value::Dict>(md->v))
            if (auto s = std::get_if<std::string>(&v.v)) meta[k.key_text()] = *s;
    nlohmann::json groups = nlohmann::json::array(), names = nlohmann::json::array();
    try {
        if (meta.count("param_groups")) groups = nlohmann::json::parse(meta["param_groups"]);
        if (meta.count("param_names")) names = nlohmann::json::parse(meta["param_names"]);
    } catch (const std::exception& e) {
        throw BadInput(f.path(), std::string("__metadata__ JSON is malformed: ") + e.what());
    }
    // the flat metadata form (no param_groups): Python-literal strings read as JSON
    const bool flat_adam = !meta.count("param_groups") && meta.count("optimizer") &&
                           (meta["optimizer"] == "adam" || meta["optimizer"] == "adamw");
    nlohmann::json flat_group = nlohmann::json::object();
    if (flat_adam)
        for (const char* k : {"lr", "betas", "beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize"}) {
            if (!meta.count(k)) continue;
            std::string t = meta[k];
            for (char& c : t) c = c == '(' ? '[' : c == ')' ? ']' : c;
            if (t == "True" || t == "False") t = t == "True" ? "true" : "false";
            try {
                flat_group[k] = nlohmann::json::parse(t);
            } catch (const std::exception&) {
                throw BadInput(f.path(), std::string("__metadata__ '") + k + "' is not a number: " + meta[k]);
            }
        }
    if (flat_group.contains("betas"))   // betas and beta1 / beta2 both: they must agree
        for (int b = 0; b < 2; ++b) {
            const char* k = b ? "beta2" : "beta1";
            const auto& bs = flat_group["betas"];
            if (flat_group.contains(k) && (!bs.is_array() || bs.size() != 2 || bs[b] != flat_group[k]))
                throw BadInput(f.path(), std::string("__metadata__ 'betas' ") + meta["betas"] + " and '" + k + "' " + meta[k] +
                                             " differ");
        }
    std::map<std::size_t, int> refs;
    count_refs(ck, ck.root, refs);
    std::vector<ParamState> out;
    // param id -> (its group, flat position over all groups): the first listing wins
    std::unordered_map<std::string, std::pair<const nlohmann::json*, std::size_t>> group_of;
    std::size_t flat = 0;
    for (const auto& g : groups) {
        if (!g.is_object() || !g.contains("params") || !g["params"].is_array()) continue;
        for (const auto& pid : g["params"])
            group_of.emplace(pid.is_string() ? pid.get<std::string>() : pid.dump(), std::make_pair(&g, flat++));
    }
    ModelIndex model_index(ck, model);
    for (auto& [idx, p] : by_index) {
        if (p.tensor[0] < 0 && p.tensor[1] < 0) continue;
        std::string pname;
        std::vector<std::string> gkeys;
        const auto listed = group_of.find(idx);
        const bool found = listed != group_of.end();
        ParamState& ps = p;  // a structured binding cannot be captured (clang 14)
        auto read_json_group = [&](const nlohmann::json& g) {
            for (auto it = g.begin(); it != g.end(); ++it) gkeys.push_back(it.key());
            read_group(ps.hyper, ps.stated, ps.decoupled, ps.lr_divides, [&](const char* key) -> std::optional<double> {
                std::string kk = key;
                if ((kk == "beta1" || kk == "beta2") && g.contains("betas") && g["betas"].is_array() && g["betas"].size() == 2 && g["betas"][kk == "beta1" ? 0 : 1].is_number())
                    return g["betas"][kk == "beta1" ? 0 : 1].get<double>();
                if (!g.contains(kk)) return std::nullopt;
                if (g[kk].is_number()) return g[kk].get<double>();
                if (g[kk].is_boolean()) return g[kk].get<bool>() ? 1.0 : 0.0;
                return std::nullopt;
            });
        };
        // the flat form: no param_groups, __metadata__ names the optimizer and states its
        // hyper-parameters as separate strings ("lr": "0.001", "betas": "(0.9, 0.999)")
        const bool flat = !found && flat_adam;
        if (found) {
            read_json_group(*listed->second.first);
            const std::size_t at = listed->second.second;
            if (names.is_array() && at < names.size() && names[at].is_string()) pname = names[at].get<std::string>();
        } else if (flat) {
            read_json_group(flat_group);
        }
        if (meta.count("optimizer")) {
            if (meta["optimizer"] == "adamw") p.decoupled = true;
            else if (meta["optimizer"] == "adam") p.decoupled = false;
            else p.why_not = "optimizer '" + meta["optimizer"] + "' (not Adam)";
        }
        if (!step_tensor.count(idx)) throw BadInput(f.path(), "state." + idx + ".step is missing");
        const auto s = read_small_tensor(ck, f, step_tensor[idx]);
        if (s.size() != 1) throw BadInput(f.path(), "state." + idx + ".step is not a scalar");
        p.hyper.step = s[0];
        p.hyper.step_bits = significant_bits(ck.tensors[std::size_t(step_tensor[idx])].dtype);
        map_theta(ck, model_index, pname.empty() && !is_integer_key(idx) ? idx : pname, p);
        apply(p.hyper, p.stated, p.stated_bits, o, f.path(), p.name);
        if (flat && p.why_not.empty()) {
            if (!(p.stated & kAmsgrad) && !o.amsgrad) p.hyper.amsgrad = p.tensor[2] >= 0;  // the state says it
            // maximize only flips every gradient's sign: the certificate is symmetric
            const std::optional<double> given[5] = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
            const char* flag[5] = {"lr", "beta1", "beta2", "eps", "weight-decay"};
            // ckpt-verify (unstated_ok) takes what the file does not state from the manifest,
            // except for the states compress kept exact for it (HyperOverrides::kept_unstated)
            const bool kept = std::any_of(o.kept_unstated.begin(), o.kept_unstated.end(), [&](const std::string& n) {
                return n == p.name || n.rfind(p.name + " (", 0) == 0;
            });
            for (int k = 0; k < 5 && p.why_not.empty(); ++k)
                if (!(p.stated >> k & 1u) && !given[k] && (!o.unstated_ok || kept))
                    p.why_not = fmt::format("{} {} (pass --{})", kUnstated, kHyperNames[k], flag[k]);
            gkeys.push_back("betas");  // stated or given: what the group form's betas and amsgrad say
            gkeys.push_back("amsgrad");
        }
        if (p.why_not.empty()) {
            if (!found && !flat) p.why_not = "no param_groups entry in __metadata__ (optimizer unknown)";
            else p.why_not = not_adam(gkeys, fields[idx]);
        }
        if (p.why_not.empty()) p.why_not = out_of_range(p.hyper, p.lr_divides);
        check_compressible(ck, refs, p);
        if (p.name == "state." + idx)  // safetensors keys are sorted: no parameter order to name them by
            p.name += " (" + (meta.count("unnamed_why") ? meta["unnamed_why"] : std::string("no param_names in __metadata__")) + ")";
        out.push_back(std::move(p));
    }
    return out;
}

/// --optimizer adam|adamw against what the file says (decoupled_weight_decay): BadInput on
/// a contradiction.
void check_kind(const std::vector<ParamState>& states, const std::string& optimizer, const std::string& file) {
    if (optimizer != "adam" && optimizer != "adamw") return;
    for (const auto& p : states)
        if (p.decoupled && *p.decoupled != (optimizer == "adamw"))
            throw BadInput(file, "--optimizer " + optimizer + " contradicts the file: " + p.name +
                                     " has decoupled_weight_decay = " + (*p.decoupled ? "True" : "False"));
}

}  // namespace

std::string override_out_of_range(const std::string& name, double x) {
    if (!std::isfinite(x)) return fmt::format("{} is not a finite number", x);
    if (name == "beta1" || name == "beta2") return x >= 0 && x < 1 ? "" : fmt::format("{} is outside [0, 1)", x);
    if (name == "lr" || name == "eps" || name == "weight_decay") return x >= 0 ? "" : fmt::format("{} is < 0", x);
    throw std::invalid_argument("override_out_of_range: no hyper-parameter " + name);
}

std::pair<std::map<std::string, std::string>, std::string> names_by_order(const std::vector<ModelTensors>& models,
                                                                          const GroupShapes& groups) {
    if (models.empty()) return {{}, "no parameter names in the file"};
    std::vector<std::map<std::string, std::string>> fits;
    std::string why;
    for (const auto& m : models) {
        auto [names, w] = order_one(m, groups);
        if (!w.empty()) { why = w; continue; }
        if (std::find(fits.begin(), fits.end(), names) == fits.end()) fits.push_back(std::move(names));
    }
    if (fits.size() == 1) return {fits[0], ""};
    if (fits.size() > 1) return {{}, fmt::format("{} model state_dicts of the file fit the param groups", fits.size())};
    if (models.size() > 1) return {{}, "no model state_dict of the file fits the param groups"};
    return {{}, why};
}

std::vector<const Value*> megatron_param_groups(const Value& optimizer) {
    std::vector<const Value*> sds;   // DistributedOptimizer.state_dict()s (a ChainedOptimizer's list)
    if (const auto* l = std::get_if<Value::List>(&optimizer.v)) for (const Value& x : *l) sds.push_back(&x);
    else sds.push_back(&optimizer);
    std::vector<const Value*> groups;
    for (const Value* sd : sds) {
        const Value* inner = sd->is_dict() ? sd->get("optimizer") : nullptr;
        if (!inner && sd->is_dict() && sd->get("param_groups")) inner = sd;   // already the inner state_dict
        const Value* pg = inner && inner->is_dict() ? inner->get("param_groups") : nullptr;
        const auto* gl = pg ? std::get_if<Value::List>(&pg->v) : nullptr;
        if (!gl) return {};
        for (const Value& g : *gl) groups.push_back(&g);
    }
    return groups;
}

std::optional<bool> megatron_args_decoupled(const Checkpoint& ck) {
    if (const Value* a = ck.root.is_dict() ? ck.root.get("args") : nullptr)
        if (const Value::Object* ob = a->object())
            if (const Value* d = ob->attr("decoupled_weight_decay"))
                if (auto b = std::get_if<bool>(&d->v)) return *b;
    return std::nullopt;
}

std::optional<CompanionHyper> megatron_hyper(const Checkpoint& ck, const io::InputFile& f, const std::string& mixed) {
    const Value* top = ck.root.is_dict() ? ck.root.get("optimizer") : nullptr;
    if (!top) return std::nullopt;
    std::vector<MegatronGroup> groups;
    for (const Value* g : megatron_param_groups(*top)) groups.push_back({&ck, &f, g});
    return megatron_groups_hyper(groups, megatron_args_decoupled(ck), f.path().substr(f.path().rfind('/') + 1), mixed);
}

std::optional<CompanionHyper> megatron_groups_hyper(const std::vector<MegatronGroup>& groups, std::optional<bool> args_decoupled,
                                                    const std::string& file, const std::string& mixed) {
    if (groups.empty()) return std::nullopt;
    std::vector<ParamState> per;
    for (const auto& [ck, f, g] : groups) {
        if (!g->is_dict()) throw BadInput(f->path(), "a param group of 'optimizer' is not a dict");
        ParamState p;
        read_torch_group(*ck, *f, *g, p);
        const Value* step = g->get("step");
        if (!step || std::holds_alternative<Value::None>(step->v)) {
            p.why_not = "a param group of model_optim_rng.pt has no step";
        } else {
            p.hyper.step = as_double(*step, "step", f->path());
            if (g->get("bias_correction")) {   // TE / Apex FusedAdam: group['step'] += 1, a Python int
                const Value* bc = g->get("bias_correction");
                if (!std::holds_alternative<bool>(bc->v) || !std::get<bool>(bc->v)) p.why_not = "FusedAdam without bias correction (not Adam)";
                if (!p.decoupled) p.decoupled = args_decoupled;
                p.hyper.amsgrad = false;
            } else {   // torch: DistributedOptimizer.load_state_dict loads it as torch.tensor(step, dtype=torch.float)
                p.hyper.step = codec::round_to_bits(p.hyper.step, 24);
                p.hyper.step_bits = 24;
                p.stated |= kStepNumber;
                p.why_not = not_adam(dict_keys(*g), {"step", "exp_avg", "exp_avg_sq"});
            }
        }
        per.push_back(std::move(p));
    }
    CompanionHyper c;
    c.file = file;
    const ParamState& a = per[0];
    c.hyper = a.hyper;
    c.stated = a.stated;
    std::copy(std::begin(a.stated_bits), std::end(a.stated_bits), c.stated_bits);
    c.decoupled = a.decoupled;
    c.lr_divides = a.lr_divides;
    std::string differ;
    for (const ParamState& b : per) {
        if (c.why_not.empty() && !b.why_not.empty()) c.why_not = b.why_not;
        const double ha[6] = {a.hyper.lr, a.hyper.beta1, a.hyper.beta2, a.hyper.eps, a.hyper.step, double(a.hyper.step_bits)};
        const double hb[6] = {b.hyper.lr, b.hyper.beta1, b.hyper.beta2, b.hyper.eps, b.hyper.step, double(b.hyper.step_bits)};
        const char* names[6] = {"lr", "beta1", "beta2", "eps", "step", "step dtype"};
        for (int k = 0; k < 6; ++k)
            if (ha[k] != hb[k] && differ.find(names[k]) == std::string::npos) differ += std::string(differ.empty() ? "" : ", ") + names[k];
        if (a.hyper.amsgrad != b.hyper.amsgrad || a.hyper.maximize != b.hyper.maximize || a.decoupled != b.decoupled ||
            a.lr_divides != b.lr_divides || a.stated != b.stated)
            if (differ.find("kind") == std::string::npos) differ += std::string(differ.empty() ? "" : ", ") + "kind";
        c.hyper.weight_decay = std::max(c.hyper.weight_decay, b.hyper.weight_decay);
    }
    const bool wd_differs = std::any_of(per.begin(), per.end(), [&](const ParamState& b) { return b.hyper.weight_decay != a.hyper.weight_decay; });
    const bool zero_or_max = std::all_of(per.begin(), per.end(), [&](const ParamState& b) {
        return b.hyper.weight_decay == 0 || b.hyper.weight_decay == c.hyper.weight_decay; });
    if (wd_differs) {
        c.stated &= ~unsigned(kWeightDecay);   // no group's own: the largest
        // AdamW's decay is not in the certificate; Adam's L2 shifts the gradient domain by
        // wd * theta: with every group's wd 0 or the largest, the union of the plain domain
        // and the one shifted by the largest covers each coordinate's (kind left unknown)
        if (c.decoupled != true) {
            if (zero_or_max) c.decoupled.reset();
            else differ += std::string(differ.empty() ? "" : ", ") + "weight_decay (not all 0 or the largest, under Adam's L2 decay or an unknown kind)";
        }
    }
    if (c.why_not.empty() && !differ.empty())
        c.why_not = "the param groups of " + c.file + " differ in " + differ + ": " + mixed;
    return c;
}

std::vector<double> read_small_tensor(const Checkpoint& ck, const io::InputFile& f, int tensor) {
    const TensorInfo& t = ck.tensors.at(std::size_t(tensor));
    const StorageInfo& s = ck.storages[t.storage];
    const int64_t n = t.numel();
    if (n > 4096) throw BadInput(f.path(), "tensor " + t.path + " is too large to be a step");
    std::vector<double> out;
    const std::size_t es = dtype_size(t.dtype);
    std::vector<int64_t> idx(t.shape.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
        int64_t off = t.storage_offset;
        for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.stride[d];
        unsigned char b[8] = {};
        f.read_at(s.file_offset + uint64_t(off) * es, b, es, "tensor element");
        double x = 0;
        switch (t.dtype) {
            case DType::F32: { float v; std::memcpy(&v, b, 4); x = v; break; }
            case DType::F64: std::memcpy(&x, b, 8); break;
            case DType::I64: { int64_t v; std::memcpy(&v, b, 8); x = double(v); break; }
            case DType::I32: { int32_t v; std::memcpy(&v, b, 4); x = v; break; }
            case DType::F16: { _Float16 v; std::memcpy(&v, b, 2); x = double(v); break; }
            case DType::BF16: x = codec::BF16::from_code(uint32_t(b[0] | (b[1] << 8))); break;
            default: throw BadInput(f.path(), "tensor " + t.path + " has an unsupported dtype for a step");
        }
        out.push_back(x);
        for (std::size_t d = idx.size(); d-- > 0;) {
            if (++idx[d] < t.shape[d]) break;
            idx[d] = 0;
        }
    }
    return out;
}

std::vector<ParamState> find_param_states(const Checkpoint& ck, const io::InputFile& f,
                                          const HyperOverrides& o, const std::string& optimizer) {
    auto states = ck.format == Format::Safetensors ? scan_safetensors(ck, f, o) : scan_torch(ck, f, o);
    check_kind(states, optimizer, f.path());
    return states;
}

}  // namespace ckpt
