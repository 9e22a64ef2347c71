#include "ckpt/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "container/reader.h"

namespace ckpt {

uint64_t Report::moment_values() const { uint64_t s = 0; for (auto& r : rows) s += r.values; return s; }
uint64_t Report::escapes() const { uint64_t s = 0; for (auto& r : rows) s += r.escapes; return s; }
uint64_t Report::moment_bytes_fp32() const { uint64_t s = 0; for (auto& r : rows) s += r.bytes_fp32; return s; }
uint64_t Report::moment_bytes_out() const { uint64_t s = 0; for (auto& r : rows) s += r.bytes_out; return s; }
double Report::moment_reduction() const {
    const uint64_t f = moment_bytes_fp32();
    return f ? 1.0 - double(moment_bytes_out()) / double(f) : 0.0;
}
double Report::max_bound() const {
    double m = 0;
    for (auto& r : rows) m = std::max(m, r.max_bound);
    return m;
}

namespace {
std::string pct(uint64_t a, uint64_t b) { return b ? fmt::format("{:.3f}", 100.0 * double(a) / double(b)) : "-"; }
/// n with a comma between groups of three digits: 983,699.
std::string grouped(uint64_t n) {
    const std::string d = std::to_string(n);
    std::string s;
    for (std::size_t i = 0; i < d.size(); ++i) {
        if (i && (d.size() - i) % 3 == 0) s += ',';
        s += d[i];
    }
    return s;
}
}

int64_t Report::ulp_regime() const {
    int64_t n = -1;
    for (auto& r : rows)
        if (r.ulp_regime >= 0) n = std::max<int64_t>(n, 0) + r.ulp_regime;
    return n;
}

std::string Report::ulp_line() const {
    const int64_t n = ulp_regime();
    if (n < 0) return "";
    std::size_t unknown = 0;  // coded tensors whose theta the file does not hold
    for (auto& r : rows) unknown += r.note.empty() && r.ulp_regime < 0;
    return fmt::format("ulp regime: {} coded coordinates have |theta| > 2^23 x tolerance x lr (the parameter after a step "
                       "within tolerance x lr + 1 ulp of theta; --bound param bounds the parameter){}\n",
                       grouped(uint64_t(n)), unknown ? fmt::format("; not counted for {} tensors (parameter not in the file)", unknown) : "");
}

std::string Report::table() const {
    std::size_t w = 6;
    for (auto& r : rows) w = std::max(w, r.name.size());
    w = std::min<std::size_t>(w, 48);
    const std::string what = tool == "ckpt-verify"
                                 ? input + (output.empty() ? "" : " (original: " + output + ")")
                                 : input + " -> " + output;
    const std::string h = std::string(horizon == 0 ? " horizon=all" : horizon == 1 ? " horizon=1" : "") +
                          (bound_param ? " bound=param" : "");
    std::string s = fmt::format("{}: {}  codec={} tolerance={}{} grad_bound={}\n", tool, what,
                                codec, tolerance, h, grad_bound);
    s += fmt::format("{:<{}}  {:>12}  {:>9}  {:>11}  {:>14}\n", "tensor", w, "values", "escapes %",
                     "reduction %", "max bound (lr)");
    auto line = [&](const std::string& name, uint64_t v, uint64_t e, uint64_t f, uint64_t o, double b, const std::string& note) {
        const std::string red = f ? fmt::format("{:.2f}", 100.0 * (1.0 - double(o) / double(f))) : "-";
        s += fmt::format("{:<{}}  {:>12}  {:>9}  {:>11}  {:>14.3e}{}\n", name.substr(0, w), w, v, pct(e, v), red, b,
                         note.empty() ? "" : "  " + note);
    };
    for (auto& r : rows) line(r.name, r.values, r.escapes, r.bytes_fp32, r.bytes_out, r.max_bound, r.note);
    line("total", moment_values(), escapes(), moment_bytes_fp32(), moment_bytes_out(), max_bound(), "");
    static const char* const roles[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    if (bits.values[0]) {
        s += "bits per value:";
        for (int k = 0; k < 3; ++k)
            if (bits.values[k]) s += fmt::format(" {} {:.3f},", roles[k], bits.role[k]);
        s += fmt::format(" shared {:.3f}\n", bits.shared);
    }
    if (escapes() > 0 && escape_causes[0] + escape_causes[1] + escape_causes[2] > 0)
        s += fmt::format("escapes by cause (moment values): no code {}, certificate {}, non-finite {}\n", escape_causes[0],
                         escape_causes[1], escape_causes[2]);
    if (file_bytes_in && tool == "ckpt-restore")  // a ratio above 100% would read as a failure: say what happened
        s += fmt::format("restored {} bytes from a {}-byte container\n", grouped(file_bytes_out), grouped(file_bytes_in));
    else if (file_bytes_in)
        s += fmt::format("file: {} bytes in, {} bytes out ({:.2f}% of input)\n", file_bytes_in, file_bytes_out,
                         100.0 * double(file_bytes_out) / double(file_bytes_in));
    s += ulp_line();
    for (auto& g : groups)
        s += fmt::format("certified: {} x {}: {}, lr={} betas=({}, {}) eps={} weight_decay={} step={}{}{}\n", g.tensors,
                         g.optimizer, g.domain, g.lr, g.beta1, g.beta2, g.eps, g.weight_decay, g.step,
                         g.amsgrad ? " amsgrad" : "", g.maximize ? " maximize" : "");
    for (auto& c : checks) s += "check: " + c + "\n";
    for (auto& f : failures) s += "FAILED: " + f + "\n";
    if (ok && tool == "ckpt-verify")  // what "ok" proved: the certificates against --tolerance; the manifest's claim
        s += fmt::format("ok (certificates up to {:.4g} lr, within --tolerance {}; compressed at tolerance {})\n", max_bound(),
                         accepted_tolerance, tolerance);
    else
        s += ok ? "ok\n" : "NOT OK\n";
    return s;
}

std::string Report::json() const {
    nlohmann::json j;
    j["tool"] = tool;
    j["input"] = input;
    if (tool == "ckpt-verify") j["original"] = output.empty() ? nlohmann::json(nullptr) : nlohmann::json(output);
    else j["output"] = output;
    j["codec"] = codec;
    j["tolerance"] = tolerance;
    if (accepted_tolerance >= 0) j["accepted_tolerance"] = accepted_tolerance;
    if (horizon >= 0) j["horizon"] = horizon == 0 ? nlohmann::json("all") : nlohmann::json(horizon);
    if (horizon >= 0) j["bound"] = bound_param ? "param" : "update";
    j["grad_bound"] = std::isfinite(grad_bound) ? nlohmann::json(grad_bound) : nlohmann::json("inf");
    j["moment_values"] = moment_values();
    j["escapes"] = escapes();
    j["moment_bytes_fp32"] = moment_bytes_fp32();
    j["moment_bytes_out"] = moment_bytes_out();
    j["moment_reduction"] = moment_reduction();
    j["max_bound_lr"] = max_bound();
    if (bits.values[0]) {
        nlohmann::json b = {{"shared", bits.shared}};
        static const char* const roles[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
        for (int k = 0; k < 3; ++k)
            if (bits.values[k]) b[roles[k]] = bits.role[k];
        j["bits_per_value"] = b;
    }
    j["escape_causes"] = {{"no_code", escape_causes[0]}, {"certificate", escape_causes[1]}, {"non_finite", escape_causes[2]}};
    j["file_bytes_in"] = file_bytes_in;
    j["file_bytes_out"] = file_bytes_out;
    j["ok"] = ok;
    j["exit_code"] = ok ? 0 : 1;   // the tool's exit status (errors: apps/cli.h error object)
    j["checks"] = checks;
    j["failures"] = failures;
    if (!ok) j["error"] = failures.empty() ? std::string("a check failed") : failures.front();  // as apps/cli.h's error object
    nlohmann::json t = nlohmann::json::array();
    for (auto& r : rows)
        t.push_back({{"name", r.name}, {"shape", r.shape}, {"values", r.values}, {"escapes", r.escapes},
                     {"moment_bytes_fp32", r.bytes_fp32}, {"moment_bytes_out", r.bytes_out},
                     {"moment_reduction", r.bytes_fp32 ? 1.0 - double(r.bytes_out) / double(r.bytes_fp32) : 0.0},
                     {"max_bound_lr", r.max_bound}, {"note", r.note},
                     {"ulp_regime", r.ulp_regime >= 0 ? nlohmann::json(r.ulp_regime) : nlohmann::json(nullptr)}});
    j["tensors"] = t;
    if (tool == "ckpt-compress") j["ulp_regime"] = ulp_regime() >= 0 ? nlohmann::json(ulp_regime()) : nlohmann::json(nullptr);
    nlohmann::json gs = nlohmann::json::array();
    for (auto& g : groups)
        gs.push_back({{"optimizer", g.optimizer}, {"domain", g.domain}, {"lr", g.lr}, {"betas", {g.beta1, g.beta2}},
                      {"eps", g.eps}, {"weight_decay", g.weight_decay}, {"step", g.step}, {"amsgrad", g.amsgrad},
                      {"maximize", g.maximize}, {"tensors", g.tensors}});
    j["param_groups"] = gs;
    return j.dump(2);
}

std::vector<TensorRow> tensor_rows(const container::ContainerReader& cr) {
    const container::Manifest& man = cr.manifest();
    std::vector<TensorRow> rows;
    std::vector<double> weight;
    double total = 0;
    for (const auto& p : man.params) {
        weight.push_back(double(container::stream_bytes(p, man.codec, cr.coded_bytes(weight.size()))));
        total += weight.back();
    }
    const uint64_t bytes = cr.moment_bytes();
    for (std::size_t j = 0; j < man.params.size(); ++j) {
        const auto& p = man.params[j];
        TensorRow r;
        r.name = p.name;
        r.shape = p.shape;
        r.values = p.numel * uint64_t(p.moments());
        r.escapes = p.escapes * uint64_t(p.moments());
        r.bytes_fp32 = 4 * r.values;
        r.bytes_out = total > 0 ? uint64_t(std::llround(double(bytes) * weight[j] / total)) : 0;
        r.max_bound = p.max_bound;
        rows.push_back(r);
    }
    for (const auto& k : man.kept) {
        TensorRow r;
        r.name = k.name;
        r.values = k.values;
        r.escapes = k.values;
        r.bytes_fp32 = 4 * k.values;
        r.bytes_out = k.nbytes;
        r.note = k.note;
        rows.push_back(r);
    }
    return rows;
}

MomentBits moment_bits(const container::ContainerReader& cr) {
    MomentBits b;
    uint64_t all = 0;
    for (const auto& p : cr.manifest().params)
        for (int k = 0; k < p.moments(); ++k) b.values[std::size_t(k)] += p.numel, all += p.numel;
    for (std::size_t k = 0; k < 3; ++k)
        if (b.values[k]) b.role[k] = 8.0 * double(cr.role_bytes(k)) / double(b.values[k]);
    if (all) b.shared = 8.0 * double(cr.shared_bytes()) / double(all);
    return b;
}

std::array<uint64_t, 3> escape_causes(const container::ContainerReader& cr) {
    std::array<uint64_t, 3> c{};
    for (const auto& p : cr.manifest().params)
        for (std::size_t k = 0; k < 3; ++k) c[k] += p.escape_causes[k] * uint64_t(p.moments());
    return c;
}

std::vector<GroupRow> param_groups(const container::ContainerReader& cr) {
    const container::Manifest& man = cr.manifest();
    std::vector<GroupRow> out;
    for (const auto& p : man.params) {
        GroupRow g;
        g.optimizer = !p.domain.l2 ? (p.hyper.weight_decay != 0 ? "adamw" : "adam|adamw") : p.domain.plain ? "adam|adamw" : "adam";
        const std::string G = std::isfinite(man.grad_bound) ? fmt::format("{}", man.grad_bound) : "inf";
        if (man.horizon == 0) g.domain = "every update, any gradient sequence";  // closed_all needs no domain
        else if (!p.domain.l2 || !std::isfinite(man.grad_bound)) g.domain = "|g| <= " + G;
        else {
            const std::string shift = p.theta_storage >= 0 ? "wd*theta" : fmt::format("wd*theta, |theta| <= {:.6g}", p.domain.theta_bound);
            g.domain = p.domain.plain ? "|g| <= " + G + ", and shifted by " + shift : "|g| <= " + G + " shifted by " + shift;
        }
        g.lr = p.hyper.lr; g.beta1 = p.hyper.beta1; g.beta2 = p.hyper.beta2; g.eps = p.hyper.eps;
        g.weight_decay = p.hyper.weight_decay; g.step = p.hyper.step; g.amsgrad = p.hyper.amsgrad; g.maximize = p.hyper.maximize;
        auto same = [&](const GroupRow& x) {
            return x.optimizer == g.optimizer && x.domain == g.domain && x.lr == g.lr && x.beta1 == g.beta1 && x.beta2 == g.beta2 &&
                   x.eps == g.eps && x.weight_decay == g.weight_decay && x.step == g.step && x.amsgrad == g.amsgrad && x.maximize == g.maximize;
        };
        auto it = std::find_if(out.begin(), out.end(), same);
        if (it == out.end()) { g.tensors = 1; out.push_back(g); } else ++it->tensors;
    }
    return out;
}

}  // namespace ckpt
