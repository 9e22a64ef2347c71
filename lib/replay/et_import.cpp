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
#include <array>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "replay/trace.h"
#include "replay/trace_json.h"

namespace ckpt::replay {
namespace {

using simdjson::dom::element;
namespace dom = simdjson::dom;

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

// Reads one node object of the ET into an EtNode; every failure is BadInput naming the
// node's JSON path (nodes[K].FIELD). Absent optional fields take their defaults; arguments
// that are not tensor tuples are skipped, as the importer does not model them.
class NodeReader {
public:
    NodeReader(const std::string& file, bool chakra) : file_(file), chakra_(chakra) {}

    EtNode read(element n, size_t k) const {
        const std::string where = fmt::format("nodes[{}]", k);
        EtNode e;
        e.id = int_field(n, "id", -1, where);
        e.name = string_field(n, "name", where, nullptr);
        if (!chakra_) {
            e.parent = int_field(n, "parent", -1, where);
            e.schema = string_field(n, "op_schema", where, "");
            const auto inputs = member(n, "inputs");
            e.inputs = args(inputs);
            e.outputs = args(member(n, "outputs"));
            scalar_args(e, inputs, member(n, "input_types"));
        } else {
            e.parent = int_field(n, "ctrl_deps", -1, where);
            if (auto in = member(n, "inputs"); in && in->is_object()) {
                const auto vals = member(*in, "values");
                e.inputs = args(vals);
                scalar_args(e, vals, member(*in, "types"));
            }
            if (auto out = member(n, "outputs"); out && out->is_object())
                e.outputs = args(member(*out, "values"));
            dom::array attrs;
            if (auto v = member(n, "attrs"); v && v->get(attrs) == simdjson::SUCCESS) {
                size_t i = 0;
                for (element a : attrs) {
                    const std::string wa = fmt::format("{}.attrs[{}]", where, i++);
                    if (!a.is_object()) fail(wa + ": expected an object");
                    const std::string nm = string_field(a, "name", wa, "");
                    const auto value = member(a, "value");
                    std::string_view text;
                    if (nm == "op_schema" && value && value->get_string().get(text) == simdjson::SUCCESS)
                        e.schema = std::string(text);
                    if (nm == "dur" && value && value->is_number())
                        e.dur_us = value->get_double().value_unsafe();
                }
            }
        }
        if (auto dur = member(n, "dur"); dur && dur->is_number()) e.dur_us = dur->get_double().value_unsafe();
        return e;
    }

private:
    [[noreturn]] void fail(const std::string& what) const { throw BadInput(file_, what); }

    // Integer field `key` of node n, or `fallback` when absent. A float or a number outside
    // int64 is bad input (a float such as 1.1e205 must never be converted to an integer).
    int64_t int_field(element n, const char* key, int64_t fallback, const std::string& where) const {
        const auto v = member(n, key);
        if (!v) return fallback;
        int64_t x = 0;
        if (!v->is_int64() || v->get_int64().get(x) != simdjson::SUCCESS)
            fail(fmt::format("{}.{}: expected an int64", where, key));
        return x;
    }

    // String field `key` of n; `fallback` when absent (nullptr: the field is required).
    std::string string_field(element n, const char* key, const std::string& where,
                             const char* fallback) const {
        const auto v = member(n, key);
        if (!v && fallback) return fallback;
        std::string_view s;
        if (!v || v->get_string().get(s) != simdjson::SUCCESS)
            fail(fmt::format("{}.{}: expected a string", where, key));
        return std::string(s);
    }

    // explicit_generator / training from the argument values and types (arrays, else ignored).
    static void scalar_args(EtNode& e, std::optional<element> vals, std::optional<element> types) {
        dom::array a;
        if (types && types->get(a) == simdjson::SUCCESS)
            for (element t : a) {
                std::string_view s;
                if (t.get_string().get(s) == simdjson::SUCCESS && s == "Generator")
                    e.explicit_generator = true;
            }
        bool training = true;
        if (e.name == "aten::native_batch_norm" && vals && vals->get(a) == simdjson::SUCCESS &&
            a.size() > 5 && a.at(5).get_bool().get(training) == simdjson::SUCCESS)
            e.training = training;
    }

    // A tensor tuple [tensor_id, storage_id, offset, numel, itemsize, device]: non-negative
    // integers (ids within int64) and a device string.
    static bool tref(element v, TRef& out) {
        dom::array a;
        if (v.get(a) != simdjson::SUCCESS || a.size() != 6) return false;
        std::array<element, 6> f;
        size_t k = 0;
        for (element x : a) f[k++] = x;
        uint64_t u[5] = {};
        for (k = 0; k < 5; ++k) {
            int64_t i = 0;
            if (f[k].is_int64() && f[k].get_int64().get(i) == simdjson::SUCCESS && i >= 0)
                u[k] = static_cast<uint64_t>(i);
            else if (!(k >= 2 && f[k].is_uint64() && f[k].get_uint64().get(u[k]) == simdjson::SUCCESS))
                return false;
        }
        std::string_view device;
        if (f[5].get_string().get(device) != simdjson::SUCCESS) return false;
        out = {static_cast<int64_t>(u[0]), static_cast<int64_t>(u[1]), u[2], u[3], u[4],
               std::string(device)};
        return true;
    }

    // The tensors of one argument: one tuple, or a list of them (other elements skipped).
    static std::vector<TRef> trefs(element v) {
        std::vector<TRef> out;
        TRef t;
        dom::array a;
        if (tref(v, t)) out.push_back(std::move(t));
        else if (v.get(a) == simdjson::SUCCESS)
            for (element e : a)
                if (tref(e, t)) out.push_back(std::move(t));
        return out;
    }

    // Per argument of `vals` (an array; anything else: no arguments) its tensors.
    static std::vector<std::vector<TRef>> args(std::optional<element> vals) {
        std::vector<std::vector<TRef>> out;
        dom::array a;
        if (vals && vals->get(a) == simdjson::SUCCESS)
            for (element v : a) out.push_back(trefs(v));
        return out;
    }

    const std::string& file_;
    bool chakra_;
};

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

// The ET's nodes by id (id order = start order) and what schema they came in.
struct EtGraph {
    std::string schema;
    std::map<int64_t, EtNode> nodes;
};

// Phase 1: check the schema and normalise every node (both schemas) to EtNode.
EtGraph read_nodes(element j, const std::string& file) {
    EtGraph g;
    std::string_view schema;
    if (member(j, "schema")->get_string().get(schema) != simdjson::SUCCESS)
        throw BadInput(file, "schema: expected a string");
    g.schema = std::string(schema);
    const bool chakra = g.schema.find("chakra") != std::string::npos;
    if (!chakra && g.schema != "1.0.1")
        throw BadInput(file, fmt::format("unsupported Execution Trace schema '{}' (reads 1.0.1 "
                                         "and the Chakra-style nested schema)", g.schema));
    dom::array nodes;
    if (member(j, "nodes")->get(nodes) != simdjson::SUCCESS)
        throw BadInput(file, "nodes: expected an array");
    const NodeReader reader(file, chakra);
    size_t k = 0;
    for (element n : nodes) {
        if (!n.is_object() || !member(n, "id") || !member(n, "name"))
            throw BadInput(file, "node without id/name");
        EtNode e = reader.read(n, k++);
        g.nodes[e.id] = std::move(e);
    }
    return g;
}

// Phase 2: the segments. A segment is a node labelled "ckpt.segment:NAME"; every node belongs
// to the segment of its nearest labelled ancestor (parent / ctrl_deps chain), if any.
class SegmentLabels {
public:
    SegmentLabels(const EtGraph& g, const std::string& file) : g_(g), file_(file) {
        for (const auto& [id, n] : g.nodes)
            if (n.name.rfind(kLabel, 0) == 0) {
                index_[id] = labels_.size();
                labels_.push_back(id);
            }
        if (labels_.empty())
            throw BadInput(file, "no record_function labels 'ckpt.segment:NAME' (record the "
                                 "trace with scripts/record_trace.py --et)");
    }
    /// Label node ids in start order (one per segment).
    const std::vector<int64_t>& labels() const { return labels_; }
    size_t size() const { return labels_.size(); }
    /// The label node id of node `id`'s segment, -1 outside every segment (memoised).
    int64_t label_of(int64_t id) { return find(id, 0); }
    /// The segment index of node `id`, -1 outside every segment.
    int64_t segment_of(int64_t id) {
        const int64_t lab = label_of(id);
        return lab < 0 ? -1 : static_cast<int64_t>(index_.at(lab));
    }

private:
    int64_t find(int64_t id, int depth) {
        if (depth > 10000) throw BadInput(file_, "parent chain too deep or cyclic");
        if (auto memo = seg_of_.find(id); memo != seg_of_.end()) return memo->second;
        auto it = g_.nodes.find(id);
        int64_t r = -1;
        if (it != g_.nodes.end()) {
            if (it->second.name.rfind(kLabel, 0) == 0) r = id;
            else if (it->second.parent != id) r = find(it->second.parent, depth + 1);
        }
        seg_of_[id] = r;
        return r;
    }
    const EtGraph& g_;
    const std::string& file_;
    std::vector<int64_t> labels_;
    std::map<int64_t, size_t> index_;      // label node id -> segment index
    std::map<int64_t, int64_t> seg_of_;    // node id -> label node id (-1 none)
};

// True when node `id` is `anc` or below it on the parent chain.
bool descends(const EtGraph& g, int64_t id, int64_t anc) {
    for (int depth = 0; id >= 0 && depth < 10000; ++depth) {
        if (id == anc) return true;
        auto it = g.nodes.find(id);
        if (it == g.nodes.end() || it->second.parent == id) return false;
        id = it->second.parent;
    }
    return false;
}

// What phase 3 learns of the storages: their lifetimes (keys), where each was born, extents.
struct Storages {
    std::map<int64_t, int64_t> born;     // lifetime key -> segment index of its birth (-1 outside)
    std::map<int64_t, uint64_t> extent;  // lifetime key -> bytes
    bool born_in(int64_t storage, size_t si) const {
        auto it = born.find(storage);
        return it != born.end() && it->second == static_cast<int64_t>(si);
    }
};

// Phase 3: storage lifetimes. Storage ids are reused after a free: a storage id starts a new
// lifetime when a node outputs it without taking it as input and outside the subtree of the
// node where the current lifetime began. Every TRef.storage is rewritten to a lifetime key;
// extents skip broadcast views (their numel counts repeated elements).
Storages assign_lifetimes(EtGraph& g, SegmentLabels& segs) {
    Storages st;
    std::map<int64_t, std::pair<int64_t, int64_t>> life;  // storage id -> (key, birth node)
    int64_t next_key = 0;
    std::set<int64_t> broadcast;   // tensor ids of broadcast views (not counted in extents)
    for (auto& [id, n] : g.nodes) {
        auto parent = g.nodes.find(n.parent);
        const bool bcast_op = kBroadcastOps.count(n.name) > 0 ||
                              (n.name == "aten::as_strided" && parent != g.nodes.end() &&
                               kBroadcastOps.count(parent->second.name) > 0);
        // Tensor ids are reused after a free: an id is a broadcast view from the broadcast op
        // that outputs it until any other op outputs that id (a new tensor).
        for (const auto& a : n.outputs)
            for (const auto& t : a) {
                if (bcast_op) broadcast.insert(t.tensor);
                else if (!in_tensor_ids(n, t.tensor)) broadcast.erase(t.tensor);
            }
        const int64_t si = segs.segment_of(id);
        std::set<int64_t> in_ids;
        for (auto& a : n.inputs)
            for (auto& t : a) {
                in_ids.insert(t.storage);
                auto it = life.find(t.storage);
                if (it == life.end()) it = life.emplace(t.storage, std::make_pair(next_key++, int64_t{-1})).first;
                t.storage = it->second.first;
                if (!broadcast.count(t.tensor))
                    st.extent[t.storage] = std::max(st.extent[t.storage], t.end());
            }
        for (auto& a : n.outputs)
            for (auto& t : a) {
                auto it = life.find(t.storage);
                if (it == life.end() ||
                    (!in_ids.count(t.storage) && !descends(g, id, it->second.second))) {
                    life[t.storage] = {next_key, id};
                    st.born[next_key] = si;
                    t.storage = next_key++;
                } else {
                    t.storage = it->second.first;
                }
                if (!broadcast.count(t.tensor))
                    st.extent[t.storage] = std::max(st.extent[t.storage], t.end());
            }
    }
    return st;
}

// Per segment: its ops (top = direct children of the label), the state it writes (regions)
// and reads, RNG streams, an explicit generator, and the bytes it keeps for backward.
struct SegWork {
    std::vector<const EtNode*> ops, top;
    std::map<int64_t, std::vector<Region>> writes;
    std::set<int64_t> reads;
    std::set<std::string> rng;
    std::string explicit_generator;   // a random op given a torch.Generator
    uint64_t produced = 0;            // saved bytes (see count_saved_bytes)
};

// Phase 4: each segment's ops, writes to storages born elsewhere (= the mutable state, into
// `state`), RNG use, produced bytes; then the state each segment reads.
std::vector<SegWork> collect_segment_work(const EtGraph& g, SegmentLabels& segs,
                                          Storages& st, std::set<int64_t>& state) {
    std::vector<SegWork> work(segs.size());
    for (const auto& [id, n] : g.nodes) {
        const int64_t lab = segs.label_of(id);
        if (lab < 0 || lab == id) continue;
        SegWork& w = work[static_cast<size_t>(segs.segment_of(id))];
        w.ops.push_back(&n);
        if (n.parent == lab) w.top.push_back(&n);
    }
    for (size_t si = 0; si < work.size(); ++si) {
        SegWork& w = work[si];
        std::set<int64_t> counted;
        for (const EtNode* n : w.ops) {
            for (size_t k : written_args(*n)) {
                if (k >= n->inputs.size()) continue;
                for (const auto& tr : n->inputs[k]) {
                    if (st.born_in(tr.storage, si)) continue;
                    w.writes[tr.storage].push_back({tr.begin(), tr.end() - tr.begin()});
                    state.insert(tr.storage);
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
                    if (st.born_in(tr.storage, si) && counted.insert(tr.storage).second)
                        w.produced += st.extent[tr.storage];
        }
    }
    for (auto& w : work)
        for (const EtNode* n : w.ops)
            for (const auto& a : n->inputs)
                for (const auto& tr : a)
                    if (state.count(tr.storage)) w.reads.insert(tr.storage);
    return work;
}

// The batch: the first tensor argument of segment 0's first top-level op taking one.
const std::vector<TRef>* batch_argument(const std::vector<SegWork>& work) {
    if (work.empty()) return nullptr;
    for (const EtNode* top : work[0].top)
        if (!top->inputs.empty() && !top->inputs[0].empty()) return &top->inputs[0];
    return nullptr;
}

// Phase 5: saved bytes (what autograd keeps for backward), as the recorder counts them:
// storages the segments produced (and the batch) that nodes after the forward (the loss, the
// backward) read, each counted once: in the first later segment that takes it as an input
// (the consumer of a boundary tensor), else in the segment that produced it. Without any node
// after the forward (a forward-only trace) every storage a segment produced counts (as
// collect_segment_work left it).
void count_saved_bytes(const EtGraph& g, SegmentLabels& segs, Storages& st,
                       const std::set<int64_t>& state, std::vector<SegWork>& work) {
    std::set<int64_t> batch;
    if (const auto* b = batch_argument(work))
        for (const auto& tr : *b) batch.insert(tr.storage);
    int64_t last_forward = -1;
    for (const auto& w : work)
        for (const EtNode* n : w.ops) last_forward = std::max(last_forward, n->id);
    std::set<int64_t> used_after;
    for (const auto& [id, n] : g.nodes)
        if (id > last_forward && segs.label_of(id) < 0)
            for (const auto& a : n.inputs)
                for (const auto& tr : a) used_after.insert(tr.storage);
    if (used_after.empty()) return;
    std::map<int64_t, size_t> owner;   // storage -> segment its bytes are counted in
    for (size_t si = 0; si < work.size(); ++si)
        for (const EtNode* n : work[si].ops)
            for (const auto& a : n->inputs)
                for (const auto& tr : a) {
                    auto b = st.born.find(tr.storage);
                    const bool produced_before = b != st.born.end() && b->second >= 0 &&
                                                 static_cast<size_t>(b->second) < si;
                    if ((produced_before || batch.count(tr.storage)) && !owner.count(tr.storage))
                        owner[tr.storage] = si;
                }
    for (const auto& [key, si] : st.born)
        if (si >= 0 && !owner.count(key)) owner[key] = static_cast<size_t>(si);
    for (auto& w : work) w.produced = 0;
    for (int64_t key : used_after) {
        auto o = owner.find(key);
        if (o != owner.end() && !state.count(key)) work[o->second].produced += st.extent[key];
    }
}

// Sorted, merged regions of the written views, clipped to the storage's extent (bytes).
std::vector<Region> merge_regions(std::vector<Region> rs, uint64_t extent) {
    std::sort(rs.begin(), rs.end(), [](const Region& x, const Region& y) { return x.offset < y.offset; });
    std::vector<Region> merged;
    for (const auto& r : rs) {
        uint64_t end = std::min(r.offset + r.length, extent);
        if (r.offset >= end) continue;
        if (!merged.empty() && r.offset <= merged.back().offset + merged.back().length)
            merged.back().length =
                std::max(merged.back().offset + merged.back().length, end) - merged.back().offset;
        else merged.push_back({r.offset, end - r.offset});
    }
    return merged;
}

// Phase 6: the ckptkit trace: buffers (the state storages), per segment times (sum of the
// top-level ops' dur, else 0.01 ms per op), boundary sizes, state accesses with logical
// versions, RNG, non-replayable reason; fixed memory = 4 x the pre-existing storages read,
// except the batch.
Trace build_trace(const EtGraph& g, const SegmentLabels& segs, Storages& st,
                  const std::set<int64_t>& state, const std::vector<SegWork>& work) {
    Trace t;
    t.source = "pytorch-et " + g.schema;
    t.model = "";
    auto buffer_id = [](int64_t s) { return fmt::format("storage:{}", s); };
    for (int64_t s : state) t.buffers.push_back({buffer_id(s), st.extent[s]});
    std::map<int64_t, uint64_t> version;
    uint64_t prev_out = 0, read_only = 0;
    std::set<int64_t> read_only_seen;
    for (size_t si = 0; si < work.size(); ++si) {
        const SegWork& w = work[si];
        Segment sg;
        sg.name = g.nodes.at(segs.labels()[si]).name.substr(std::string(kLabel).size());
        double dur = 0;
        bool have_dur = !w.top.empty();
        for (const EtNode* n : w.top) {
            if (n->dur_us < 0) have_dur = false;
            else dur += n->dur_us;
        }
        sg.forward_ms = have_dur ? dur / 1000.0 : 0.01 * static_cast<double>(w.ops.size());
        sg.backward_ms = 2 * sg.forward_ms;
        uint64_t out = 0;
        if (!w.top.empty())
            for (const auto& a : w.top.back()->outputs)
                for (const auto& tr : a) out += tr.numel * tr.itemsize;
        sg.output_bytes = out;
        sg.transient_bytes = out;
        sg.saved_bytes = w.produced;
        if (si == 0)
            if (const auto* batch = batch_argument(work))
                for (const auto& tr : *batch) {
                    prev_out = tr.numel * tr.itemsize;
                    read_only_seen.insert(tr.storage);   // not fixed memory
                }
        sg.input_bytes = prev_out;
        prev_out = out;
        std::set<int64_t> touched(w.reads);
        for (const auto& [s, _] : w.writes) touched.insert(s);
        for (int64_t s : touched) {
            StateAccess a;
            a.buffer = buffer_id(s);
            a.read = w.reads.count(s) > 0;
            a.version_read = version[s];
            a.bytes_read = st.extent[s];
            if (auto wi = w.writes.find(s); wi != w.writes.end()) {
                a.written = true;
                a.version_written = ++version[s];
                a.bytes_written = st.extent[s];
                a.regions = merge_regions(wi->second, st.extent[s]);
            }
            sg.state.push_back(a);
        }
        for (const auto& stream : w.rng) sg.rng.push_back({stream, stream == "cuda" ? 16u : 5056u});
        if (!w.explicit_generator.empty())
            sg.non_replayable = w.explicit_generator + " draws from an explicit torch.Generator; "
                                "the Execution Trace does not say which (record with "
                                "scripts/record_trace.py to plan it)";
        for (const EtNode* n : w.ops)
            for (const auto& a : n->inputs)
                for (const auto& tr : a)
                    if (!st.born.count(tr.storage) && !state.count(tr.storage) &&
                        read_only_seen.insert(tr.storage).second)
                        read_only += st.extent[tr.storage];
        t.segments.push_back(std::move(sg));
    }
    t.param_bytes = read_only;
    t.grad_bytes = read_only;
    t.optimizer_bytes = 2 * read_only;
    return t;
}

}  // namespace

Trace read_execution_trace(element j, const std::string& file) {
    EtGraph g = read_nodes(j, file);
    SegmentLabels segs(g, file);
    Storages st = assign_lifetimes(g, segs);
    std::set<int64_t> state;   // lifetime keys of the mutable state
    std::vector<SegWork> work = collect_segment_work(g, segs, st, state);
    count_saved_bytes(g, segs, st, state, work);
    const Trace t = build_trace(g, segs, st, state, work);
    // Round trip through the validating reader: the imported trace obeys the same rules.
    return trace_from_json(trace_to_json(t), file);
}

}  // namespace ckpt::replay
