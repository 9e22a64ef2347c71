// Importer for PyTorch Execution Traces (docs/design.md "PyTorch Execution Trace"): torch 1.13
// ExecutionGraphObserver schema 1.0.1 (flat node fields) and the Chakra-style nested schema
// (inputs/outputs objects, attrs list). Both are normalised to EtNode first.
//
// Rules (documented in formats/trace.md):
// - segments: nodes named "ckpt.segment:NAME", in node-id (start) order; an op belongs to the
//   segment of its nearest labelled ancestor (parent / ctrl_deps chain);
// - a storage is *born* where it first appears as an op output (node-id order); one that first
//   appears as an input existed before the step (parameters, buffers, the batch);
// - a write is an argument annotated `(x!)` in op_schema, plus running_mean/running_var of
//   aten::native_batch_norm in training mode (torch 1.13 does not annotate them; with
//   training=False it writes nothing);
// - mutable state = a storage written by a segment it was not born in; reads = such storages
//   used as inputs; regions = [offset*itemsize, numel*itemsize) of the written views;
// - RNG: the random ops listed in kRandomOps consume the device's generator (CPU state 5056
//   bytes, CUDA Philox seed+offset 16 bytes); one given an explicit torch.Generator (input
//   type "Generator") makes its segment non-replayable: the trace does not say which one;
// - sizes: a storage's extent is the largest [offset, offset + numel) of its tensors, except
//   broadcast views (outputs of aten::expand / expand_as / broadcast_to and the as_strided
//   under them: numel counts repeated elements, 1.0.1 has no strides); fixed memory = 4 x the
//   pre-existing storages the segments read, except the batch (segment 0's first input);
//   saved bytes = produced storages that nodes after the forward read (consumer rule).
#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "replay/trace.h"

namespace ckpt::replay {
namespace {

using json = nlohmann::json;

// Integer field `key` of node n, or `fallback` when absent. A float or a number outside
// int64 is bad input: nlohmann's get<int64_t> would convert it with undefined behaviour.
int64_t int_field(const json& n, const char* key, int64_t fallback) {
    auto it = n.find(key);
    if (it == n.end()) return fallback;
    if (!it->is_number_integer() ||
        (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)))
        throw std::invalid_argument(fmt::format("node field '{}': expected an int64", key));
    return it->get<int64_t>();
}

const char* const kLabel = "ckpt.segment:";
const std::set<std::string> kRandomOps = {
    "aten::bernoulli_", "aten::bernoulli",   "aten::normal_",     "aten::normal",
    "aten::uniform_",   "aten::rand",        "aten::randn",       "aten::randint",
    "aten::randperm",   "aten::rand_like",   "aten::randn_like",  "aten::randint_like",
    "aten::multinomial", "aten::exponential_", "aten::geometric_", "aten::cauchy_",
    "aten::log_normal_", "aten::random_",    "aten::native_dropout"};

struct TRef {
    int64_t tensor = 0;
    int64_t storage = 0;
    uint64_t offset = 0, numel = 0, itemsize = 0;
    std::string device;
    uint64_t begin() const { return offset * itemsize; }
    uint64_t end() const { return (offset + numel) * itemsize; }
};

struct EtNode {
    int64_t id = 0, parent = -1;
    std::string name, schema;
    std::vector<std::vector<TRef>> inputs, outputs;  // per argument: its tensors
    double dur_us = -1;
    bool explicit_generator = false;   // an argument of type Generator (not None)
    bool training = true;              // native_batch_norm's `training` argument
};

const std::set<std::string> kBroadcastOps = {"aten::expand", "aten::expand_as",
                                             "aten::broadcast_to"};

// True when node n takes tensor id `tensor` as an input (an in-place op returns its input).
bool in_tensor_ids(const EtNode& n, int64_t tensor) {
    for (const auto& a : n.inputs)
        for (const auto& t : a)
            if (t.tensor == tensor) return true;
    return false;
}

// Fill explicit_generator / training from the argument values and types.
void scalar_args(EtNode& e, const json& vals, const json& types) {
    if (types.is_array())
        for (const auto& t : types)
            if (t.is_string() && t.get<std::string>() == "Generator") e.explicit_generator = true;
    if (e.name == "aten::native_batch_norm" && vals.is_array() && vals.size() > 5 &&
        vals[5].is_boolean())
        e.training = vals[5].get<bool>();
}

bool is_tref(const json& v) {
    if (!v.is_array() || v.size() != 6 || !v[5].is_string()) return false;
    for (int k = 0; k < 5; ++k)
        if (!v[k].is_number_integer() ||
            (!v[k].is_number_unsigned() && v[k].get<int64_t>() < 0) ||
            (k < 2 && v[k].get<uint64_t>() > uint64_t(INT64_MAX)))
            return false;
    return true;
}

std::vector<TRef> trefs(const json& v) {
    std::vector<TRef> out;
    auto one = [&](const json& t) {
        out.push_back({t[0].get<int64_t>(), t[1].get<int64_t>(), t[2].get<uint64_t>(), t[3].get<uint64_t>(),
                       t[4].get<uint64_t>(), t[5].get<std::string>()});
    };
    if (is_tref(v)) one(v);
    else if (v.is_array())
        for (const auto& e : v)
            if (is_tref(e)) one(e);
    return out;
}

std::vector<std::vector<TRef>> args(const json& vals) {
    std::vector<std::vector<TRef>> out;
    if (vals.is_array())
        for (const auto& v : vals) out.push_back(trefs(v));
    return out;
}

EtNode normalise(const json& n, bool chakra) {
    EtNode e;
    e.id = int_field(n, "id", -1);
    e.name = n.at("name").get<std::string>();
    if (!chakra) {
        e.parent = int_field(n, "parent", -1);
        e.schema = n.value("op_schema", "");
        e.inputs = args(n.value("inputs", json::array()));
        e.outputs = args(n.value("outputs", json::array()));
        scalar_args(e, n.value("inputs", json::array()), n.value("input_types", json::array()));
        if (n.contains("dur") && n["dur"].is_number()) e.dur_us = n["dur"].get<double>();
    } else {
        e.parent = int_field(n, "ctrl_deps", -1);
        if (n.contains("inputs") && n["inputs"].is_object()) {
            e.inputs = args(n["inputs"].value("values", json::array()));
            scalar_args(e, n["inputs"].value("values", json::array()),
                        n["inputs"].value("types", json::array()));
        }
        if (n.contains("outputs") && n["outputs"].is_object())
            e.outputs = args(n["outputs"].value("values", json::array()));
        if (n.contains("attrs") && n["attrs"].is_array())
            for (const auto& a : n["attrs"]) {
                std::string nm = a.value("name", "");
                if (nm == "op_schema" && a.contains("value") && a["value"].is_string())
                    e.schema = a["value"].get<std::string>();
                if (nm == "dur" && a.contains("value") && a["value"].is_number())
                    e.dur_us = a["value"].get<double>();
            }
        if (n.contains("dur") && n["dur"].is_number()) e.dur_us = n["dur"].get<double>();
    }
    return e;
}

// Argument positions annotated as written, e.g. "aten::add_.Tensor(Tensor(a!) self, ...)".
std::vector<size_t> written_args(const EtNode& n) {
    std::vector<size_t> out;
    auto open = n.schema.find('(');
    if (open == std::string::npos) return out;
    int depth = 0;
    size_t pos = 0, start = open + 1;
    for (size_t k = open + 1; k < n.schema.size(); ++k) {
        char c = n.schema[k];
        if (c == '(' || c == '[') ++depth;
        else if ((c == ')' || c == ']') && depth > 0) --depth;
        else if ((c == ',' || c == ')') && depth == 0) {
            std::string arg = n.schema.substr(start, k - start);
            auto first = arg.find_first_not_of(' ');
            bool marker = first != std::string::npos && arg.substr(first) == "*";
            if (!marker) {
                static const std::regex kMut(R"(\([a-z]+!\))");
                if (std::regex_search(arg, kMut)) out.push_back(pos);
                ++pos;
            }
            start = k + 1;
            if (c == ')') break;
        }
    }
    if (n.name == "aten::native_batch_norm" && n.training) out.insert(out.end(), {3, 4});
    return out;
}

}  // namespace

Trace import_execution_trace(const json& j, const std::string& file) {
    if (!j.at("schema").is_string()) throw BadInput(file, "schema: expected a string");
    std::string schema = j["schema"].get<std::string>();
    bool chakra = schema.find("chakra") != std::string::npos;
    if (!chakra && schema != "1.0.1")
        throw BadInput(file, fmt::format("unsupported Execution Trace schema '{}' (reads 1.0.1 "
                                         "and the Chakra-style nested schema)", schema));
    if (!j.at("nodes").is_array()) throw BadInput(file, "nodes: expected an array");
    std::map<int64_t, EtNode> nodes;
    for (const auto& n : j["nodes"]) {
        if (!n.is_object() || !n.contains("id") || !n.contains("name"))
            throw BadInput(file, "node without id/name");
        EtNode e = normalise(n, chakra);
        nodes[e.id] = std::move(e);
    }
    // Segment of every node: nearest labelled ancestor (labels by id = start order).
    std::map<int64_t, int64_t> seg_of;  // node id -> label node id (-1 none)
    std::function<int64_t(int64_t, int)> find = [&](int64_t id, int depth) -> int64_t {
        if (depth > 10000) throw BadInput(file, "parent chain too deep or cyclic");
        auto memo = seg_of.find(id);
        if (memo != seg_of.end()) return memo->second;
        auto it = nodes.find(id);
        int64_t r = -1;
        if (it != nodes.end()) {
            if (it->second.name.rfind(kLabel, 0) == 0) r = id;
            else if (it->second.parent != id) r = find(it->second.parent, depth + 1);
        }
        seg_of[id] = r;
        return r;
    };
    std::vector<int64_t> labels;
    for (const auto& [id, n] : nodes)
        if (n.name.rfind(kLabel, 0) == 0) labels.push_back(id);
    if (labels.empty())
        throw BadInput(file, "no record_function labels 'ckpt.segment:NAME' (record the trace "
                             "with scripts/record_trace.py --et)");
    std::map<int64_t, size_t> seg_index;
    for (size_t i = 0; i < labels.size(); ++i) seg_index[labels[i]] = i;

    // Storage ids are reused after a free. A storage id starts a new lifetime when a node
    // outputs it without taking it as input and outside the subtree of the node where the
    // current lifetime began; every TRef.storage is rewritten to a lifetime key.
    auto descends = [&](int64_t id, int64_t anc) {
        for (int depth = 0; id >= 0 && depth < 10000; ++depth) {
            if (id == anc) return true;
            auto it = nodes.find(id);
            if (it == nodes.end() || it->second.parent == id) return false;
            id = it->second.parent;
        }
        return false;
    };
    std::map<int64_t, std::pair<int64_t, int64_t>> life;  // storage id -> (key, birth node)
    int64_t next_key = 0;
    std::map<int64_t, int64_t> born;  // key -> segment index where first output (-1 outside)
    std::map<int64_t, uint64_t> extent;
    std::set<int64_t> broadcast;   // tensor ids of broadcast views (not counted in extents)
    for (auto& [id, n] : nodes) {
        const bool bcast_op = kBroadcastOps.count(n.name) > 0 ||
                              (n.name == "aten::as_strided" && nodes.count(n.parent) &&
                               kBroadcastOps.count(nodes[n.parent].name) > 0);
        // Tensor ids are reused after a free: an id is a broadcast view from the broadcast op
        // that outputs it until any other op outputs that id (a new tensor).
        for (const auto& a : n.outputs)
            for (const auto& t : a) {
                if (bcast_op) broadcast.insert(t.tensor);
                else if (!in_tensor_ids(n, t.tensor)) broadcast.erase(t.tensor);
            }
        int64_t lab = find(id, 0);
        int64_t si = lab < 0 ? -1 : static_cast<int64_t>(seg_index[lab]);
        std::set<int64_t> in_ids;
        for (auto& a : n.inputs)
            for (auto& t : a) {
                in_ids.insert(t.storage);
                auto it = life.find(t.storage);
                if (it == life.end()) it = life.emplace(t.storage, std::make_pair(next_key++, int64_t{-1})).first;
                t.storage = it->second.first;
                if (!broadcast.count(t.tensor))
                    extent[t.storage] = std::max(extent[t.storage], t.end());
            }
        for (auto& a : n.outputs)
            for (auto& t : a) {
                auto it = life.find(t.storage);
                if (it == life.end() ||
                    (!in_ids.count(t.storage) && !descends(id, it->second.second))) {
                    life[t.storage] = {next_key, id};
                    born[next_key] = si;
                    t.storage = next_key++;
                } else {
                    t.storage = it->second.first;
                }
                if (!broadcast.count(t.tensor))
                    extent[t.storage] = std::max(extent[t.storage], t.end());
            }
    }
    auto born_in = [&](int64_t storage, size_t si) {
        auto it = born.find(storage);
        return it != born.end() && it->second == static_cast<int64_t>(si);
    };

    Trace t;
    t.source = "pytorch-et " + schema;
    t.model = "";
    struct SegWork {
        std::vector<const EtNode*> ops, top;
        std::map<int64_t, std::vector<Region>> writes;
        std::set<int64_t> reads;
        std::set<std::string> rng;
        std::string explicit_generator;   // a random op given a torch.Generator
        uint64_t produced = 0;            // saved bytes (see below)
    };
    std::vector<SegWork> work(labels.size());
    for (const auto& [id, n] : nodes) {
        int64_t lab = find(id, 0);
        if (lab < 0 || lab == id) continue;
        SegWork& w = work[seg_index[lab]];
        w.ops.push_back(&n);
        if (n.parent == lab) w.top.push_back(&n);
    }
    std::set<int64_t> state_storages;
    for (size_t si = 0; si < labels.size(); ++si) {
        SegWork& w = work[si];
        std::set<int64_t> counted;
        for (const EtNode* n : w.ops) {
            for (size_t k : written_args(*n)) {
                if (k >= n->inputs.size()) continue;
                for (const auto& tr : n->inputs[k]) {
                    if (born_in(tr.storage, si)) continue;
                    w.writes[tr.storage].push_back({tr.begin(), tr.end() - tr.begin()});
                    state_storages.insert(tr.storage);
                }
            }
            if (kRandomOps.count(n->name) && n->explicit_generator)
                w.explicit_generator = n->name;
            if (kRandomOps.count(n->name)) {
                std::string dev = "cpu";
                for (const auto& a : n->outputs)
                    for (const auto& tr : a) dev = tr.device;
                w.rng.insert(dev.rfind("cuda", 0) == 0 ? "cuda" : "cpu");
            }
            for (const auto& a : n->outputs)
                for (const auto& tr : a)
                    if (born_in(tr.storage, si) && counted.insert(tr.storage).second)
                        w.produced += extent[tr.storage];
        }
    }
    for (size_t si = 0; si < labels.size(); ++si)
        for (const EtNode* n : work[si].ops)
            for (const auto& a : n->inputs)
                for (const auto& tr : a)
                    if (state_storages.count(tr.storage)) work[si].reads.insert(tr.storage);

    // Saved bytes (what autograd keeps for backward), as the recorder counts them: storages
    // the segments produced (and the batch) that nodes after the forward (the loss, the
    // backward) read, each counted once: in the first later segment that takes it as an input
    // (the consumer of a boundary tensor), else in the segment that produced it. Without any
    // node after the forward (a forward-only trace) every storage a segment produced counts.
    std::set<int64_t> batch;   // segment 0's first tensor argument
    for (const EtNode* top : work.empty() ? std::vector<const EtNode*>{} : work[0].top)
        if (!top->inputs.empty() && !top->inputs[0].empty()) {
            for (const auto& tr : top->inputs[0]) batch.insert(tr.storage);
            break;
        }
    int64_t last_forward = -1;
    for (const auto& w : work)
        for (const EtNode* n : w.ops) last_forward = std::max(last_forward, n->id);
    std::set<int64_t> used_after;
    for (const auto& [id, n] : nodes)
        if (id > last_forward && find(id, 0) < 0)
            for (const auto& a : n.inputs)
                for (const auto& tr : a) used_after.insert(tr.storage);
    if (!used_after.empty()) {
        std::map<int64_t, size_t> owner;   // storage -> segment its bytes are counted in
        for (size_t si = 0; si < labels.size(); ++si)
            for (const EtNode* n : work[si].ops)
                for (const auto& a : n->inputs)
                    for (const auto& tr : a) {
                        auto b = born.find(tr.storage);
                        const bool produced_before = b != born.end() && b->second >= 0 &&
                                                     static_cast<size_t>(b->second) < si;
                        if ((produced_before || batch.count(tr.storage)) && !owner.count(tr.storage))
                            owner[tr.storage] = si;
                    }
        for (const auto& [key, si] : born)
            if (si >= 0 && !owner.count(key)) owner[key] = static_cast<size_t>(si);
        for (auto& w : work) w.produced = 0;
        for (int64_t key : used_after) {
            auto o = owner.find(key);
            if (o != owner.end() && !state_storages.count(key)) work[o->second].produced += extent[key];
        }
    }

    auto buffer_id = [](int64_t s) { return fmt::format("storage:{}", s); };
    for (int64_t s : state_storages) t.buffers.push_back({buffer_id(s), extent[s]});
    std::map<int64_t, uint64_t> version;
    uint64_t prev_out = 0, read_only = 0;
    std::set<int64_t> read_only_seen;
    for (size_t si = 0; si < labels.size(); ++si) {
        SegWork& w = work[si];
        Segment g;
        g.name = nodes[labels[si]].name.substr(std::string(kLabel).size());
        double dur = 0;
        bool have_dur = !w.top.empty();
        for (const EtNode* n : w.top) {
            if (n->dur_us < 0) have_dur = false;
            else dur += n->dur_us;
        }
        g.forward_ms = have_dur ? dur / 1000.0 : 0.01 * static_cast<double>(w.ops.size());
        g.backward_ms = 2 * g.forward_ms;
        uint64_t out = 0;
        if (!w.top.empty())
            for (const auto& a : w.top.back()->outputs)
                for (const auto& tr : a) out += tr.numel * tr.itemsize;
        g.output_bytes = out;
        g.transient_bytes = out;
        g.saved_bytes = w.produced;
        if (si == 0)   // the batch: the first tensor argument of segment 0's first op taking one
            for (const EtNode* top : w.top)
                if (!top->inputs.empty() && !top->inputs[0].empty()) {
                    for (const auto& tr : top->inputs[0]) {
                        prev_out = tr.numel * tr.itemsize;
                        read_only_seen.insert(tr.storage);   // not fixed memory
                    }
                    break;
                }
        g.input_bytes = prev_out;
        prev_out = out;
        std::set<int64_t> touched(w.reads);
        for (const auto& [s, _] : w.writes) touched.insert(s);
        for (int64_t s : touched) {
            StateAccess a;
            a.buffer = buffer_id(s);
            a.read = w.reads.count(s) > 0;
            a.version_read = version[s];
            a.bytes_read = extent[s];
            auto wi = w.writes.find(s);
            if (wi != w.writes.end()) {
                auto rs = wi->second;
                std::sort(rs.begin(), rs.end(),
                          [](const Region& x, const Region& y) { return x.offset < y.offset; });
                std::vector<Region> merged;
                for (const auto& r : rs) {
                    uint64_t end = std::min(r.offset + r.length, extent[s]);
                    if (r.offset >= end) continue;
                    if (!merged.empty() && r.offset <= merged.back().offset + merged.back().length)
                        merged.back().length =
                            std::max(merged.back().offset + merged.back().length, end) -
                            merged.back().offset;
                    else merged.push_back({r.offset, end - r.offset});
                }
                a.written = true;
                a.version_written = ++version[s];
                a.bytes_written = extent[s];
                a.regions = merged;
            }
            g.state.push_back(a);
        }
        for (const auto& st : w.rng) g.rng.push_back({st, st == "cuda" ? 16u : 5056u});
        if (!w.explicit_generator.empty())
            g.non_replayable = w.explicit_generator + " draws from an explicit torch.Generator; "
                               "the Execution Trace does not say which (record with "
                               "scripts/record_trace.py to plan it)";
        for (const EtNode* n : w.ops)
            for (const auto& a : n->inputs)
                for (const auto& tr : a)
                    if (!born.count(tr.storage) && !state_storages.count(tr.storage) &&
                        read_only_seen.insert(tr.storage).second)
                        read_only += extent[tr.storage];
        t.segments.push_back(std::move(g));
    }
    t.param_bytes = read_only;
    t.grad_bytes = read_only;
    t.optimizer_bytes = 2 * read_only;
    // Round trip through the validating reader: the imported trace obeys the same rules.
    return trace_from_json(trace_to_json(t), file);
}

}  // namespace ckpt::replay
