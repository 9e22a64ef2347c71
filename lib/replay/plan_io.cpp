// Plan JSON, summary, SVG, budget parsing (see plan_io.h, formats/plan.md).
#include "replay/plan_io.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ckpt::replay {

using json = nlohmann::json;

namespace {
double to_ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

json regions_json(const std::vector<Region>& rs) {
    json a = json::array();
    for (const auto& r : rs) a.push_back({r.offset, r.length});
    return a;
}

// State id -> its kind ("buffer", "param", "input") as the trace lists it; built once per
// plan (a contract entry looks its state up here, not by scanning every buffer).
using Kinds = std::unordered_map<std::string_view, std::string_view>;
Kinds state_kinds(const Trace& t) {
    Kinds k;
    k.reserve(t.buffers.size());
    for (const auto& b : t.buffers) k.emplace(b.id, b.kind);
    return k;
}
std::string state_kind(const Kinds& k, const std::string& id) {
    const auto it = k.find(id);
    return it == k.end() ? "buffer" : std::string(it->second);
}

// The index of segment s's tensor argument that is state `id`, or -1.
int64_t state_arg(const Segment& s, const std::string& id) {
    for (const auto& a : s.state)
        if (a.buffer == id && a.arg >= 0) return a.arg;
    return -1;
}

json contract_json(const Kinds& kinds, const Segment& s, const Contract& c, Decision d) {
    json restore = json::array(), rng = json::array(), discard = json::array();
    if (d == Decision::Snapshot || d == Decision::Selective) {
        for (const auto& r : c.restore) {
            json o = {{"buffer", r.buffer}, {"version", r.version}, {"bytes", r.bytes},
                      {"mode", d == Decision::Snapshot ? "whole" : "regions"},
                      {"kind", state_kind(kinds, r.buffer)}};
            if (const int64_t arg = state_arg(s, r.buffer); arg >= 0) o["arg"] = arg;
            if (d == Decision::Selective) o["regions"] = regions_json(r.regions);
            restore.push_back(o);
        }
        for (const auto& g : c.rng) rng.push_back({{"stream", g.stream}, {"state_bytes", g.state_bytes}});
        for (const auto& x : c.discard) {
            json o = {{"buffer", x.buffer}, {"version_written", x.version_written},
                      {"regions", regions_json(x.regions)}, {"kind", state_kind(kinds, x.buffer)}};
            if (const int64_t arg = state_arg(s, x.buffer); arg >= 0) o["arg"] = arg;
            discard.push_back(o);
        }
    }
    return {{"id", c.id}, {"restore", restore}, {"rng", rng}, {"discard", discard}};
}

json counts_json(const PlanResult& r) {
    int n[std::size(kAllDecisions)] = {};
    for (Decision d : r.decisions) ++n[static_cast<size_t>(d)];
    json c = json::object();
    for (Decision d : kAllDecisions) c[decision_name(d)] = n[static_cast<size_t>(d)];
    return c;
}

json range_json(uint64_t fixed, const FeasibleRange& r) {
    return {{"min_peak_bytes", r.least}, {"keep_all_peak_bytes", r.keep_all},
            {"min_activation_bytes", r.least - fixed}, {"keep_all_activation_bytes", r.keep_all - fixed}};
}

// The fields a plan entry and a summary entry share.
json entry_json(const Problem& p, const PlanResult& r) {
    json b = {{"budget_bytes", r.budget_bytes}, {"feasible", r.feasible}};
    b["activation_budget_bytes"] = r.budget_bytes >= p.fixed() ? json(r.budget_bytes - p.fixed()) : json();
    b["peak_bytes"] = r.peak_bytes;
    b["activation_peak_bytes"] = r.feasible ? json(r.peak_bytes - p.fixed()) : json();
    b["step_time_ms"] = to_ms(r.step_time_ns);
    b["safe"] = r.safe;
    b["decisions"] = counts_json(r);
    return b;
}

}  // namespace

json plan_to_json(const Problem& p, const std::string& trace_path, const std::string& planner,
                  const std::vector<PlanResult>& results, const FeasibleRange& range) {
    const Kinds kinds = state_kinds(*p.trace);
    json budgets = json::array();
    for (const auto& r : results) {
        json segs = json::array();
        for (size_t i = 0; i < r.decisions.size(); ++i) {
            const Segment& sg = p.trace->segments[i];
            const bool ops = !r.saved_ops.empty() && !r.saved_ops[i].empty();
            OptionCost c = ops ? op_level_cost(p, i, r.decisions[i], r.saved_ops[i])
                               : p.cost(i, r.decisions[i]);
            json s = {{"name", sg.name},
                      {"decision", decision_name(r.decisions[i])},
                      {"held_bytes", c.held},
                      {"preserved_bytes", c.preserved}};
            json opts = json::object();
            for (Decision o : p.safe_options(i)) {
                OptionCost oc = p.cost(i, o);
                opts[decision_name(o)] = {{"held_bytes", oc.held}, {"preserved_bytes", oc.preserved},
                                          {"work_bytes", oc.work}, {"time_ms", to_ms(oc.time_ns)}};
            }
            s["options"] = opts;
            if (!sg.non_replayable.empty()) s["non_replayable"] = sg.non_replayable;
            if (!sg.ops_hash.empty()) s["ops_hash"] = sg.ops_hash;
            if (r.decisions[i] != Decision::Keep)
                s["contract"] = contract_json(kinds, sg, p.contracts[i], r.decisions[i]);
            if (ops) {   // op-level plan: the ops this recomputed segment saves (formats/plan.md)
                json so = json::array();
                for (uint32_t j : r.saved_ops[i]) {
                    const OpCost& o = sg.ops[j];
                    so.push_back({{"op", o.op}, {"k", o.k}, {"bytes", o.bytes}, {"ms", o.ms}});
                }
                s["save_ops"] = std::move(so);
            }
            segs.push_back(s);
        }
        json b = entry_json(p, r);
        b["exact"] = r.exact;
        b["unsafe"] = r.unsafe;
        b["segments"] = segs;
        if (!r.feasible) b["min_peak_bytes"] = r.min_peak_bytes;
        if (!r.exact) b["quantum_bytes"] = r.quantum_bytes;
        if (r.fallback) b["fallback"] = "eager";
        budgets.push_back(b);
    }
    json out = {{"format", "ckptkit-plan"},
                {"format_version", kPlanFormatVersion},
                {"trace", {{"path", trace_path}, {"hash", p.trace->hash},
                           {"hash_algorithm", kTraceHashAlgorithm}, {"model", p.trace->model},
                           {"segments", p.size()}, {"fixed_bytes", p.fixed()}}},
                {"fixed_bytes", p.fixed()},
                {"range", range_json(p.fixed(), range)},
                {"planner", planner},
                {"budgets", budgets}};
    if (!p.trace->fingerprint.empty()) out["fingerprint"] = p.trace->fingerprint;
    return out;
}

json summary_json(const Problem& p, const std::string& planner, const std::vector<PlanResult>& results,
                  const FeasibleRange& range) {
    json budgets = json::array();
    for (const auto& r : results) budgets.push_back(entry_json(p, r));
    return {{"planner", planner}, {"fixed_bytes", p.fixed()}, {"range", range_json(p.fixed(), range)},
            {"budgets", budgets}};
}

std::string sweep_svg(const std::vector<std::pair<std::string, std::vector<PlanResult>>>& curves,
                      const std::string& title) {
    const double W = 720, H = 440, L = 80, R = 150, T = 40, B = 60;
    double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
    for (const auto& [name, rs] : curves)
        for (const auto& r : rs) {
            xmin = std::min(xmin, static_cast<double>(r.budget_bytes));
            xmax = std::max(xmax, static_cast<double>(r.budget_bytes));
            if (r.feasible) {
                ymin = std::min(ymin, to_ms(r.step_time_ns));
                ymax = std::max(ymax, to_ms(r.step_time_ns));
            }
        }
    if (xmin > xmax) xmin = 0, xmax = 1;
    // Budget axis in the binary unit that makes the largest budget >= 1 (B, KiB, ... TiB).
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double scale = 1;
    while (u < 4 && xmax / (scale * 1024) >= 1) scale *= 1024, ++u;
    xmin /= scale, xmax /= scale;
    if (xmax == xmin) xmax = xmin + 1;
    if (ymin > ymax) ymin = 0, ymax = 1;
    double pad = (ymax - ymin) * 0.05 + 1e-9;
    ymin -= pad, ymax += pad;
    auto X = [&](double v) { return L + (v - xmin) / (xmax - xmin) * (W - L - R); };
    auto Y = [&](double v) { return H - B - (v - ymin) / (ymax - ymin) * (H - T - B); };
    const char* colors[] = {"#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f", "#9467bd"};
    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
        "fill=\"white\"/>\n<text x=\"{}\" y=\"24\" font-size=\"14\">{}</text>\n",
        W, H, L, xml_escape(title));
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, T, L, H - B);
    // Ticks: enough decimals that neighbouring labels differ.
    const int xdec = std::clamp(static_cast<int>(std::ceil(-std::log10((xmax - xmin) / 5))) + 1, 0, 6);
    for (int k = 0; k <= 5; ++k) {
        double xv = xmin + (xmax - xmin) * k / 5, yv = ymin + (ymax - ymin) * k / 5;
        s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.{}f}</text>\n", X(xv), H - B + 18, xv, xdec);
        s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.4g}</text>\n", L - 6, Y(yv) + 4, yv);
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">budget ({})</text>\n", (L + W - R) / 2, H - 15, units[u]);
    s += fmt::format("<text x=\"20\" y=\"{}\" transform=\"rotate(-90 20 {})\" text-anchor=\"middle\">"
                     "predicted step time (ms)</text>\n", (T + H - B) / 2, (T + H - B) / 2);
    // Curves from widest to thinnest stroke, each with its own dash pattern, so planners whose
    // plans coincide stay visible as nested lines. Unsafe plans: open circles (class unsafe);
    // infeasible budgets: an x per planner just above the budget axis (class oom).
    const char* dashes[] = {"", "8 3", "3 3", "1 3", "10 2 2 2", "4 1"};
    for (size_t c = 0; c < curves.size(); ++c) {
        const char* col = colors[c % 6];
        const double width = std::max(1.0, 7.0 - 1.5 * static_cast<double>(c));
        std::string pts;
        auto flush = [&]() {
            if (!pts.empty())
                s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{:.1f}\" "
                                 "stroke-opacity=\"0.8\" stroke-dasharray=\"{}\" points=\"{}\"/>\n",
                                 col, width, dashes[c % 6], pts);
            pts.clear();
        };
        std::string marks;
        for (const auto& r : curves[c].second) {
            double x = X(static_cast<double>(r.budget_bytes) / scale);
            if (!r.feasible) {
                flush();
                marks += fmt::format("<text class=\"oom\" x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\" "
                                     "text-anchor=\"middle\">x</text>\n", x, H - B - 4 - 10.0 * c, col);
                continue;
            }
            double y = Y(to_ms(r.step_time_ns));
            pts += fmt::format("{:.1f},{:.1f} ", x, y);
            marks += r.safe ? fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", x, y, col)
                            : fmt::format("<circle class=\"unsafe\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" "
                                          "fill=\"white\" stroke=\"{}\" stroke-width=\"1.5\"/>\n", x, y, col);
        }
        flush();
        s += marks;
        s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", W - R + 10, T + 16 * (c + 1), col,
                         xml_escape(curves[c].first));
    }
    const double ly = T + 16 * (static_cast<double>(curves.size()) + 2);
    s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"10\">o = unsafe plan</text>\n", W - R + 10, ly);
    s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"10\">x = out of memory</text>\n", W - R + 10, ly + 14);
    s += "</svg>\n";
    return s;
}

uint64_t parse_bytes(const std::string& s) {
    size_t pos = 0;
    double v;
    try {
        v = std::stod(s, &pos);
    } catch (const std::exception&) {
        throw std::invalid_argument("not a size: '" + s + "'");
    }
    // the unit after optional spaces, in any case ("8 MiB", "1.5mib"); spaces after it too
    std::string unit = s.substr(pos);
    unit.erase(0, unit.find_first_not_of(" \t"));
    unit.erase(unit.find_last_not_of(" \t") + 1);
    for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
    static const std::map<std::string, double> units = {
        {"", 1},         {"b", 1},         {"k", 1e3},         {"kb", 1e3},
        {"m", 1e6},      {"mb", 1e6},      {"g", 1e9},         {"gb", 1e9},
        {"t", 1e12},     {"tb", 1e12},     {"kib", 1024.0},    {"mib", 1048576.0},
        {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
    auto it = units.find(unit);
    if (it == units.end() || !std::isfinite(v) || v < 0)
        throw std::invalid_argument("not a size: '" + s + "' (use e.g. 44GiB, 32GB, 512MiB)");
    double b = std::round(v * it->second);
    if (b >= 1.8e19) throw std::invalid_argument("size too large: '" + s + "'");
    return static_cast<uint64_t>(b);
}

std::vector<uint64_t> parse_sweep(const std::string& s) {
    auto a = s.find(':'), b = s.find(':', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos)
        throw std::invalid_argument("sweep must be MIN:MAX:STEP, got '" + s + "'");
    uint64_t lo = parse_bytes(s.substr(0, a)), hi = parse_bytes(s.substr(a + 1, b - a - 1)),
             step = parse_bytes(s.substr(b + 1));
    if (step == 0 || lo > hi) throw std::invalid_argument("sweep needs MIN <= MAX and STEP > 0");
    if ((hi - lo) / step >= 10000) throw std::invalid_argument("sweep has more than 10000 points");
    std::vector<uint64_t> out;
    for (uint64_t v = lo; v <= hi; v += step) out.push_back(v);
    return out;
}

std::string human_bytes(uint64_t b) {
    const char* u[] = {"KiB", "MiB", "GiB", "TiB"};
    if (b < 1024) return fmt::format("{} B", b);
    double v = static_cast<double>(b);
    int k = -1;
    while (v >= 1024 && k < 3) v /= 1024, ++k;
    return fmt::format("{:.2f} {}", v, u[k]);
}

std::string xml_escape(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default: out += c;
        }
    }
    return out;
}

}  // namespace ckpt::replay
