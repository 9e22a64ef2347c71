#include "ckpt/optimizer.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "codec/bf16.h"
#include "common/error.h"

namespace ckpt {

namespace {

const char* kMomentNames[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

int64_t numel(const TensorInfo& t) {
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    return n;
}

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

/// Hyper-parameters of one param group given as a key -> number/bool lookup.
template <class Get>
void read_group(codec::AdamHyper& h, std::optional<bool>& decoupled, Get get) {
    if (auto v = get("lr")) h.lr = *v;
    if (auto v = get("beta1")) h.beta1 = *v;
    if (auto v = get("beta2")) h.beta2 = *v;
    if (auto v = get("eps")) h.eps = *v;
    if (auto v = get("weight_decay")) h.weight_decay = *v;
    if (auto v = get("amsgrad")) h.amsgrad = *v != 0;
    if (auto v = get("maximize")) h.maximize = *v != 0;
    if (auto v = get("decoupled_weight_decay")) decoupled = *v != 0;
}

void apply(codec::AdamHyper& h, const HyperOverrides& o) {
    if (o.lr) h.lr = *o.lr;
    if (o.beta1) h.beta1 = *o.beta1;
    if (o.beta2) h.beta2 = *o.beta2;
    if (o.eps) h.eps = *o.eps;
    if (o.weight_decay) h.weight_decay = *o.weight_decay;
    if (o.amsgrad) h.amsgrad = *o.amsgrad;
    if (o.maximize) h.maximize = *o.maximize;
}

/// Decide whether the moments can be replaced by codes: each one a whole, contiguous,
/// unshared storage of FP32/F16/BF16 with the same element count.
void check_compressible(const Checkpoint& ck, ParamState& p) {
    std::map<std::size_t, int> uses;
    for (const auto& t : ck.tensors) uses[t.storage]++;
    const int nm = p.hyper.amsgrad ? 3 : 2;
    int64_t n = -1;
    DType dt{};
    for (int k = 0; k < nm; ++k) {
        if (p.tensor[k] < 0) { p.why_not = std::string(kMomentNames[k]) + " is missing"; return; }
        const TensorInfo& t = ck.tensors[std::size_t(p.tensor[k])];
        const StorageInfo& s = ck.storages[t.storage];
        if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16) { p.why_not = "dtype " + std::string(dtype_name(t.dtype)); return; }
        if (k == 0) { n = numel(t); dt = t.dtype; }
        if (numel(t) != n || t.dtype != dt) { p.why_not = "moments differ in size or dtype"; return; }
        if (!contiguous(t) || t.storage_offset != 0 || int64_t(s.numel) != n || s.dtype != t.dtype) { p.why_not = "moment is a view"; return; }
        if (uses[t.storage] != 1) { p.why_not = "moment storage is shared"; return; }
    }
    if (p.theta >= 0) {
        const TensorInfo& th = ck.tensors[std::size_t(p.theta)];
        if (numel(th) != n || th.shape != ck.tensors[std::size_t(p.tensor[0])].shape) p.theta = -1;
    }
    p.compressible = n > 0;
    if (n == 0) p.why_not = "empty";
}

/// Model parameters in optimizer index order: the float tensors of a module state_dict,
/// without BatchNorm statistics, deduplicated (tied weights appear once, as in
/// model.parameters()).
std::vector<int> model_params(const Checkpoint& ck, const Value& model) {
    std::vector<int> out;
    std::set<std::tuple<std::size_t, int64_t, std::vector<int64_t>>> seen;
    for (const auto& [k, v] : std::get<Value::Dict>(model.v)) {
        auto t = std::get_if<Value::Tensor>(&v.v);
        if (!t) return {};
        const TensorInfo& ti = ck.tensors[t->index];
        const std::string name = k.key_text();
        auto ends = [&](const char* s) { return name.size() >= strlen(s) && name.compare(name.size() - strlen(s), std::string::npos, s) == 0; };
        if (ends("running_mean") || ends("running_var") || ends("num_batches_tracked")) continue;
        if (ti.dtype != DType::F32 && ti.dtype != DType::F16 && ti.dtype != DType::BF16 && ti.dtype != DType::F64) continue;
        if (!seen.insert({ti.storage, ti.storage_offset, ti.shape}).second) continue;
        out.push_back(int(t->index));
    }
    return out;
}

/// Map optimizer param ids to model parameters. Torch numbers params group by group; each
/// group keeps model order, so the model's parameter list is an interleaving of the
/// groups. Shapes (from exp_avg) decide the interleaving; when none or more than one
/// interleaving fits, nothing is mapped (the caller then refuses L2 mode: soundness first).
std::map<std::string, int> map_params(const Checkpoint& ck, const std::vector<int>& params,
                                      const std::vector<std::vector<std::pair<std::string, const std::vector<int64_t>*>>>& groups) {
    std::size_t total = 0;
    for (const auto& g : groups) total += g.size();
    if (params.size() != total) return {};
    std::vector<std::size_t> pos(groups.size(), 0);
    std::map<std::string, int> found, current;
    int solutions = 0;
    long budget = 200000;
    std::function<void(std::size_t)> go = [&](std::size_t k) {
        if (solutions > 1 || --budget < 0) return;
        if (k == params.size()) { if (++solutions == 1) found = current; return; }
        const auto& shape = ck.tensors[std::size_t(params[k])].shape;
        for (std::size_t g = 0; g < groups.size(); ++g) {
            if (pos[g] >= groups[g].size()) continue;
            const auto& [id, want] = groups[g][pos[g]];
            if (want && *want != shape) continue;
            current[id] = params[k];
            ++pos[g];
            go(k + 1);
            --pos[g];
        }
    };
    go(0);
    return solutions == 1 && budget >= 0 ? found : std::map<std::string, int>{};
}

std::vector<ParamState> scan_torch(const Checkpoint& ck, const io::InputFile& f, const HyperOverrides& o) {
    // The optimizer state_dict: the root, or a value of the root dict.
    const Value* opt = nullptr;
    const Value* model = nullptr;
    std::string prefix;
    auto is_opt = [](const Value& v) { return v.is_dict() && v.get("state") && v.get("param_groups") && v.get("state")->is_dict(); };
    if (is_opt(ck.root)) opt = &ck.root;
    else if (ck.root.is_dict()) {
        for (const auto& [k, v] : std::get<Value::Dict>(ck.root.v))
            if (is_opt(v)) { opt = &v; prefix = k.key_text() + "/"; break; }
        for (const auto& [k, v] : std::get<Value::Dict>(ck.root.v))
            if (&v != opt && v.is_dict() && !std::get<Value::Dict>(v.v).empty()) {
                bool all = true;
                for (const auto& kv : std::get<Value::Dict>(v.v)) all = all && std::holds_alternative<Value::Tensor>(kv.second.v);
                if (all) { model = &v; break; }
            }
    }
    std::vector<ParamState> out;
    if (!opt) return out;
    const auto* groups = std::get_if<Value::List>(&opt->get("param_groups")->v);
    if (!groups) throw BadInput(f.path(), "param_groups is not a list");
    // index -> (group, position in flattened param order)
    std::map<std::string, std::pair<const Value*, std::size_t>> where;
    std::size_t flat = 0;
    for (const Value& g : *groups) {
        const Value* ps = g.get("params");
        const auto* pl = ps ? std::get_if<Value::List>(&ps->v) : nullptr;
        if (!pl) throw BadInput(f.path(), "a param group has no 'params' list");
        for (const Value& p : *pl) where[p.key_text()] = {&g, flat++};
    }
    const std::vector<int> params = model ? model_params(ck, *model) : std::vector<int>{};
    std::vector<std::vector<std::pair<std::string, const std::vector<int64_t>*>>> seq;
    const Value* state_dict = opt->get("state");
    for (const Value& g : *groups) {
        seq.emplace_back();
        for (const Value& p : std::get<Value::List>(g.get("params")->v)) {
            const std::vector<int64_t>* shape = nullptr;
            if (const Value* st = state_dict->get(p.key_text()))
                if (const Value* m = st->get("exp_avg"))
                    if (auto ti = std::get_if<Value::Tensor>(&m->v)) shape = &ck.tensors[ti->index].shape;
            seq.back().push_back({p.key_text(), shape});
        }
    }
    const std::map<std::string, int> theta_of = model ? map_params(ck, params, seq) : std::map<std::string, int>{};
    for (const auto& [k, st] : std::get<Value::Dict>(opt->get("state")->v)) {
        if (!st.is_dict()) continue;
        ParamState p;
        p.index = k.key_text();
        p.name = prefix + "state/" + p.index;
        for (int m = 0; m < 3; ++m)
            if (const Value* t = st.get(kMomentNames[m]))
                if (auto ti = std::get_if<Value::Tensor>(&t->v)) p.tensor[m] = int(ti->index);
        if (p.tensor[0] < 0 && p.tensor[1] < 0) continue;  // not Adam state
        auto w = where.find(p.index);
        if (w == where.end()) throw BadInput(f.path(), "optimizer state " + p.index + " belongs to no param group");
        const Value& g = *w->second.first;
        read_group(p.hyper, p.decoupled, [&](const char* key) -> std::optional<double> {
            std::string kk = key;
            if (kk == "beta1" || kk == "beta2") {
                const Value* b = g.get("betas");
                const auto* bl = b ? std::get_if<Value::List>(&b->v) : nullptr;
                if (!bl || bl->size() != 2) return std::nullopt;
                return as_double((*bl)[kk == "beta1" ? 0 : 1], "betas", f.path());
            }
            const Value* v = g.get(kk);
            if (!v || std::holds_alternative<Value::None>(v->v)) return std::nullopt;
            return as_double(*v, kk, f.path());
        });
        const Value* step = st.get("step");
        if (!step) throw BadInput(f.path(), "optimizer state " + p.index + " has no step");
        if (auto ti = std::get_if<Value::Tensor>(&step->v)) {
            const auto s = read_small_tensor(ck, f, int(ti->index));
            if (s.size() != 1) throw BadInput(f.path(), "step of state " + p.index + " is not a scalar");
            p.hyper.step = s[0];
        } else {
            p.hyper.step = as_double(*step, "step", f.path());
        }
        apply(p.hyper, o);
        if (auto t = theta_of.find(p.index); t != theta_of.end()) p.theta = t->second;
        check_compressible(ck, p);
        out.push_back(std::move(p));
    }
    return out;
}

std::vector<ParamState> scan_safetensors(const Checkpoint& ck, const io::InputFile& f, const HyperOverrides& o) {
    std::map<std::string, ParamState> by_index;
    std::map<std::string, int> step_tensor;
    std::map<std::string, int> by_name;
    for (const auto& [k, v] : std::get<Value::Dict>(ck.root.v)) {
        auto t = std::get_if<Value::Tensor>(&v.v);
        if (!t) continue;
        const std::string name = k.key_text();
        by_name[name] = int(t->index);
        if (name.rfind("state.", 0) != 0) continue;
        const auto dot = name.rfind('.');
        if (dot <= 6) continue;
        const std::string idx = name.substr(6, dot - 6), field = name.substr(dot + 1);
        ParamState& p = by_index[idx];
        p.index = idx;
        p.name = "state." + idx;
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
    std::vector<ParamState> out;
    for (auto& [idx, p] : by_index) {
        if (p.tensor[0] < 0 && p.tensor[1] < 0) continue;
        std::size_t flat = 0;
        bool found = false;
        for (const auto& g : groups) {
            if (!g.is_object() || !g.contains("params") || !g["params"].is_array()) continue;
            for (const auto& pid : g["params"]) {
                const std::string s = pid.is_string() ? pid.get<std::string>() : pid.dump();
                if (s == idx && !found) {
                    found = true;
                    read_group(p.hyper, p.decoupled, [&](const char* key) -> std::optional<double> {
                        std::string kk = key;
                        if ((kk == "beta1" || kk == "beta2") && g.contains("betas") && g["betas"].is_array() && g["betas"].size() == 2 && g["betas"][kk == "beta1" ? 0 : 1].is_number())
                            return g["betas"][kk == "beta1" ? 0 : 1].get<double>();
                        if (!g.contains(kk)) return std::nullopt;
                        if (g[kk].is_number()) return g[kk].get<double>();
                        if (g[kk].is_boolean()) return g[kk].get<bool>() ? 1.0 : 0.0;
                        return std::nullopt;
                    });
                    if (names.is_array() && flat < names.size() && names[flat].is_string()) {
                        auto n = by_name.find(names[flat].get<std::string>());
                        if (n != by_name.end()) p.theta = n->second;
                    }
                }
                ++flat;
            }
        }
        if (meta.count("optimizer")) {
            if (meta["optimizer"] == "adamw") p.decoupled = true;
            if (meta["optimizer"] == "adam") p.decoupled = false;
        }
        if (!step_tensor.count(idx)) throw BadInput(f.path(), "state." + idx + ".step is missing");
        const auto s = read_small_tensor(ck, f, step_tensor[idx]);
        if (s.size() != 1) throw BadInput(f.path(), "state." + idx + ".step is not a scalar");
        p.hyper.step = s[0];
        apply(p.hyper, o);
        check_compressible(ck, p);
        out.push_back(std::move(p));
    }
    return out;
}

}  // namespace

std::vector<double> read_small_tensor(const Checkpoint& ck, const io::InputFile& f, int tensor) {
    const TensorInfo& t = ck.tensors.at(std::size_t(tensor));
    const StorageInfo& s = ck.storages[t.storage];
    const int64_t n = numel(t);
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
                                          const HyperOverrides& o) {
    return ck.format == Format::Safetensors ? scan_safetensors(ck, f, o) : scan_torch(ck, f, o);
}

}  // namespace ckpt
