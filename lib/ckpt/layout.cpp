#include "ckpt/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "container/values.h"
#include "common/chunk_buffer.h"
#include "common/error.h"

namespace ckpt {

namespace {

namespace ct = container;

std::string basename_of(const std::string& p) {
    const auto s = p.rfind('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

/// max |theta| over the finite values of a whole-storage float tensor, read in 1 MiB pieces
/// (F32 straight into the values, a chunk block); -1 when it has no finite value.
double max_finite_abs(const Checkpoint& ck, const io::InputFile& f, int tensor) {
    const TensorInfo& t = ck.tensors[std::size_t(tensor)];
    const StorageInfo& st = ck.storages[t.storage];
    const DType dt = t.dtype;
    const std::size_t es = float_dtype_size(dt);
    if (es == 0) throw BadInput(f.path(), "parameter " + t.path + " is not FP32/F16/BF16; pass --param-bound B");
    int32_t top = -1;
    std::vector<uint8_t> b;
    ChunkBuffer v;
    for (uint64_t i = 0; i < st.numel;) {  // the whole storage bounds any view of it
        const std::size_t n = std::size_t(std::min<uint64_t>(1 << 18, st.numel - i));
        v.resize(n * sizeof(float));
        float* vals = reinterpret_cast<float*>(v.data());
        uint8_t* raw = element_bytes(dt, vals, n, b);
        f.read_at(st.file_offset + i * es, raw, n * es, "parameter storage");
        if (dt != DType::F32) bytes_to_float(dt, raw, n, vals);
        top = std::max(top, max_finite_abs_bits(vals, n));
        i += n;
    }
    if (top < 0) return -1;
    float m;
    std::memcpy(&m, &top, 4);
    return m;
}

/// The Adam L2 bound of a state whose parameter is one of `candidates` (same-shape model
/// tensors): |theta| <= the largest finite |value| over them, and how many have a finite
/// value (0: none is usable, as when none was found). Non-finite values are left out, soundly:
/// where the parameter itself is +-inf or NaN, g + wd*theta is too, and so is the update
/// after restore whatever the moments hold (as the FP32 one); a tensor with no finite value
/// (a causal mask of -inf) is no candidate.
struct CandidateBound {
    double bound = -1;
    int usable = 0;
};
CandidateBound candidate_bound(const Checkpoint& ck, const io::InputFile& f, const std::vector<int>& candidates) {
    CandidateBound c;
    for (int t : candidates) {
        // torch creates moments in the parameter's dtype: an F64 tensor is not the parameter of
        // FP32/F16/BF16 moments (the only ones coded)
        if (float_dtype_size(ck.tensors[std::size_t(t)].dtype) == 0) continue;
        const double m = max_finite_abs(ck, f, t);
        if (m < 0) continue;
        c.bound = std::max(c.bound, m);
        ++c.usable;
    }
    return c;
}

/// Gradient-domain rule of one parameter: [-G, G] for AdamW, shifted by wd * theta for
/// Adam's L2 mode, the union of both when the kind is unknown ("auto"); under --horizon all no
/// domain at all (closed_all holds for every gradient sequence).
codec::DomainRule domain_for(const ParamState& p, const CompressOptions& o) {
    codec::DomainRule d;
    d.grad_bound = o.grad_bound;
    d.weight_decay = p.hyper.weight_decay;
    if (o.horizon == 0) {  // every update, any gradient sequence: no domain, so no parameter to locate
        d.plain = true;
        d.l2 = false;
        return d;
    }
    const bool wd = p.hyper.weight_decay != 0;
    bool adamw = false, adam = false;
    if (p.decoupled) (*p.decoupled ? adamw : adam) = true;
    else if (o.optimizer == "adamw") adamw = true;
    else if (o.optimizer == "adam") adam = true;
    else { adamw = true; adam = true; }  // unknown kind: union of both domains
    d.plain = adamw || !wd;
    d.l2 = adam && wd;
    return d;
}

}  // namespace

Layout plan_layout(const Checkpoint& ck, const io::InputFile& f, const CompressOptions& o) {
    const std::vector<ParamState> states = find_param_states(ck, f, o.hyper, o.optimizer);
    if (states.empty() && !o.allow_no_state) throw NoAdamState(f.path(), "no Adam/AdamW optimizer state (exp_avg, exp_avg_sq) found");
    Layout L;
    ct::Manifest& man = L.man;
    man.tool_version = CKPTKIT_VERSION;
    man.source_format = format_name(ck.format);
    man.source_name = basename_of(f.path());
    man.source_size = f.size();
    man.codec = o.codec;
    man.tolerance = o.tolerance;
    man.grad_bound = o.grad_bound;
    man.optimizer = o.optimizer;
    man.param_bound = o.param_bound ? *o.param_bound : -1;
    man.horizon = o.horizon;
    man.bound_param = o.bound_param;
    for (const auto& s : ck.storages) {
        ct::StorageEntry e;
        e.offset = s.file_offset;
        e.nbytes = s.nbytes;
        e.crc_offsets = s.crc_offsets;
        man.storages.push_back(e);
    }
    std::map<const std::vector<int>*, CandidateBound> bound_of;  // candidate group -> its bound, read once
    auto candidates_of = [&](const ParamState& p) -> const CandidateBound* {  // null: no candidates
        if (!p.theta_candidates || p.theta_candidates->empty()) return nullptr;
        auto known = bound_of.find(p.theta_candidates.get());  // once per shape group
        if (known == bound_of.end())
            known = bound_of.emplace(p.theta_candidates.get(), candidate_bound(ck, f, *p.theta_candidates)).first;
        return &known->second;
    };
    for (const auto& p : states) {
        if (!p.compressible) {
            TensorRow row;
            row.name = p.name;
            std::vector<int> tensors = p.other_tensors;
            for (int k = 0; k < 3; ++k)
                if (p.tensor[k] >= 0 && (k < 2 || p.hyper.amsgrad)) tensors.push_back(p.tensor[k]);
            for (int t : tensors) {  // the tensor's own elements (a view counts its view, not its storage)
                const TensorInfo& ti = ck.tensors[std::size_t(t)];
                const uint64_t n = uint64_t(ti.numel());
                row.values += n;
                row.bytes_fp32 += 4 * n;
                row.bytes_out += n * dtype_size(ti.dtype);
            }
            row.escapes = row.values;
            row.note = "kept exact: " + p.why_not;
            L.kept.push_back(row);
            continue;
        }
        ct::ParamEntry e;
        e.name = p.name;
        const TensorInfo& m = ck.tensors[std::size_t(p.tensor[0])];
        e.numel = ck.storages[m.storage].numel;
        e.shape = m.shape;
        e.dtype = m.dtype;
        e.hyper = p.hyper;
        e.hyper.horizon = o.horizon;
        e.hyper.bound_param = o.bound_param;
        e.domain = domain_for(p, o);
        Layout::ThetaAt at;
        if (const int t = p.theta >= 0 ? p.theta : p.theta_likely; t >= 0) {
            const TensorInfo& th = ck.tensors[std::size_t(t)];
            if (float_dtype_size(th.dtype) != 0 && th.storage_offset == 0 && ck.storages[th.storage].numel == e.numel)
                at = {int64_t(th.storage), th.dtype};
        }
        if ((e.domain.l2 && std::isfinite(o.grad_bound)) || o.bound_param) {
            if (p.theta >= 0) {
                const TensorInfo& th = ck.tensors[std::size_t(p.theta)];
                const auto& st = ck.storages[th.storage];
                if (float_dtype_size(th.dtype) == 0 || th.storage_offset != 0 || st.numel != e.numel)
                    throw BadInput(f.path(), "parameter of " + p.name + " is not a whole FP32/F16/BF16 storage; pass --param-bound B");
                e.theta_storage = int64_t(th.storage);
                e.theta_dtype = th.dtype;
            } else if (const CandidateBound* c = candidates_of(p); c && c->usable > 0) {
                e.domain.theta_bound = c->bound;
                e.theta_candidates = c->usable;
            } else if (o.param_bound) {
                e.domain.theta_bound = *o.param_bound;
            } else {
                throw NeedsParamBound(f.path(), "cannot locate the parameter of optimizer state " + p.name +
                                             (o.bound_param ? std::string(" for --bound param; pass --param-bound B (|theta| <= B)")
                                                            : std::string(" for the Adam L2 gradient domain of --horizon 1; pass "
                                                                          "--param-bound B or --grad-bound inf, or certify every "
                                                                          "update (--horizon all: no domain needed)")));
            }
        }
        for (int k = 0; k < e.moments(); ++k) {
            const std::size_t s = ck.tensors[std::size_t(p.tensor[k])].storage;
            e.storage[k] = int(s);
            man.storages[s].param = int(man.params.size());
            man.storages[s].role = k;
        }
        man.params.push_back(e);
        L.theta.push_back(at);
        L.stated.push_back(p.stated);
    }
    for (const auto& e : man.params)
        if (e.theta_storage >= 0 && man.storages[std::size_t(e.theta_storage)].param >= 0)
            throw BadInput(f.path(), "parameter storage of " + e.name + " is also a moment storage");
    return L;
}

std::vector<std::string> compare_layout(const ct::Manifest& a, const Layout& L) {
    const ct::Manifest& b = L.man;
    std::vector<std::string> out;
    if (a.params.size() != b.params.size()) {
        out.push_back(fmt::format("the manifest codes {} optimizer states, the checkpoint has {} compressible ones",
                                  a.params.size(), b.params.size()));
        return out;
    }
    auto off = [](const ct::Manifest& m, int64_t s) { return s < 0 ? int64_t(-1) : int64_t(m.storages[std::size_t(s)].offset); };
    for (std::size_t j = 0; j < a.params.size(); ++j) {
        const auto &x = a.params[j], &y = b.params[j];
        auto bad = [&](const std::string& what) { out.push_back(x.name + ": " + what + " differs from the checkpoint's own state"); };
        // names are for reports (older containers used state paths): not compared
        if (x.numel != y.numel || x.dtype != y.dtype) bad("size or dtype");
        for (int k = 0; k < 3; ++k)
            if (off(a, x.storage[k]) != off(b, y.storage[k])) bad(std::string("storage of ") + ct::kRoleNames[k]);
        if (off(a, x.theta_storage) != off(b, y.theta_storage)) bad("parameter (theta) storage");
        const unsigned st = L.stated[j];
        const double hx[5] = {x.hyper.lr, x.hyper.beta1, x.hyper.beta2, x.hyper.eps, x.hyper.weight_decay};
        const double hy[5] = {y.hyper.lr, y.hyper.beta1, y.hyper.beta2, y.hyper.eps, y.hyper.weight_decay};
        const char* names[5] = {"lr", "beta1", "beta2", "eps", "weight_decay"};
        for (int k = 0; k < 5; ++k)
            if ((st >> k & 1u) && hx[k] != hy[k]) bad(fmt::format("{} ({} vs {})", names[k], hx[k], hy[k]));
        if ((st & kAmsgrad) && x.hyper.amsgrad != y.hyper.amsgrad) bad("amsgrad");
        if ((st & kMaximize) && x.hyper.maximize != y.hyper.maximize) bad("maximize");
        const bool step_unstated = st & kStepUnstated;   // a Megatron distrib_optim.pt read alone: the manifest's
        if (!step_unstated && x.hyper.step != y.hyper.step) bad(fmt::format("step ({} vs {})", x.hyper.step, y.hyper.step));
        // containers written before number steps were certified as float32 ones recorded them
        // as exact (the step itself is compared above): both count alike up to 2^24, where
        // float32 stops; the exact count's suprema over the later steps cover the stalled one's
        // in double arithmetic (b1^(2^24) and b2^(2^24) are 0 there), so they still verify
        const bool number_step_exact = (st & kStepNumber) && x.hyper.step_bits == 0 && y.hyper.step_bits == 24;
        if (!step_unstated && x.hyper.step_bits != y.hyper.step_bits && a.format_version >= 5 && !number_step_exact) bad("step dtype");
        if (x.domain.l2 != y.domain.l2 || x.domain.plain != y.domain.plain || x.domain.theta_bound < y.domain.theta_bound)
            bad("gradient domain");
    }
    return out;
}

}  // namespace ckpt
