// DCP moments in folder mode (dcp.h): gather into one safetensors file, cut the
// moment storages out of the .distcp files (shells), put them back on restore.
#include "folder/dcp.h"

#include <fmt/format.h>
#include <isa-l/crc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "folder/files.h"
#include "common/json_num.h"
#include "ckpt/optimizer.h"
#include "container/values.h"
#include "common/error.h"
#include "common/file.h"
#include "io/file.h"
#include "io/pickle.h"

namespace ckpt::folder {

using nlohmann::json;

namespace {

constexpr uint64_t kPiece = 1 << 20;

const std::string* str_of(const Value* v) { return v ? std::get_if<std::string>(&v->v) : nullptr; }
const int64_t* int_of(const Value* v) { return v ? std::get_if<int64_t>(&v->v) : nullptr; }
using Item = DcpItem;

/// "i,j,..." of a torch.Size (a tuple of ints), "" for None / anything else.
std::string chunk_key(const Value* v) {
    const auto* l = v ? std::get_if<Value::List>(&v->v) : nullptr;
    if (!l) return "";
    std::string s;
    for (const auto& e : *l) {
        const auto* i = std::get_if<int64_t>(&e.v);
        if (!i) return "";
        s += (s.empty() ? "" : ",") + std::to_string(*i);
    }
    return s;
}

/// A parsed item: its checkpoint (from the .distcp file itself when the item is the whole
/// file, else from a copy in scratch) and where the item starts in the .distcp file.
struct Parsed {
    Checkpoint ck;
    std::string path;    ///< file the checkpoint was read from
    uint64_t base = 0;   ///< offset of `path`'s byte 0 in the .distcp file
};

Parsed parse_item(const std::string& dir, const Item& it, const std::string& scratch, const Limits& limits) {
    const std::string file = join(dir, it.file);
    const io::InputFile f(file);
    if (!f.contains(it.offset, it.length)) throw BadInput(file, fmt::format("item {} lies outside the file", it.fqn));
    Parsed p;
    if (it.offset == 0 && it.length == f.size()) {
        p.path = file;
    } else {
        p.path = join(scratch, "item.pt");
        FileWriter w(p.path);
        std::vector<char> buf;
        for (uint64_t i = 0; i < it.length; i += kPiece) {
            buf.resize(std::size_t(std::min(kPiece, it.length - i)));
            f.read_at(it.offset + i, buf.data(), buf.size(), "item");
            w.write(buf.data(), buf.size());
        }
        w.close();
        p.base = it.offset;
    }
    p.ck = read_checkpoint(p.path, limits);
    return p;
}

/// The unpickled .metadata of a DCP folder (a torch Metadata object).
io::PickleResult read_metadata(const std::string& dir) {
    const io::InputFile f(join(dir, ".metadata"));
    io::RangeReader r(f, 0, f.size());
    return io::unpickle(r, Limits{}, io::PersistentIds::None);
}

/// The tensors of a DCP folder's state_dict_metadata, (fqn, global size), in the order torch
/// wrote them (the flattened state_dict's); non-tensor entries are left out.
ckpt::ModelTensors dcp_tensor_sizes(const std::string& dir) {
    const io::PickleResult p = read_metadata(dir);
    const Value::Object* md = p.root.object();
    const Value* sdm = md ? md->attr("state_dict_metadata") : nullptr;
    ckpt::ModelTensors out;
    if (!sdm || !sdm->is_dict()) return out;
    for (const auto& kv : std::get<Value::Dict>(sdm->v)) {
        const Value::Object* tm = kv.second.object();
        const auto* size = tm ? (tm->attr("size") ? std::get_if<Value::List>(&tm->attr("size")->v) : nullptr) : nullptr;
        if (!size) continue;
        std::vector<int64_t> shape;
        for (const auto& e : *size)
            if (const auto* i = std::get_if<int64_t>(&e.v)) shape.push_back(*i);
        if (shape.size() == size->size()) out.push_back({kv.first.key_text(), shape});
    }
    return out;
}

}  // namespace

std::vector<Item> dcp_items(const std::string& dir) {
    const std::string path = join(dir, ".metadata");
    const io::PickleResult p = read_metadata(dir);
    const Value::Object* md = p.root.object();
    const Value* sd = md ? md->attr("storage_data") : nullptr;
    if (!sd || !sd->is_dict()) throw BadInput(path, "not a pickled Metadata with a storage_data dict");
    std::vector<Item> items;
    for (const auto& kv : std::get<Value::Dict>(sd->v)) {
        const Value::Object* key = kv.first.object();
        const Value::Object* info = kv.second.object();
        const std::string* fqn = key ? str_of(key->attr("fqn")) : nullptr;
        const std::string* rel = info ? str_of(info->attr("relative_path")) : nullptr;
        const int64_t* off = info ? int_of(info->attr("offset")) : nullptr;
        const int64_t* len = info ? int_of(info->attr("length")) : nullptr;
        if (!fqn || !rel || !off || !len || *off < 0 || *len < 0 || rel->find("..") != std::string::npos || rel->empty() ||
            (*rel)[0] == '/')
            throw BadInput(path, "storage_data entry without a valid fqn / relative_path / offset / length");
        items.push_back({*fqn, *rel, uint64_t(*off), uint64_t(*len), chunk_key(key->attr("offset"))});
    }
    return items;
}

namespace {
const char* const kMoments[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
constexpr const char* kMegatronState = "optimizer.state.";
constexpr const char* kMegatronDpGroup = "optimizer.distributed.dp_group_idx_";   // dp_reshardable

/// Whether `fqn` names a dp_reshardable bucket item "optimizer.distributed.dp_group_idx_<G>.
/// gbuf_idx_<I>.dtype_<D>.bucket_idx_<K>.<key>" and `key` its last part (its bucket B = the rest).
bool bucket_item(const std::string& fqn, const std::string& key) {
    const std::string tail = "." + key;
    const auto bucket = fqn.find(".bucket_idx_");
    return fqn.rfind(kMegatronDpGroup, 0) == 0 && fqn.ends_with(tail) && fqn.find(".gbuf_idx_") != std::string::npos &&
           bucket != std::string::npos && bucket < fqn.size() - tail.size();
}
}  // namespace

std::string DcpMomentName::fqn(const std::string& key) const {
    if (bucket) return X + "." + key;
    return megatron ? X + ".state." + key + "." + P : X + ".state." + P + "." + key;
}

std::optional<DcpMomentName> dcp_moment_name(const std::string& fqn) {
    for (int k = 0; k < 3; ++k)   // Megatron's dp_reshardable buckets: "<B>.<moment>"
        if (bucket_item(fqn, kMoments[k])) {
            const std::string B = fqn.substr(0, fqn.size() - std::strlen(kMoments[k]) - 1);
            return DcpMomentName{B, B, k, true, true};
        }
    const auto st = fqn.find(".state.");
    if (st == std::string::npos) return std::nullopt;
    for (int k = 0; k < 3; ++k) {   // torch's "<X>.state.<P>.<moment>"
        const std::string tail = std::string(".") + kMoments[k];
        if (fqn.ends_with(tail) && fqn.size() > st + 7 + tail.size())
            return DcpMomentName{fqn.substr(0, st), fqn.substr(st + 7, fqn.size() - st - 7 - tail.size()), k, false};
    }
    if (fqn.rfind(kMegatronState, 0) != 0) return std::nullopt;
    const std::string rest = fqn.substr(std::strlen(kMegatronState));   // Megatron's "<moment>.<P>"
    for (int k = 0; k < 3; ++k) {
        const std::string head = std::string(kMoments[k]) + ".";
        if (rest.rfind(head, 0) == 0 && rest.size() > head.size())
            return DcpMomentName{"optimizer", rest.substr(head.size()), k, true};
    }
    return std::nullopt;
}

bool is_moment_fqn(const std::string& fqn) { return dcp_moment_name(fqn).has_value(); }

namespace {

/// The moments whose theta a Megatron main-parameter item holds ("optimizer.state.fp32_param.<P>",
/// "optimizer.state.param.<P>", a bucket's "<B>.param"), as their exp_avg's name; nullopt else.
std::optional<DcpMomentName> megatron_theta_of(const std::string& fqn) {
    for (const char* k : {"fp32_param.", "param."}) {
        const std::string head = std::string(kMegatronState) + k;
        if (fqn.rfind(head, 0) == 0 && fqn.size() > head.size()) return DcpMomentName{"optimizer", fqn.substr(head.size()), 0, true};
    }
    if (bucket_item(fqn, "param")) {
        const std::string B = fqn.substr(0, fqn.size() - 6);
        return DcpMomentName{B, B, 0, true, true};
    }
    return std::nullopt;
}

/// What Megatron's common.pt in `dir` says for its moment items: the param groups' agreed
/// hyper-parameters and step (megatron_hyper), the first group as JSON for the moments file
/// (its step left out, weight_decay the largest, decoupled_weight_decay only when every group
/// says the same), or why the moments stay exact.
struct MegatronCommon {
    std::shared_ptr<const CompanionHyper> hyper;
    json group;
    std::string why_not;
    std::string source = "common.pt";   ///< where the groups were read
};

}  // namespace

namespace {

/// The whole-storage tensor an item holds, or nullptr (a view, a slice, not a tensor).
const TensorInfo* whole_tensor(const Checkpoint& ck) {
    auto t = std::get_if<Value::Tensor>(&ck.root.v);
    if (!t) return nullptr;
    const TensorInfo& ti = ck.tensors.at(t->index);
    const StorageInfo& s = ck.storages.at(ti.storage);
    int64_t n = 1, stride = 1;
    for (std::size_t d = ti.shape.size(); d-- > 0;) {
        if (ti.shape[d] != 1 && ti.stride[d] != stride) return nullptr;
        stride *= ti.shape[d];
        n *= ti.shape[d];
    }
    if (ti.storage_offset != 0 || uint64_t(n) != s.numel) return nullptr;
    return &ti;
}

/// A param_groups value as JSON (numbers, bools, None, lists of numbers); false otherwise.
bool to_json(const Value& v, json& out) {
    if (std::holds_alternative<Value::None>(v.v)) out = nullptr;
    else if (auto b = std::get_if<bool>(&v.v)) out = *b;
    else if (auto i = std::get_if<int64_t>(&v.v)) out = *i;
    else if (auto s = std::get_if<std::string>(&v.v)) out = *s;
    else if (auto d = std::get_if<double>(&v.v)) {
        if (!std::isfinite(*d)) return false;
        out = *d;
    } else if (auto l = std::get_if<Value::List>(&v.v)) {
        out = json::array();
        for (const auto& e : *l) {
            json x;
            if (!to_json(e, x) || x.is_array()) return false;
            out.push_back(x);
        }
    } else return false;
    return true;
}

/// Stream bytes [off, off+n) of `f` to `w`, updating `crc` when given.
void copy_range(const io::InputFile& f, uint64_t off, uint64_t n, FileWriter& w, uint32_t* crc) {
    std::vector<char> buf;
    for (uint64_t i = 0; i < n; i += kPiece) {
        buf.resize(std::size_t(std::min(kPiece, n - i)));
        f.read_at(off + i, buf.data(), buf.size(), "range");
        if (crc) *crc = crc32_gzip_refl(*crc, reinterpret_cast<const unsigned char*>(buf.data()), buf.size());
        w.write(buf.data(), buf.size());
    }
}

/// MegatronCommon of the DCP folder `dir` (dcp_megatron_hyper says where the groups come from).
MegatronCommon read_megatron_common(const std::string& dir, const Limits& limits, const DcpItemRemap& remap) {
    MegatronCommon m;
    const std::string path = join(dir, "common.pt");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
        m.why_not = "no Megatron common.pt beside .metadata: their hyper-parameters and step are unknown";
        return m;
    }
    const Checkpoint ck = read_checkpoint(path, limits);
    const io::InputFile f(path);
    std::vector<MegatronGroup> groups;
    std::string& source = m.source;   // "common.pt" unless dp_reshardable's items hold the groups
    if (const Value* top = ck.root.is_dict() ? ck.root.get("optimizer") : nullptr)
        for (const Value* g : megatron_param_groups(*top)) groups.push_back({&ck, &f, g});
    // dp_reshardable: each DP group's ShardedObject "optimizer.distributed.dp_group_idx_<G>.optimizer/shard_*"
    struct Held {
        std::string bytes;
        std::unique_ptr<io::InputFile> f;
        Checkpoint ck;
    };
    std::vector<std::unique_ptr<Held>> held;
    if (groups.empty()) {
        for (const Item& it0 : dcp_items(dir)) {
            if (it0.fqn.rfind(kMegatronDpGroup, 0) != 0 || it0.fqn.find(".optimizer/shard_") == std::string::npos) continue;
            const Item it = remap ? remap(it0) : it0;
            const io::InputFile src(join(dir, it.file));
            if (!src.contains(it.offset, it.length) || it.length > (uint64_t(64) << 20))
                throw BadInput(src.path(), fmt::format("item {} lies outside the file or is too large for param groups", it.fqn));
            auto h = std::make_unique<Held>();
            h->bytes.resize(std::size_t(it.length));
            src.read_at(it.offset, h->bytes.data(), h->bytes.size(), "item");
            h->f = std::make_unique<io::InputFile>(src.path() + " (item " + it0.fqn + ")",
                                                   std::vector<io::InputFile::Span>{{h->bytes.data(), h->bytes.size(), {}}});
            h->ck = read_checkpoint(*h->f, limits);
            const auto gs = megatron_param_groups(h->ck.root);
            if (gs.empty()) continue;
            for (const Value* g : gs) groups.push_back({&h->ck, h->f.get(), g});
            held.push_back(std::move(h));
        }
        source = "the optimizer.distributed.dp_group_idx_*.optimizer items";
    }
    auto c = megatron_groups_hyper(groups, megatron_args_decoupled(ck), source,
                                   source + (held.empty() ? " does" : " do") + " not say which parameter is in which group");
    if (!c) {
        m.why_not = "common.pt holds no Megatron optimizer param groups: their hyper-parameters and step are unknown";
        return m;
    }
    if (!c->why_not.empty()) {
        m.why_not = c->why_not;
        return m;
    }
    // the first group (megatron_groups_hyper found them all agreeing)
    const Value* g = groups.front().group;
    m.group = json::object();
    for (const auto& [k, v] : std::get<Value::Dict>(g->v)) {
        const std::string key = k.key_text();
        if (key == "step" || key == "params") continue;
        json x;
        if (!to_json(v, x)) {
            m.why_not = "param_groups '" + key + "' of " + source + " is not a plain value";
            return m;
        }
        m.group[key] = x;
    }
    m.group["weight_decay"] = c->hyper.weight_decay;   // the largest when they differ
    if (!c->decoupled) m.group.erase("decoupled_weight_decay");
    m.hyper = std::make_shared<const CompanionHyper>(std::move(*c));
    return m;
}

}  // namespace

std::shared_ptr<const CompanionHyper> dcp_megatron_hyper(const std::string& dir, const Limits& limits, std::string& why_not,
                                                         const DcpItemRemap& remap) {
    MegatronCommon m = read_megatron_common(dir, limits, remap);
    why_not = m.why_not;
    return m.why_not.empty() ? m.hyper : nullptr;
}

std::string dcp_moments_name(std::size_t n, const std::string& tag) {
    return kDcpMomentsPrefix + tag + std::to_string(n) + ".safetensors";
}

std::vector<std::vector<std::string>> dcp_units(const std::string& dir, uint64_t unit_bytes) {
    const std::vector<Item> items = dcp_items(dir);
    std::map<std::string, std::string> parent;   // union-find over file names
    std::function<std::string(const std::string&)> find = [&](const std::string& f) -> std::string {
        auto it = parent.find(f);
        if (it == parent.end()) { parent[f] = f; return f; }
        if (it->second == f) return f;
        return it->second = find(it->second);
    };
    std::map<std::pair<std::string, std::string>, std::vector<std::string>> chunk_files;   // (X, P, chunk) -> files
    auto key_of = [](const DcpMomentName& n) { return n.X + (n.megatron ? "\n" : "\t") + n.P; };
    for (const auto& it : items) {
        const auto n = dcp_moment_name(it.fqn);
        if (!n) continue;
        chunk_files[{key_of(*n), it.chunk}].push_back(it.file);
        (void)find(it.file);
    }
    for (const auto& it : items) {   // Megatron's main parameters go with their moments (theta)
        const auto n = megatron_theta_of(it.fqn);
        auto c = !n ? chunk_files.end() : chunk_files.find({key_of(*n), it.chunk});
        if (c == chunk_files.end()) continue;
        c->second.push_back(it.file);
        (void)find(it.file);
    }
    for (const auto& [key, files] : chunk_files)
        for (const auto& f : files) {
            const std::string a = find(files[0]), b = find(f);
            if (a != b) parent[std::max(a, b)] = std::min(a, b);
        }
    std::map<std::string, std::vector<std::string>> comps;   // root -> files (sorted by root = smallest)
    for (const auto& [f, _] : parent) comps[find(f)].push_back(f);
    std::vector<std::vector<std::string>> units;
    uint64_t bytes = 0;
    for (auto& [root, files] : comps) {
        if (units.empty() || bytes >= unit_bytes) {
            units.emplace_back();
            bytes = 0;
        }
        for (const auto& f : files) {
            units.back().push_back(f);
            std::error_code ec;
            const auto n = std::filesystem::file_size(join(dir, f), ec);
            bytes += ec ? 0 : uint64_t(n);
        }
    }
    for (auto& u : units) std::sort(u.begin(), u.end());
    return units;
}

DcpMoments gather_dcp_moments(const std::string& dir, const std::vector<std::string>& files_in, const std::string& out,
                              const std::string& scratch, const Limits& limits) {
    const std::set<std::string> in_unit(files_in.begin(), files_in.end());
    std::vector<Item> items;
    for (auto& it : dcp_items(dir)) {   // moment items of other units are not ours
        if (!is_moment_fqn(it.fqn) || in_unit.count(it.file)) items.push_back(std::move(it));
    }
    std::map<std::string, std::vector<const Item*>> by_fqn;
    for (const auto& it : items) by_fqn[it.fqn].push_back(&it);
    auto one = [&](const std::string& fqn) -> const Item* {
        auto i = by_fqn.find(fqn);
        return i != by_fqn.end() && i->second.size() == 1 ? i->second[0] : nullptr;
    };
    struct Moment { std::string name; std::string file; uint64_t abs = 0, nbytes = 0; DType dtype = DType::F32; std::vector<int64_t> shape; std::vector<uint64_t> crcs; };
    struct Param { std::string name; std::vector<Moment> m; double step = 0; DType step_dtype = DType::F64; json group; std::string X; };
    std::vector<Param> params;
    std::vector<std::string> skipped;
    DcpMoments res;
    // the item of `fqn` for chunk `chunk` (the only item when the FQN is not chunked)
    auto chunk_of = [&](const std::string& fqn, const std::string& chunk) -> const Item* {
        auto i = by_fqn.find(fqn);
        if (i == by_fqn.end()) return nullptr;
        for (const Item* it : i->second)
            if (it->chunk == chunk) return it;
        return nullptr;
    };
    // DCP's default (unflattened) optimizer form: groups as X.param_groups.<i>.<key>, with
    // X.param_groups.<i>.params one item holding the list of the group's FQNs (torch's
    // _traverse.py keeps a list of plain values whole). X -> [(group prefix, its FQNs)], by i.
    std::map<std::string, std::vector<std::pair<std::string, std::vector<std::string>>>> group_lists;
    auto groups_of = [&](const std::string& X) -> const std::vector<std::pair<std::string, std::vector<std::string>>>& {
        auto known = group_lists.find(X);
        if (known == group_lists.end()) {
            known = group_lists.emplace(X, std::vector<std::pair<std::string, std::vector<std::string>>>{}).first;
            const std::string gp = X + ".param_groups.";
            for (auto it = by_fqn.lower_bound(gp); it != by_fqn.end() && it->first.rfind(gp, 0) == 0; ++it) {
                const std::string rest = it->first.substr(gp.size());
                const auto dot = rest.find('.');
                if (dot == std::string::npos || rest.substr(dot + 1) != "params" || it->second.size() != 1) continue;
                const Parsed pa = parse_item(dir, *it->second[0], scratch, limits);
                json v;
                if (!to_json(pa.ck.root, v) || !v.is_array()) continue;
                std::vector<std::string> fqns;
                for (const auto& e : v)   // FQNs (get_state_dict), or the state ids of a plain
                    if (e.is_string()) fqns.push_back(e.get<std::string>());   // optimizer.state_dict()
                    else if (e.is_number_integer()) fqns.push_back(std::to_string(e.get<int64_t>()));
                known->second.push_back({gp + rest.substr(0, dot) + ".", std::move(fqns)});
            }
            auto index = [&](const std::string& prefix) {   // i of "X.param_groups.<i>."
                return std::strtoll(prefix.c_str() + gp.size(), nullptr, 10);
            };
            std::sort(known->second.begin(), known->second.end(),
                      [&](const auto& a, const auto& b) { return index(a.first) < index(b.first); });
        }
        return known->second;
    };
    auto default_group = [&](const std::string& X, const std::string& P) -> std::string {
        for (const auto& [prefix, fqns] : groups_of(X))
            if (std::find(fqns.begin(), fqns.end(), P) != fqns.end()) return prefix;
        return "";
    };
    // Megatron's items: hyper-parameters and step from common.pt, read once
    std::optional<MegatronCommon> mc;
    std::size_t megatron_left = 0;
    auto megatron_common = [&]() -> const MegatronCommon& {
        if (!mc) mc = read_megatron_common(dir, limits, {});
        return *mc;
    };
    for (const auto& [fqn, list] : by_fqn) {
        const auto nm = dcp_moment_name(fqn);
        if (!nm || nm->moment != 0) continue;
        const std::string X = nm->X, P = nm->P;
        if (nm->megatron && !megatron_common().why_not.empty()) {   // one note for them all
            megatron_left += list.size();
            continue;
        }
        for (const Item* first : list) {
        // one gathered parameter per chunk: "P" when the FQN has one chunk, else "P@i,j"
        const std::string name = list.size() == 1 ? P : P + "@" + first->chunk;
        auto skip = [&](const std::string& why) { skipped.push_back(name + " (" + why + ")"); };
        Param p;
        p.name = name;
        if (list.size() == 1 && !nm->megatron && std::all_of(P.begin(), P.end(), [](char c) { return c >= '0' && c <= '9'; }))
            p.X = X;   // a state id of the plain optimizer.state_dict() form: named by parameter order below
        bool ok = true;
        for (int k = 0; k < 3 && ok; ++k) {
            const std::string f = nm->fqn(kMoments[k]);
            if (!by_fqn.count(f)) {
                if (k < 2) { skip(std::string("no ") + kMoments[k]); ok = false; }
                break;
            }
            const Item* it = by_fqn[f].size() == list.size() ? chunk_of(f, first->chunk) : nullptr;
            if (!it) { skip(std::string(kMoments[k]) + " chunks differ from exp_avg's"); ok = false; break; }
            const Parsed pa = parse_item(dir, *it, scratch, limits);
            const TensorInfo* t = whole_tensor(pa.ck);
            if (!t || !float_dtype_size(t->dtype)) { skip(std::string(kMoments[k]) + " is not a whole F32/F16/BF16 tensor"); ok = false; break; }
            const StorageInfo& s = pa.ck.storages[t->storage];
            Moment m{std::string("state.") + name + "." + kMoments[k], it->file, pa.base + s.file_offset, s.nbytes, t->dtype, t->shape, {}};
            for (uint64_t c : s.crc_offsets) m.crcs.push_back(pa.base + c);
            p.m.push_back(m);
        }
        if (!ok) continue;
        if (nm->megatron) {   // theta: the main parameters' item, else the model's, cut out as the moments are
            for (const std::string& t : {nm->fqn("fp32_param"), nm->fqn("param"), P}) {
                const Item* it = by_fqn.count(t) && by_fqn[t].size() == list.size() ? chunk_of(t, first->chunk) : nullptr;
                if (!it || !in_unit.count(it->file)) continue;
                const Parsed pa = parse_item(dir, *it, scratch, limits);
                const TensorInfo* ti = whole_tensor(pa.ck);
                if (!ti || !float_dtype_size(ti->dtype) || ti->shape != p.m[0].shape) continue;
                const StorageInfo& s = pa.ck.storages[ti->storage];
                Moment m{name, it->file, pa.base + s.file_offset, s.nbytes, ti->dtype, ti->shape, {}};
                for (uint64_t c : s.crc_offsets) m.crcs.push_back(pa.base + c);
                p.m.push_back(m);
                break;
            }
        }
        const std::string step_fqn = nm->fqn("step");
        const Item* si = one(step_fqn);
        if (nm->megatron && !si) {   // the param groups' step, as Megatron's load_state_dict sets it
            const MegatronCommon& c = megatron_common();
            p.step = c.hyper->hyper.step;
            p.step_dtype = c.hyper->stated & kStepNumber ? DType::F32 : DType::F64;
            p.group = c.group;
            p.group["params"] = json::array({name});
            params.push_back(std::move(p));
            ++res.megatron;
            continue;
        }
        if (!si) { skip("no step item"); continue; }
        {
            const Parsed pa = parse_item(dir, *si, scratch, limits);
            if (auto d = std::get_if<double>(&pa.ck.root.v)) p.step = *d;
            else if (auto i = std::get_if<int64_t>(&pa.ck.root.v)) p.step = double(*i);
            else if (auto t = std::get_if<Value::Tensor>(&pa.ck.root.v)) {
                if (nm->megatron && pa.ck.tensors.at(t->index).dtype == DType::F32) p.step_dtype = DType::F32;
                const io::InputFile f(pa.path);
                const auto v = read_small_tensor(pa.ck, f, int(t->index));
                if (v.size() != 1) { skip("step is not a scalar"); continue; }
                p.step = v[0];
            } else { skip("step is not a number"); continue; }
        }
        // the flattened form's X.param_groups.<P>.<key>, else the default form's group (also
        // when P is a state id equal to a group index: a group has its .params item)
        std::string gp = X + ".param_groups." + P + ".";
        const auto flat_it = by_fqn.lower_bound(gp);
        if (flat_it == by_fqn.end() || flat_it->first.rfind(gp, 0) != 0 || by_fqn.count(gp + "params"))
            gp = default_group(X, P);
        p.group = json::object();
        for (auto it = gp.empty() ? by_fqn.end() : by_fqn.lower_bound(gp); it != by_fqn.end() && it->first.rfind(gp, 0) == 0 && ok; ++it) {
            const std::string key = it->first.substr(gp.size());
            if (key.find('.') != std::string::npos || it->second.size() != 1 || key == "params") continue;
            const Parsed pa = parse_item(dir, *it->second[0], scratch, limits);
            json v;
            const auto* t = std::get_if<Value::Tensor>(&pa.ck.root.v);
            const TensorInfo* ti = t ? &pa.ck.tensors.at(t->index) : nullptr;
            if (ti && ti->numel() == 1 && (float_dtype_size(ti->dtype) || ti->dtype == DType::F64)) {
                // a one-value float tensor (lr=torch.tensor(...)), as find_param_states reads it in a file
                const io::InputFile f(pa.path);
                const auto x = read_small_tensor(pa.ck, f, int(t->index));
                if (x.size() != 1 || !std::isfinite(x[0])) { skip("param_groups." + key + " is not a finite scalar"); ok = false; break; }
                v = x[0];
            } else if (!to_json(pa.ck.root, v)) { skip("param_groups." + key + " is not a plain value"); ok = false; break; }
            p.group[key] = v;
        }
        if (!ok) continue;
        if (nm->megatron) p.group = megatron_common().group;
        if (p.group.empty()) { skip("no param_groups items"); continue; }
        p.group["params"] = json::array({name});
        params.push_back(std::move(p));
        if (nm->megatron) ++res.megatron;
        }
    }
    if (mc) res.megatron_source = mc->source;
    if (megatron_left)
        skipped.push_back(fmt::format("Megatron's moment items of {} parameter chunks ({})",
                                      megatron_left, mc->why_not));
    if (!skipped.empty()) res.note = "left exact: " + fmt::format("{}", fmt::join(skipped, ", "));
    if (params.empty()) return res;
    // report names for the state ids of the plain form: by parameter order (names_by_order)
    // over the folder's other top-level state_dicts, in the order .metadata lists them;
    // __metadata__'s param_names (one group per param here), or why not
    json names = json::array();
    std::string unnamed_why;
    std::map<std::string, std::map<std::string, std::string>> named;   // X -> id -> name
    ckpt::ModelTensors sizes;
    std::map<std::string, std::vector<int64_t>> size_of;
    for (const auto& p : params) {
        if (p.X.empty() || named.count(p.X)) continue;
        if (sizes.empty()) {
            sizes = dcp_tensor_sizes(dir);
            size_of.insert(sizes.begin(), sizes.end());
        }
        ckpt::GroupShapes groups;
        for (const auto& [prefix, ids] : groups_of(p.X)) {
            groups.emplace_back();
            for (const auto& id : ids) {
                auto e = size_of.find(p.X + ".state." + id + ".exp_avg");
                groups.back().push_back({id, e == size_of.end() ? nullptr : &e->second});
            }
        }
        std::map<std::string, ckpt::ModelTensors> models;   // top-level key -> its tensors, keys without it
        const std::string x_top = p.X.substr(0, p.X.find('.'));
        for (const auto& [fqn, shape] : sizes) {
            const auto dot = fqn.find('.');
            if (dot == std::string::npos || fqn.substr(0, dot) == x_top || fqn.find(".state.") != std::string::npos ||
                fqn.find(".param_groups.") != std::string::npos)
                continue;
            models[fqn.substr(0, dot)].push_back({fqn.substr(dot + 1), shape});
        }
        std::vector<ckpt::ModelTensors> list;
        for (auto& [top, t] : models) list.push_back(std::move(t));
        auto [found, why] = ckpt::names_by_order(list, groups);
        named[p.X] = std::move(found);
        if (!why.empty()) unnamed_why = why;
    }
    for (const auto& p : params) {
        const auto n = named.find(p.X);
        if (p.X.empty()) names.push_back(p.name);
        else if (n != named.end() && n->second.count(p.name)) names.push_back(n->second.at(p.name));
        else names.push_back(nullptr);
    }
    // the safetensors file: header (tensors in file order), then the data
    json header = json::object(), groups = json::array();
    uint64_t off = 0;
    for (const auto& p : params) {
        for (const auto& m : p.m) {
            header[m.name] = {{"dtype", dtype_name(m.dtype)}, {"shape", m.shape}, {"data_offsets", {off, off + m.nbytes}}};
            off += m.nbytes;
        }
        const uint64_t sn = p.step_dtype == DType::F32 ? 4 : 8;
        header["state." + p.name + ".step"] = {{"dtype", dtype_name(p.step_dtype)}, {"shape", json::array()}, {"data_offsets", {off, off + sn}}};
        off += sn;
        groups.push_back(p.group);
    }
    header["__metadata__"] = {{"format", "pt"}, {"param_groups", groups.dump()}, {"source", "ckptkit folder mode: DCP moment items"}};
    if (!named.empty()) header["__metadata__"]["param_names"] = names.dump();
    if (!unnamed_why.empty()) header["__metadata__"]["unnamed_why"] = unnamed_why;
    std::string h = header.dump();
    h.append((8 - h.size() % 8) % 8, ' ');
    std::map<std::string, DcpFile> files;
    try {
        FileWriter w(out);
        const uint64_t hn = h.size();
        w.write(&hn, 8);
        w.write(h.data(), h.size());
        for (const auto& p : params) {
            for (const auto& m : p.m) {
                const io::InputFile f(join(dir, m.file));
                copy_range(f, m.abs, m.nbytes, w, nullptr);
                DcpFile& df = files[m.file];
                df.file = m.file;
                df.cuts.push_back({m.abs, m.nbytes, m.name, m.crcs});
            }
            if (p.step_dtype == DType::F32) {
                const float s32 = float(p.step);
                w.write(&s32, 4);
            } else {
                w.write(&p.step, 8);
            }
        }
        w.close();
    } catch (const BadInput&) {
        throw;
    } catch (const std::exception& e) {
        throw BadInput(out, e.what());
    }
    for (auto& [name, f] : files) {
        std::sort(f.cuts.begin(), f.cuts.end(), [](const DcpCut& a, const DcpCut& b) { return a.offset < b.offset; });
        res.files.push_back(f);
    }
    res.params = params.size();
    return res;
}

std::optional<double> dcp_param_bound(const std::string& dir, const std::string& scratch, const Limits& limits) {
    double bound = 0;
    bool found = false;
    for (const auto& it : dcp_items(dir)) {
        if (it.fqn.find(".state.") != std::string::npos || it.fqn.find(".param_groups.") != std::string::npos) continue;
        const Parsed pa = parse_item(dir, it, scratch, limits);
        bool model = std::holds_alternative<Value::Tensor>(pa.ck.root.v);
        if (const auto* d = std::get_if<Value::Dict>(&pa.ck.root.v); d && !d->empty()) {   // a state_dict
            model = true;
            for (const auto& kv : *d) model = model && std::holds_alternative<Value::Tensor>(kv.second.v);
        }
        if (!model) continue;
        bound = std::max(bound, max_abs_storages(pa.ck, io::InputFile(pa.path), it.fqn));
        for (const auto& s : pa.ck.storages) found = found || float_dtype_size(s.dtype);
    }
    return found ? std::optional<double>(bound) : std::nullopt;
}

void write_shell(const std::string& src, const DcpFile& df, const std::string& dst) {
    try {
        const io::InputFile f(src);
        FileWriter w(dst);
        uint64_t pos = 0;
        for (const auto& c : df.cuts) {
            if (c.offset < pos || !f.contains(c.offset, c.length)) throw BadInput(src, "overlapping or outside moment ranges");
            copy_range(f, pos, c.offset - pos, w, nullptr);
            pos = c.offset + c.length;
        }
        copy_range(f, pos, f.size() - pos, w, nullptr);
        w.close();
    } catch (const BadInput&) {
        throw;
    } catch (const std::exception& e) {
        throw BadInput(dst, e.what());
    }
}

void rebuild_from_shell(const std::string& shell, const DcpFile& df, const std::string& moments, const std::string& dst) {
    std::optional<FileWriter> w;
    try {
        w.emplace(dst);
    } catch (const std::exception& e) {
        throw BadInput(dst, e.what());
    }
    rebuild_from_shell(shell, df, moments, *w);
}

void rebuild_from_shell(const std::string& shell, const DcpFile& df, const std::string& moments, FileWriter& w) {
    const Checkpoint mk = read_checkpoint(moments);
    std::map<std::string, const StorageInfo*> by_name;
    for (const auto& t : mk.tensors) by_name[t.path] = &mk.storages[t.storage];
    try {
        const io::InputFile sh(shell), mf(moments);
        uint64_t orig = 0, spos = 0;
        std::vector<std::pair<uint64_t, uint32_t>> crcs;
        for (const auto& c : df.cuts) {
            auto s = by_name.find(c.tensor);
            if (s == by_name.end() || s->second->nbytes != c.length)
                throw CheckFailed(moments + ": restored moments lack " + c.tensor + " of " + std::to_string(c.length) + " bytes");
            const uint64_t n = c.offset - orig;
            copy_range(sh, spos, n, w, nullptr);
            spos += n;
            uint32_t crc = 0;  // zip's CRC-32, chained (crc32_gzip_refl)
            copy_range(mf, s->second->file_offset, c.length, w, &crc);
            for (uint64_t o : c.crc_offsets) crcs.push_back({o, uint32_t(crc)});
            orig = c.offset + c.length;
        }
        copy_range(sh, spos, sh.size() - spos, w, nullptr);
        for (const auto& [o, v] : crcs) {
            if (o + 4 > w.offset()) throw CheckFailed(shell + ": CRC field outside the rebuilt file");
            const uint8_t le[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
            w.pwrite(o, le, 4);
        }
        w.close();
    } catch (const BadInput&) {
        throw;
    } catch (const CheckFailed&) {
        throw;
    } catch (const std::exception& e) {
        throw BadInput(shell, e.what());
    }
}

json cuts_json(const std::vector<DcpCut>& cuts) {
    json a = json::array();
    for (const auto& c : cuts) a.push_back({{"offset", c.offset}, {"length", c.length}, {"tensor", c.tensor}, {"crc_offsets", c.crc_offsets}});
    return a;
}

std::optional<uint64_t> shell_offset(const std::vector<DcpCut>& cuts, uint64_t offset, uint64_t length) {
    uint64_t at = offset;
    for (const DcpCut& cut : cuts) {
        if (cut.offset < offset + length && offset < cut.offset + cut.length) return std::nullopt;
        if (cut.offset + cut.length <= offset) at -= cut.length;
    }
    return at;
}

std::vector<DcpCut> cuts_from(const json& a) {
    std::vector<DcpCut> out;
    uint64_t prev = 0;
    for (const auto& c : a) {
        std::vector<uint64_t> crcs;
        for (const auto& o : c.at("crc_offsets")) crcs.push_back(json_count_of(o, "crc_offsets"));
        DcpCut x{json_count(c, "offset"), json_count(c, "length"), c.at("tensor").get<std::string>(), std::move(crcs)};
        if (x.offset < prev || x.length > UINT64_MAX - x.offset) throw std::invalid_argument("cuts out of order");
        prev = x.offset + x.length;
        out.push_back(x);
    }
    return out;
}

}  // namespace ckpt::folder
