// Folder mode (folder.h): the three jobs over a tree of files, shared among the ranks of a
// Comm, built on the single-file compress / verify / restore of pipeline.h.
#include "folder/folder.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "container/reader.h"
#include "folder/dcp.h"
#include "folder/files.h"
#include "common/cleanup.h"
#include "common/error.h"
#include "common/file.h"
#include "common/json_num.h"
#include "io/file.h"
#include "io/torch_file.h"

#ifndef CKPTKIT_VERSION
#error "CKPTKIT_VERSION must be defined (lib/folder/CMakeLists.txt)"
#endif

namespace ckpt::folder {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSuffix = ".ckz.h5";

// ---------------------------------------------------------------- manifest

/// One manifest entry (formats/folder.md).
struct Entry {
    std::string path;       ///< relative path of the original file
    std::string stored;     ///< relative path in the compressed folder
    bool container = false;
    uint64_t size = 0, xxh3 = 0;                 ///< of the stored file
    uint64_t source_size = 0, source_xxh3 = 0;   ///< of the original file
    json extra = json::object();   ///< DCP keys: "virtual" (gathered moments), "shell", "moments", "cuts"
    bool is_virtual() const { return extra.value("virtual", false); }
    bool is_shell() const { return extra.value("shell", false); }
    /// Bytes per `xxh3_units` hash, 0 where the entry has none (formats/folder.md).
    uint64_t hash_unit() const { return extra.contains("xxh3_units") ? extra.at("xxh3_unit").get<uint64_t>() : 0; }
    /// The `xxh3_units` hashes (empty where the entry has none).
    std::vector<uint64_t> unit_hashes() const {
        std::vector<uint64_t> v;
        if (extra.contains("xxh3_units"))
            for (const auto& h : extra.at("xxh3_units")) v.push_back(parse_hex64(h.get<std::string>()));
        return v;
    }
};

/// DCP files torch reads in place (shells, copied `.distcp` files) are hashed per this many
/// bytes as well (`xxh3_units`), so that a rank checks the pieces it reads, not every
/// file another rank's items are in.
constexpr uint64_t kHashUnit = uint64_t(4) << 20;

/// Whether n hashes of `unit`-byte pieces cover a file of `size` bytes: one per piece.
bool units_cover(uint64_t size, uint64_t unit, uint64_t n) { return unit > 0 && n == size / unit + (size % unit != 0); }

/// The manifest keys `xxh3_unit`, `xxh3_units` of a digest taken with kHashUnit.
json units_json(const Digest& d) {
    json h = json::array();
    for (uint64_t x : d.units) h.push_back(hex64(x));
    return json{{"xxh3_unit", kHashUnit}, {"xxh3_units", h}};
}

/// "xxh3 of bytes A..B GOT differs from the manifest's WANT" for piece k of `unit` bytes of a
/// stored file of `size` bytes (verify, restore and the reader's piece checks).
std::string unit_differs(uint64_t size, uint64_t unit, uint64_t k, const std::string& got, uint64_t want) {
    return fmt::format("xxh3 of bytes {}..{} {} differs from the manifest's {}", k * unit, std::min(size, (k + 1) * unit), got,
                       hex64(want));
}

/// "" when digest `d` of entry e's stored file matches its `xxh3_units` (or it has none),
/// else what differs.
std::string units_differ(const Entry& e, const Digest& d) {
    const std::vector<uint64_t> want = e.unit_hashes();
    for (std::size_t k = 0; k < want.size(); ++k)
        if (k >= d.units.size() || d.units[k] != want[k])
            return unit_differs(e.size, e.hash_unit(), k, k < d.units.size() ? hex64(d.units[k]) : "(none)", want[k]);
    return "";
}

struct Manifest {
    std::string source;               ///< name of the input folder
    std::vector<Layout> layouts;
    std::vector<std::string> dirs;
    std::vector<Entry> files;         ///< sorted by path
    std::string save_dir;             ///< version 2: "ckptkit-<tag>", the folder of every stored file but .metadata
};

json layout_json(const Layout& l) { return {{"kind", l.kind}, {"dir", l.dir}, {"evidence", l.evidence}, {"note", l.note}}; }
Layout layout_from(const json& j) {
    return {j.at("kind").get<std::string>(), j.at("dir").get<std::string>(), j.value("evidence", ""), j.value("note", "")};
}

void write_manifest(const std::string& dir, const Manifest& m) {
    json j{{"format", kManifestFormat}, {"version", m.save_dir.empty() ? kManifestVersion : 2}, {"tool_version", CKPTKIT_VERSION},
           {"source", m.source}, {"dirs", m.dirs}};
    if (!m.save_dir.empty()) j["save_dir"] = m.save_dir;
    j["layouts"] = json::array();
    for (auto& l : m.layouts) j["layouts"].push_back(layout_json(l));
    j["files"] = json::array();
    for (auto& e : m.files) {
        json f{{"path", e.path}, {"stored", e.stored}, {"container", e.container}, {"size", e.size},
               {"xxh3", hex64(e.xxh3)}, {"source_size", e.source_size}, {"source_xxh3", hex64(e.source_xxh3)}};
        for (auto it = e.extra.begin(); it != e.extra.end(); ++it) f[it.key()] = it.value();
        j["files"].push_back(f);
    }
    const std::string text = j.dump(1) + "\n";
    const std::string path = join(dir, kManifestName);
    try {
        write_text_atomic(path, text);
    } catch (const std::exception& e) {
        throw BadInput(path, e.what());
    }
}

/// Read and check OUT_DIR's manifest: every path relative, inside, unique. Throws BadInput.
Manifest read_manifest(const std::string& dir) {
    const std::string path = join(dir, kManifestName);
    if (!fs::is_regular_file(path))
        throw BadInput(dir, std::string("not a ckptkit folder (no ") + kManifestName + "); pass the folder ckpt-compress wrote");
    Manifest m;
    try {
        const io::InputFile f(path);
        if (f.size() > (256u << 20)) throw BadInput(path, "manifest over 256 MiB");
        const json j = json::parse(f.read_string(0, std::size_t(f.size()), "manifest"));
        if (j.at("format").get<std::string>() != kManifestFormat) throw BadInput(path, "not a ckptkit folder manifest");
        const int version = json_int(j, "version");
        if (version != kManifestVersion && version != 2)
            throw BadInput(path, fmt::format("manifest version {} (this tool reads {} and 2)", version, kManifestVersion));
        if (version == 2) {
            m.save_dir = j.at("save_dir").get<std::string>();
            if (!dcp_save_folder(m.save_dir)) throw BadInput(path, "manifest save_dir is not ckptkit-<16 hex digits>: " + m.save_dir);
        }
        m.source = j.value("source", "");
        for (auto& l : j.at("layouts")) m.layouts.push_back(layout_from(l));
        for (auto& d : j.at("dirs")) m.dirs.push_back(d.get<std::string>());
        for (auto& e : j.at("files")) {
            m.files.push_back({e.at("path").get<std::string>(), e.at("stored").get<std::string>(), e.at("container").get<bool>(),
                               json_count(e, "size"), parse_hex64(e.at("xxh3").get<std::string>()),
                               json_count(e, "source_size"), parse_hex64(e.at("source_xxh3").get<std::string>())});
            for (const char* k : {"virtual", "files", "shell", "moments", "cuts", "dcp_metadata", "megatron_common", "xxh3_unit",
                                  "xxh3_units"})
                if (e.contains(k)) m.files.back().extra[k] = e.at(k);
            const Entry& got = m.files.back();
            if (got.is_shell()) (void)cuts_from(got.extra.at("cuts"));   // validate
            if (e.contains("xxh3_units")) {   // validate: one hash per unit of the stored file
                if (!units_cover(got.size, json_count(e, "xxh3_unit"), e.at("xxh3_units").size()))
                    throw BadInput(path, "manifest xxh3_units of " + got.stored + " do not cover its size");
                (void)got.unit_hashes();
            }
        }
    } catch (const BadInput&) {
        throw;
    } catch (const std::exception& e) {
        throw BadInput(path, std::string("malformed manifest: ") + e.what());
    }
    std::set<std::string> seen;
    auto safe = [&](const std::string& p) {
        const fs::path q(p);
        if (p.empty() || q.is_absolute() || p.find('\\') != std::string::npos ||
            std::any_of(q.begin(), q.end(), [](const fs::path& c) { return c == ".." || c == "."; }))
            throw BadInput(path, "manifest path outside the folder: " + p);
    };
    for (auto& d : m.dirs) safe(d);
    for (auto& e : m.files) {
        safe(e.path);
        safe(e.stored);
        const std::string name = e.container ? e.path + kSuffix : e.is_shell() ? e.path + kShellSuffix : e.path;
        if (e.stored != (m.save_dir.empty() || e.extra.value("dcp_metadata", false) ? name : m.save_dir + "/" + name))
            throw BadInput(path, "manifest entry with a wrong stored name: " + e.stored);
        if (e.is_shell()) safe(e.extra.value("moments", std::string()));
        if (!seen.insert(e.path).second) throw BadInput(path, "manifest lists a file twice: " + e.path);
    }
    return m;
}

// ---------------------------------------------------------------- rows across ranks

json row_json(const FileRow& r) {
    json j{{"file", r.file}, {"stored", r.stored}, {"action", r.action}, {"layout", r.layout},
           {"bytes_in", r.bytes_in}, {"bytes_out", r.bytes_out}, {"moment_values", r.moment_values},
           {"escapes", r.escapes}, {"moment_bytes_fp32", r.moment_bytes_fp32}, {"moment_bytes_out", r.moment_bytes_out},
           {"moment_reduction", r.moment_bytes_fp32 ? 1.0 - double(r.moment_bytes_out) / double(r.moment_bytes_fp32) : 0.0},
           {"max_bound_lr", r.max_bound}, {"ok", r.ok}, {"note", r.note}, {"virtual_input", r.virtual_input},
           {"xxh3", hex64(r.xxh3)}, {"source_xxh3", hex64(r.source_xxh3)}};
    j["extra"] = r.manifest_extra.empty() ? json::object() : json::parse(r.manifest_extra);
    j["report"] = r.report_json.empty() ? json(nullptr) : json::parse(r.report_json);
    return j;
}
FileRow row_from(const json& j) {
    FileRow r;
    r.file = j.at("file");
    r.stored = j.at("stored");
    r.action = j.at("action");
    r.layout = j.at("layout");
    r.bytes_in = j.at("bytes_in");
    r.bytes_out = j.at("bytes_out");
    r.moment_values = j.at("moment_values");
    r.escapes = j.at("escapes");
    r.moment_bytes_fp32 = j.at("moment_bytes_fp32");
    r.moment_bytes_out = j.at("moment_bytes_out");
    r.max_bound = j.at("max_bound_lr");
    r.ok = j.at("ok");
    r.note = j.at("note");
    r.virtual_input = j.at("virtual_input");
    r.xxh3 = parse_hex64(j.at("xxh3"));
    r.source_xxh3 = parse_hex64(j.at("source_xxh3"));
    if (!j.at("report").is_null()) r.report_json = j.at("report").dump();
    if (!j.at("extra").empty()) r.manifest_extra = j.at("extra").dump();
    return r;
}

/// The error one rank met, as every rank will rethrow it.
struct Failure {
    int code = 0;            ///< 0 none, kExitBadInput, kExitCheckFailed
    std::string file, what;
    json to_json() const { return {{"code", code}, {"file", file}, {"what", what}}; }
    static Failure from(const json& j) { return {json_int(j, "code"), j.at("file").get<std::string>(), j.at("what").get<std::string>()}; }
    /// Run f; its exception (BadInput: exit 2 naming the file, CheckFailed: 1, any other: 2)
    /// as a Failure, code 0 when it returned.
    static Failure of(const std::function<void()>& f) {
        try {
            f();
        } catch (const BadInput& e) {
            return {kExitBadInput, e.file, e.what()};
        } catch (const CheckFailed& e) {
            return {kExitCheckFailed, "", e.what()};
        } catch (const std::exception& e) {
            return {kExitBadInput, "", e.what()};
        }
        return {};
    }
    [[noreturn]] void raise() const {
        if (code == kExitCheckFailed) throw CheckFailed(file.empty() ? what : file + ": " + what);
        throw BadInput(file, what);
    }
};

/// Run `f` (on rank 0 only when `root_only`), then agree: when any rank failed, every rank
/// throws the failure of the lowest failing rank. Keeps the ranks' collectives in step.
void agree(Comm& c, bool root_only, const std::function<void()>& f) {
    const Failure fail = (!root_only || c.rank() == 0) ? Failure::of(f) : Failure{};
    for (const auto& s : c.allgather(fail.to_json().dump())) {
        const Failure g = Failure::from(json::parse(s));
        if (g.code) g.raise();
    }
}

// ---------------------------------------------------------------- output and scratch folders

/// Create `tmp` and every sub-folder of the tree in it.
void make_dirs(const std::string& tmp, const std::vector<std::string>& dirs) {
    std::error_code ec;
    temp_note(tmp, true);  // removed if a signal ends the process (common/cleanup.h); noted before it exists
    if (!fs::create_directory(tmp, ec) || ec) {
        temp_forget(tmp);
        throw BadInput(tmp, "cannot create the temporary folder: " + ec.message());
    }
    for (const auto& d : dirs)
        if (fs::create_directories(join(tmp, d), ec); ec) throw BadInput(join(tmp, d), "cannot create folder: " + ec.message());
}

void remove_tree(const std::string& p) {
    std::error_code ec;
    fs::remove_all(p, ec);
    temp_forget(p);
}

/// Where a job writes: nothing (verify: both paths empty), or the temporary sibling `tmp`
/// of the output folder `out`, renamed onto it at the very end (compress, restore).
struct Output {
    std::string tmp, out;

    /// The output of compress / restore: `tmp` named by rank 0 (temp_sibling) for every
    /// rank and created by rank 0 with the sub-folders `dirs`. Throws on every rank when it
    /// cannot be created (BadInput naming it).
    static Output open(Comm& c, const std::string& out, const std::vector<std::string>& dirs) {
        Output o{c.broadcast(temp_sibling(out, long(::getpid()))), out};
        agree(c, true, [&] { make_dirs(o.tmp, dirs); });
        return o;
    }
    /// Rank 0's clean-up after a failed work unit: the temporary folder goes (verify: nothing).
    void discard() const {
        if (!tmp.empty()) remove_tree(tmp);
    }
    /// The end of a job that writes: rank 0 runs `seal` (compress: the manifest, written into
    /// `tmp`), then commit_folder(tmp, out); on any failure the temporary folder goes and
    /// every rank throws that failure.
    void commit(Comm& c, const std::function<void()>& seal = {}) const {
        agree(c, true, [&] {
            try {
                if (seal) seal();
                commit_folder(tmp, out);
            } catch (...) {
                remove_tree(tmp);
                throw;
            }
        });
    }
};

/// A work unit's scratch folder (DCP moments gathered, re-gathered or restored): created
/// empty (an old one of that name removed), noted for removal on a signal, and removed when
/// the unit ends, however it ends. Throws std::filesystem::filesystem_error when it cannot
/// be created.
class Scratch {
public:
    explicit Scratch(std::string path) : path_(std::move(path)) {
        remove_tree(path_);
        temp_note(path_, true);
        try {
            fs::create_directories(path_);
        } catch (...) {
            remove_tree(path_);
            throw;
        }
    }
    ~Scratch() { remove_tree(path_); }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

/// A piece of compress's work given to one rank: one file, or (dcp) moment-holding .distcp
/// files of the DCP folder dcp_dir.
struct Unit {
    bool dcp = false;
    std::string dcp_dir;              ///< DCP: the folder, relative to the input root ("" = the root)
    std::vector<std::string> files;   ///< relative to the input root
    uint64_t weight = 0;              ///< bytes
    std::size_t index = 0;            ///< DCP: unit number in its folder (dcp_moments_name)
};

/// Owner rank of each item: longest processing time first (items by weight, descending,
/// ties by index), each to the least-loaded rank (ties: the lowest). Same on every rank.
std::vector<int> share(const std::vector<uint64_t>& weights, int ranks) {
    std::vector<std::size_t> order(weights.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return weights[a] > weights[b]; });
    std::vector<uint64_t> load(std::size_t(ranks), 0);
    std::vector<int> owner(weights.size(), 0);
    for (std::size_t i : order) {
        const auto r = std::size_t(std::min_element(load.begin(), load.end()) - load.begin());
        owner[i] = int(r);
        load[r] += weights[i] + 4096;   // + a per-file cost, so many empty files spread too
    }
    return owner;
}

/// Run `job(i)` (the rows of work unit i: one file, or a DCP folder's moment files) for this
/// rank's units (units shared by `weights`, bytes), then gather every rank's rows (sorted by
/// file). A rank stops at its first failure; afterwards every rank throws the failure with
/// the smallest file name (after rank 0 ran output.discard()).
std::vector<FileRow> run_shared(Comm& c, const std::vector<uint64_t>& weights,
                                const std::function<std::vector<FileRow>(std::size_t)>& job,
                                const Output& output, bool progress) {
    const std::vector<int> owner = share(weights, c.size());
    json mine{{"rows", json::array()}, {"failure", nullptr}};
    const std::size_t my_count = std::size_t(std::count(owner.begin(), owner.end(), c.rank()));
    std::size_t done = 0;
    for (std::size_t i = 0; i < weights.size(); ++i) {
        if (owner[i] != c.rank()) continue;
        const Failure fail = Failure::of([&] {
            ++done;
            for (const FileRow& r : job(i)) {
                mine["rows"].push_back(row_json(r));
                if (progress)
                    spdlog::info("[{}/{}]{} {} {}", done, my_count, c.size() > 1 ? fmt::format(" rank {}", c.rank()) : "", r.action, r.file);
            }
        });
        if (fail.code) {
            mine["failure"] = fail.to_json();
            break;
        }
    }
    std::vector<FileRow> rows;
    std::optional<Failure> first;
    for (const auto& s : c.allgather(mine.dump())) {
        const json j = json::parse(s);
        for (auto& r : j.at("rows")) rows.push_back(row_from(r));
        if (!j.at("failure").is_null()) {
            const Failure f = Failure::from(j.at("failure"));
            if (!first || f.file < first->file) first = f;
        }
    }
    if (first) {
        agree(c, true, [&] { output.discard(); });
        first->raise();
    }
    std::sort(rows.begin(), rows.end(), [](const FileRow& a, const FileRow& b) { return a.file < b.file; });
    return rows;
}

// ---------------------------------------------------------------- per-file work

/// The layout a file belongs to: the one of its own folder, else of the nearest parent.
std::string layout_of(const std::vector<Layout>& ls, const std::string& file) {
    std::string best;
    std::size_t depth = 0;
    for (const auto& l : ls) {
        const bool under = l.dir.empty() || file.rfind(l.dir + "/", 0) == 0;
        if (under && (best.empty() || l.dir.size() + 1 > depth)) {
            best = l.kind;
            depth = l.dir.size() + 1;
        }
    }
    return best;
}

/// Files a layout says hold optimizer state: an error reading them fails the run instead
/// of copying them.
bool declared_optimizer(const std::vector<Layout>& ls, const std::string& file) {
    const std::string dir = parent_of(file), base = base_of(file);
    for (const auto& l : ls) {
        if (l.dir != dir) continue;
        if (l.kind == "hf-trainer" && base == "optimizer.pt") return true;
        if (l.kind == "deepspeed-zero" && base.ends_with("optim_states.pt")) return true;
        if (l.kind == "megatron" && base == "distrib_optim.pt") return true;
    }
    return false;
}

/// First bytes say torch.save (zip or legacy) or safetensors; or a checkpoint extension.
bool looks_like_checkpoint(const std::string& path) {
    for (const char* e : {".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".distcp"})
        if (path.ends_with(e)) return true;
    const io::InputFile f(path);
    if (f.size() >= 4 && f.u32(0, "magic") == 0x04034b50u) return true;   // "PK\3\4"
    if (f.size() >= 9) {
        const uint64_t n = f.u64(0, "safetensors header size");
        if (n > 1 && n <= f.size() - 8 && f.read_string(8, 1, "header") == "{") return true;
    }
    return io::is_torch_legacy(f);
}

/// A row's moment figures and embedded report from a single-file Report; the report names
/// the final paths `in` and `out` (not the temporary folder's).
void fill_from(FileRow& r, const Report& rep, const std::string& in, const std::string& out) {
    r.moment_values = rep.moment_values();
    r.escapes = rep.escapes();
    r.moment_bytes_fp32 = rep.moment_bytes_fp32();
    r.moment_bytes_out = rep.moment_bytes_out();
    r.max_bound = rep.max_bound();
    r.ok = rep.ok;
    json j = json::parse(rep.json());
    j["input"] = in;
    if (j.contains("output")) j["output"] = out;
    r.report_json = j.dump();
}

std::string folder_name(const std::string& p) {
    fs::path q = fs::path(p).lexically_normal();
    if (q.filename().empty()) q = q.parent_path();
    return q.filename().string();
}

FolderReport new_report(const char* tool, const std::string& in, const std::string& out, Comm& c) {
    FolderReport rep;
    rep.tool = tool;
    rep.input = in;
    rep.output = out;
    rep.ranks = c.size();
    return rep;
}

}  // namespace

// ---------------------------------------------------------------- report

uint64_t FolderReport::bytes_in() const { uint64_t s = 0; for (auto& f : files) s += f.virtual_input ? 0 : f.bytes_in; return s; }
uint64_t FolderReport::bytes_out() const { uint64_t s = 0; for (auto& f : files) s += f.bytes_out; return s; }

std::string FolderReport::table() const {
    uint64_t mv = 0, esc = 0, mf = 0, mo = 0;
    double mb = 0;
    for (auto& f : files) {
        mv += f.moment_values; esc += f.escapes; mf += f.moment_bytes_fp32; mo += f.moment_bytes_out;
        mb = std::max(mb, f.max_bound);
    }
    const std::string what = tool == "ckpt-verify" ? input + (output.empty() ? "" : " (original: " + output + ")")
                                                   : input + " -> " + output;
    std::string s = fmt::format("{}: folder {}  ranks={}", tool, what, ranks);
    if (!codec.empty()) s += fmt::format(" codec={} tolerance={} grad_bound={}", codec, tolerance, grad_bound);
    s += "\n";
    for (auto& l : layouts)
        s += fmt::format("layout: {} in {} ({}){}\n", l.kind, l.dir.empty() ? "." : l.dir + "/", l.evidence,
                         l.note.empty() ? "" : "; " + l.note);
    std::size_t w = 5;
    for (auto& f : files) w = std::max(w, f.file.size());
    w = std::min<std::size_t>(w, 60);
    s += fmt::format("{:<{}}  {:<10}  {:>14}  {:>14}  {:>11}  {:>9}  {:>14}\n", "file", w, "action", "bytes in", "bytes out",
                     "reduction %", "escapes %", "max bound (lr)");
    auto line = [&](const std::string& name, const std::string& action, uint64_t bi, uint64_t bo, uint64_t v, uint64_t e,
                    uint64_t f, uint64_t o, double b, const std::string& note) {
        const std::string red = f ? fmt::format("{:.2f}", 100.0 * (1.0 - double(o) / double(f))) : "-";
        const std::string ep = v ? fmt::format("{:.3f}", 100.0 * double(e) / double(v)) : "-";
        const std::string bs = f ? fmt::format("{:.3e}", b) : "-";
        s += fmt::format("{:<{}}  {:<10}  {:>14}  {:>14}  {:>11}  {:>9}  {:>14}{}\n", name.substr(0, w), w, action, bi, bo, red,
                         ep, bs, note.empty() ? "" : "  " + note);
    };
    for (auto& f : files)
        line(f.file, f.action, f.bytes_in, f.bytes_out, f.moment_values, f.escapes, f.moment_bytes_fp32, f.moment_bytes_out,
             f.max_bound, f.note);
    line("total", fmt::format("{} files", files.size()), bytes_in(), bytes_out(), mv, esc, mf, mo, mb, "");
    for (auto& n : notes) s += "note: " + n + "\n";
    for (auto& f : failures) s += "FAILED: " + f + "\n";
    s += ok ? "ok\n" : "NOT OK\n";
    return s;
}

std::string FolderReport::json() const {
    nlohmann::json j{{"tool", tool}, {"input", input}, {"folder", true}, {"ranks", ranks}, {"ok", ok}, {"exit_code", ok ? 0 : 1}};
    if (tool == "ckpt-verify") j["original"] = output.empty() ? nlohmann::json(nullptr) : nlohmann::json(output);
    else j["output"] = output;
    if (!codec.empty()) {
        j["codec"] = codec;
        j["tolerance"] = tolerance;
        j["grad_bound"] = std::isfinite(grad_bound) ? nlohmann::json(grad_bound) : nlohmann::json("inf");
    }
    uint64_t mv = 0, esc = 0, mf = 0, mo = 0, containers = 0;
    double mb = 0;
    j["files"] = nlohmann::json::array();
    for (auto& f : files) {
        mv += f.moment_values; esc += f.escapes; mf += f.moment_bytes_fp32; mo += f.moment_bytes_out;
        mb = std::max(mb, f.max_bound);
        containers += f.report_json.empty() ? 0 : 1;
        nlohmann::json r = row_json(f);
        r.erase("xxh3");
        r.erase("source_xxh3");
        r.erase("extra");
        j["files"].push_back(r);
    }
    j["layouts"] = nlohmann::json::array();
    for (auto& l : layouts) j["layouts"].push_back(layout_json(l));
    j["file_count"] = files.size();
    j["container_count"] = containers;
    j["file_bytes_in"] = bytes_in();
    j["file_bytes_out"] = bytes_out();
    j["moment_values"] = mv;
    j["escapes"] = esc;
    j["moment_bytes_fp32"] = mf;
    j["moment_bytes_out"] = mo;
    j["moment_reduction"] = mf ? 1.0 - double(mo) / double(mf) : 0.0;
    j["max_bound_lr"] = mb;
    j["failures"] = failures;
    j["notes"] = notes;
    return j.dump();
}

bool is_folder(const std::string& path) {
    std::error_code ec;
    return fs::is_directory(path, ec);
}

// ---------------------------------------------------------------- compress

namespace {

/// compress_folder's checks before any work (on every rank, agreed): the input a folder, the
/// output allowed (check_output_folder), no input file named like folder mode's output.
/// Returns the input tree; sets rep.layouts. Throws BadInput.
Tree check_compress_input(Comm& c, const std::string& in, const std::string& out, bool force, FolderReport& rep) {
    Tree tree;
    agree(c, false, [&] {
        if (!is_folder(in)) throw BadInput(in, "not a folder");
        check_output_folder(in, out, force);
        tree = list_tree(in);
        std::set<std::string> names(tree.files.begin(), tree.files.end());
        for (const auto& f : tree.files)
            if (f == kManifestName || names.count(f + kSuffix) || names.count(f + kShellSuffix) ||
                base_of(f).rfind(kDcpMomentsPrefix, 0) == 0)
                throw BadInput(join(in, f), "its name is taken by folder mode's output (" + std::string(kManifestName) + " or " +
                                                f + kSuffix + "); rename it first");
        rep.layouts = detect_layouts(in, tree.files);
    });
    return tree;
}

/// compress's work units: one per file, except the .distcp files holding moment items of a
/// DCP folder whose .metadata reads (dcp_units, `unit_bytes` each): those form units with the
/// moments gathered from them. Weights are file sizes.
std::vector<Unit> compress_units(const std::string& in, const Tree& tree, const std::vector<Layout>& layouts,
                                 uint64_t unit_bytes) {
    std::vector<Unit> units;
    std::set<std::string> in_dcp;
    for (const auto& l : layouts) {
        if (l.kind != "dcp") continue;
        std::vector<std::vector<std::string>> groups;
        try {
            groups = dcp_units(join(in, l.dir), unit_bytes);
        } catch (const BadInput&) {
            continue;   // the layout note says why; its files are copied
        }
        for (std::size_t n = 0; n < groups.size(); ++n) {
            Unit u{true, l.dir, {}, 0, n};
            for (const auto& f : groups[n]) {
                const std::string rel = join(l.dir, f);
                if (!std::binary_search(tree.files.begin(), tree.files.end(), rel)) continue;
                u.files.push_back(rel);
                u.weight += fs::file_size(join(in, rel));
                in_dcp.insert(rel);
            }
            if (!u.files.empty()) units.push_back(u);
        }
    }
    for (const auto& f : tree.files)
        if (!in_dcp.count(f)) units.push_back({false, "", {f}, fs::file_size(join(in, f)), 0});
    return units;
}

/// One rank's compress work: the rows of a unit, its files written into the temporary folder.
struct CompressWork {
    const std::string& in;
    const Output& output;
    const CompressOptions& o;
    const std::vector<Layout>& layouts;
    int rank;
    const std::string& tag;   ///< FolderOptions::dcp_unit_tag

    /// The rows of unit `u`: one file, or a DCP unit.
    std::vector<FileRow> rows(const Unit& u) const { return u.dcp ? dcp_unit(u) : std::vector<FileRow>{one_file(u.files[0])}; }

    /// `file` copied byte for byte, with `note` saying why.
    /// With `unit` (DCP files) the manifest gets its per-unit hashes too.
    FileRow copy_row(const std::string& file, const std::string& note, uint64_t unit = 0) const {
        FileRow r;
        r.file = r.stored = file;
        r.layout = layout_of(layouts, file);
        const Digest d = copy_file(join(in, file), join(output.tmp, file), unit);
        if (unit) r.manifest_extra = units_json(d).dump();
        r.action = "copied";
        r.bytes_in = r.bytes_out = d.size;
        r.xxh3 = r.source_xxh3 = d.xxh3;
        r.note = note;
        return r;
    }

    /// Compress `src` into tmp/<stored>; when Adam's L2 domain lacks theta, retry with the
    /// bound `theta_bound()` gives (nullopt: rethrow). Fills the row's figures and hashes.
    /// `companion`: what a sibling file states for src (Megatron's model_optim_rng.pt).
    void compress_row(FileRow& r, const std::string& src, const std::string& stored,
                      const std::function<std::optional<std::pair<double, std::string>>()>& theta_bound,
                      std::shared_ptr<const CompanionHyper> companion = nullptr) const {
        CompressOptions oo = o;
        oo.progress = false;
        oo.hyper.companion = std::move(companion);
        Report cr("", "", "", "", 0, 0);
        try {
            cr = compress(src, join(output.tmp, stored), oo);
        } catch (const NeedsParamBound&) {  // theta not in the file
            if (o.param_bound) throw;
            const auto b = theta_bound();
            if (!b) throw;
            oo.param_bound = b->first;
            r.note = fmt::format("Adam L2 domain with |theta| <= {:.6g} from {}", b->first, b->second);
            cr = compress(src, join(output.tmp, stored), oo);
        }
        fill_from(r, cr, src, join(output.out, stored));
        const Digest sd = hash_file(src), cd = hash_file(join(output.tmp, stored));
        r.stored = stored;
        r.action = "compressed";
        r.bytes_in = sd.size;
        r.bytes_out = cd.size;
        r.source_xxh3 = sd.xxh3;
        r.xxh3 = cd.xxh3;
        if (!r.ok) r.note += (r.note.empty() ? "" : "; ") + std::string("bound above tolerance");
    }

    /// One file: compressed, or copied (not a checkpoint, no Adam/AdamW state, or its
    /// container not smaller).
    FileRow one_file(const std::string& file) const {
        const std::string src = join(in, file);
        if (!looks_like_checkpoint(src)) return copy_row(file, "");
        try {
            (void)read_checkpoint(src, o.limits);
        } catch (const BadInput& e) {
            if (declared_optimizer(layouts, file)) throw;
            return copy_row(file, std::string("not read as a checkpoint: ") + e.what());
        }
        FileRow r;
        r.file = file;
        r.layout = layout_of(layouts, file);
        // Megatron-LM distrib_optim.pt: its hyper-parameters and step are the sibling
        // model_optim_rng.pt's; without them, or when they cannot be certified, copied exact
        std::shared_ptr<const CompanionHyper> companion;
        if (r.layout == "megatron" && base_of(file) == "distrib_optim.pt") {
            companion = megatron_companion(join(in, join(parent_of(file), "model_optim_rng.pt")), o.limits);
            if (!companion) return copy_row(file, kMegatronAlone);
            if (!companion->why_not.empty()) return copy_row(file, "distrib_optim.pt kept exact: " + companion->why_not);
            r.note = "hyper-parameters and step from " + companion->file;
        }
        try {
            // HF Trainer optimizer.pt holds no parameters: Adam's L2 domain takes
            // |theta| <= the largest |value| of the model file(s) next to it; a .distcp
            // item holding a whole optimizer state_dict (torch 1.13's nested DCP form) the
            // largest of the DCP folder's model items.
            compress_row(r, src, file + kSuffix, [&]() -> std::optional<std::pair<double, std::string>> {
                if (r.layout == "hf-trainer") return model_param_bound(join(in, parent_of(file)), o.limits);
                if (r.layout != "dcp") return std::nullopt;
                const Scratch scratch(join(output.tmp, ".ckptkit-scratch-" + std::to_string(rank)));
                const auto b = dcp_param_bound(join(in, parent_of(file)), scratch.path(), o.limits);
                if (!b) return std::nullopt;
                return std::make_pair(*b, std::string("the DCP folder's model items"));
            }, companion);
        } catch (const NoAdamState&) {  // nothing to compress: copied as it is
            return copy_row(file, "no Adam/AdamW state");
        }
        if (r.ok && r.bytes_out >= r.bytes_in) {  // a container's fixed overhead beats a tiny file
            std::error_code ec;
            fs::remove(join(output.tmp, r.stored), ec);
            return copy_row(file, fmt::format("copied as is: its container would be {} bytes, not smaller", r.bytes_out));
        }
        return r;
    }

    /// A DCP folder's moment files: gathered moments -> one container, each file -> a shell.
    std::vector<FileRow> dcp_unit(const Unit& u) const {
        std::vector<FileRow> rows;
        const Scratch scratch(join(output.tmp, ".ckptkit-scratch-" + std::to_string(rank)));
        const std::string name = dcp_moments_name(u.index, tag);
        const std::string dir = join(in, u.dcp_dir), moments = join(scratch.path(), name);
        std::vector<std::string> local;   // the unit's files relative to the DCP folder
        for (const auto& f : u.files) local.push_back(u.dcp_dir.empty() ? f : f.substr(u.dcp_dir.size() + 1));
        const DcpMoments dm = gather_dcp_moments(dir, local, moments, scratch.path(), o.limits);
        std::map<std::string, const DcpFile*> cut_of;
        if (dm.params) {
            FileRow r;
            r.file = join(u.dcp_dir, name);
            r.layout = "dcp";
            r.virtual_input = true;
            r.manifest_extra = json{{"virtual", true}, {"files", local}}.dump();
            compress_row(r, moments, r.file + kSuffix, [&]() -> std::optional<std::pair<double, std::string>> {
                const auto b = dcp_param_bound(dir, scratch.path(), o.limits);
                if (!b) return std::nullopt;
                return std::make_pair(*b, std::string("the DCP model items"));
            });
            r.note += (r.note.empty() ? "" : "; ") + fmt::format("moments of {} parameter chunks gathered from .distcp items", dm.params);
            if (dm.megatron) {   // ckpt-verify holds the container to the copied common.pt
                r.note += fmt::format("; hyper-parameters and step of {} from {} (Megatron)", dm.megatron, dm.megatron_source);
                r.manifest_extra = json{{"virtual", true}, {"files", local}, {"megatron_common", join(u.dcp_dir, "common.pt")}}.dump();
            }
            if (!dm.note.empty()) r.note += "; " + dm.note;
            rows.push_back(r);
            for (const auto& f : dm.files) cut_of[join(u.dcp_dir, f.file)] = &f;
        }
        for (const auto& file : u.files) {
            auto it = cut_of.find(file);
            if (it == cut_of.end()) {
                rows.push_back(copy_row(file, dm.params ? "" : "DCP moments left exact: " + dm.note, kHashUnit));
                continue;
            }
            FileRow r;
            r.file = file;
            r.stored = file + kShellSuffix;
            r.layout = "dcp";
            r.action = "shell";
            write_shell(join(in, file), *it->second, join(output.tmp, r.stored));
            const Digest sd = hash_file(join(in, file)), hd = hash_file(join(output.tmp, r.stored), kHashUnit);
            r.bytes_in = sd.size;
            r.bytes_out = hd.size;
            r.source_xxh3 = sd.xxh3;
            r.xxh3 = hd.xxh3;
            r.note = fmt::format("{} moment storages cut out", it->second->cuts.size());
            json extra{{"shell", true}, {"moments", join(u.dcp_dir, name)}, {"cuts", cuts_json(it->second->cuts)}};
            extra.update(units_json(hd));
            r.manifest_extra = extra.dump();
            rows.push_back(r);
        }
        return rows;
    }
};

/// The manifest of a compressed folder from its rows (sorted by file); marks `rep` not ok
/// with each row that is not.
Manifest compress_manifest(const std::string& in, const Tree& tree, FolderReport& rep) {
    Manifest m;
    m.source = folder_name(in);
    m.layouts = rep.layouts;
    m.dirs = tree.dirs;
    for (const auto& r : rep.files) {
        m.files.push_back({r.file, r.stored, r.action == "compressed", r.bytes_out, r.xxh3, r.bytes_in, r.source_xxh3,
                           r.manifest_extra.empty() ? json::object() : json::parse(r.manifest_extra)});
        rep.ok = rep.ok && r.ok;
        if (!r.ok) rep.failures.push_back(r.file + ": " + r.note);
    }
    return m;
}

}  // namespace

FolderReport compress_folder(const std::string& in, const std::string& out_arg, const CompressOptions& o,
                             const FolderOptions& fo, Comm& c) {
    const std::string out = without_trailing_slash(out_arg);  // "-o out/" names the folder out
    FolderReport rep = new_report("ckpt-compress", in, out, c);
    rep.codec = codec::kind_name(o.codec);
    rep.tolerance = o.tolerance;
    rep.grad_bound = o.grad_bound;
    const Tree tree = check_compress_input(c, in, out, fo.force, rep);
    const Output output = Output::open(c, out, tree.dirs);
    const std::vector<Unit> units = compress_units(in, tree, rep.layouts, fo.dcp_unit_bytes);
    std::vector<uint64_t> weights;
    for (const auto& u : units) weights.push_back(u.weight);
    const CompressWork work{in, output, o, rep.layouts, c.rank(), fo.dcp_unit_tag};
    rep.files = run_shared(c, weights, [&](std::size_t i) { return work.rows(units[i]); }, output, fo.progress);
    const Manifest m = compress_manifest(in, tree, rep);
    output.commit(c, [&] { write_manifest(output.tmp, m); });
    return rep;
}

// ---------------------------------------------------------------- verify

namespace {

/// Gathered Megatron moments (manifest "megatron_common"): the coded groups' lr, betas, eps and
/// step (the container's report `report_json`) against the copied common.pt they were read
/// from (its hash is checked as its own row's); `fail` for each difference.
void check_megatron_common(const std::string& dir, const Manifest& m, const Entry& e, const std::string& report_json,
                           const std::function<void(const std::string&)>& fail) {
    const std::string sib = e.extra.at("megatron_common").get<std::string>();
    const auto it = std::find_if(m.files.begin(), m.files.end(), [&](const Entry& x) { return x.path == sib; });
    if (it == m.files.end() || it->container || it->stored != sib) {
        fail("its " + sib + " is not a copied file of the folder (hyper-parameters unchecked)");
        return;
    }
    // dp_reshardable's param groups lie in .distcp items: in the copied file, or in its shell
    // shifted by the cuts before them (never inside one: a cut is a moment storage)
    const std::string dcp_dir = parent_of(sib);
    auto remap = [&](const DcpItem& it) {
        const std::string path = join(dcp_dir, it.file);
        const auto e = std::find_if(m.files.begin(), m.files.end(), [&](const Entry& x) { return x.path == path; });
        if (e == m.files.end() || e->container || e->is_virtual()) throw BadInput(join(dir, path), "not a copied file or shell of the folder");
        DcpItem at = it;
        at.file = dcp_dir.empty() ? e->stored : e->stored.substr(dcp_dir.size() + 1);
        if (e->is_shell()) {
            const auto shifted = shell_offset(cuts_from(e->extra.at("cuts")), it.offset, it.length);
            if (!shifted) throw BadInput(join(dir, e->stored), "item " + it.fqn + " overlaps a cut moment storage");
            at.offset = *shifted;
        }
        return at;
    };
    std::string why;
    std::shared_ptr<const CompanionHyper> c;
    try {
        c = dcp_megatron_hyper(join(dir, dcp_dir), Limits{}, why, remap);
    } catch (const std::exception& ex) {
        why = ex.what();
    }
    if (!c) {
        fail(sib + ": " + why);
        return;
    }
    const json groups = report_json.empty() ? json::array() : json::parse(report_json).value("param_groups", json::array());
    for (const auto& g : groups) {
        const double got[5] = {g.value("lr", NAN), g.value("/betas/0"_json_pointer, NAN), g.value("/betas/1"_json_pointer, NAN),
                               g.value("eps", NAN), g.value("step", NAN)};
        const double want[5] = {c->hyper.lr, c->hyper.beta1, c->hyper.beta2, c->hyper.eps, c->hyper.step};
        const char* names[5] = {"lr", "beta1", "beta2", "eps", "step"};
        for (int k = 0; k < 5; ++k)   // the report states lr, betas and eps in float32
            if (k < 4 ? float(got[k]) != float(want[k]) : got[k] != want[k])
                fail(fmt::format("{} ({:g} vs {:g}) differs from {}", names[k], got[k], want[k],
                                 c->file == "common.pt" ? sib + "'s" : c->file + " of " + dcp_dir));
    }
}

}  // namespace

FolderReport verify_folder(const std::string& dir, const std::optional<std::string>& original, const VerifyOptions& vo,
                           Comm& c) {
    FolderReport rep = new_report("ckpt-verify", dir, original.value_or(""), c);
    Manifest m;
    std::vector<std::string> pre;   // failures found before the per-file work
    std::vector<std::string> notes;
    std::set<std::string> missing;
    agree(c, false, [&] {
        if (!is_folder(dir)) throw BadInput(dir, "not a folder");
        m = read_manifest(dir);
        if (original && !is_folder(*original)) throw BadInput(*original, "--original: not a folder");
        const Tree t = list_tree(dir);
        std::set<std::string> present(t.files.begin(), t.files.end()), listed;
        present.erase(kManifestName);
        for (const auto& e : m.files) {
            listed.insert(e.stored);
            if (!present.count(e.stored)) missing.insert(e.stored);   // its row fails
        }
        for (const auto& p : present)
            if (listed.count(p)) continue;
            else if (dcp_writer_folder(p.substr(0, p.find('/'))))
                notes.push_back(p + ": left by a ckptkit.dcp save that did not finish (the next save into this folder removes it)");
            else
                pre.push_back(p + ": not in the manifest");
        if (original) {
            std::set<std::string> paths;
            for (const auto& e : m.files) paths.insert(e.path);
            for (const auto& f : list_tree(*original).files)
                if (!paths.count(f)) pre.push_back(join(*original, f) + ": in the original but not in the compressed folder");
        }
    });
    rep.layouts = m.layouts;
    std::vector<uint64_t> weights;
    for (const auto& e : m.files) weights.push_back(missing.count(e.stored) ? 0 : e.size);
    auto job = [&](std::size_t i) -> std::vector<FileRow> {
        const Entry& e = m.files[i];
        FileRow r;
        r.file = e.path;
        r.stored = e.stored;
        r.layout = layout_of(m.layouts, e.path);
        r.virtual_input = e.is_virtual();
        r.action = e.container ? "verified" : "intact";
        r.xxh3 = e.xxh3;
        r.source_xxh3 = e.source_xxh3;
        r.bytes_in = e.size;
        r.bytes_out = e.source_size;
        auto fail = [&](const std::string& why) {
            r.ok = false;
            r.note += (r.note.empty() ? "" : "; ") + why;
        };
        if (missing.count(e.stored)) {
            fail("missing (listed in the manifest)");
            return {r};
        }
        const std::string path = join(dir, e.stored);
        const Digest d = hash_file(path, e.hash_unit());
        if (d.size != e.size || d.xxh3 != e.xxh3) {
            fail(fmt::format("size/xxh3 {}/{} differ from the manifest's {}/{}", d.size, hex64(d.xxh3), e.size, hex64(e.xxh3)));
            return {r};
        }
        if (const std::string why = units_differ(e, d); !why.empty()) {
            fail(why);
            return {r};
        }
        std::string orig;
        std::optional<Scratch> scratch;
        if (original && e.is_virtual()) {
            // the gathered moments of a DCP folder: gather them again from the original
            scratch.emplace((fs::temp_directory_path() / fmt::format("ckptkit-verify-{}-{}", ::getpid(), i)).string());
            orig = join(scratch->path(), base_of(e.path));
            try {
                (void)gather_dcp_moments(join(*original, parent_of(e.path)), e.extra.at("files").get<std::vector<std::string>>(),
                                         orig, scratch->path(), Limits{});
                if (const Digest od = hash_file(orig); od.size != e.source_size || od.xxh3 != e.source_xxh3) {
                    fail("moments gathered from the original DCP folder differ from those compressed");
                    orig.clear();
                }
            } catch (const std::exception& ex) {
                fail(std::string("cannot gather the original DCP moments: ") + ex.what());
                orig.clear();
            }
        } else if (original && e.extra.value("dcp_metadata", false)) {
            // .metadata that ckptkit.dcp wrote: torch's save_id and checkpoint_id differ between
            // any two saves, so it is compared by what it maps: every storage_data item
            try {
                auto key = [](const std::vector<DcpItem>& v) {
                    std::vector<std::tuple<std::string, std::string, std::string, uint64_t, uint64_t>> k;
                    for (const auto& it : v) k.emplace_back(it.fqn, it.chunk, it.file, it.offset, it.length);
                    std::sort(k.begin(), k.end());
                    return k;
                };
                if (key(dcp_items(join(dir, parent_of(e.path)))) != key(dcp_items(join(*original, parent_of(e.path)))))
                    fail("its storage_data differs from the original .metadata's (other items, files or offsets)");
                else
                    r.note = "storage_data the same as the original's";
            } catch (const std::exception& ex) {
                fail(std::string("cannot compare with the original .metadata: ") + ex.what());
            }
        } else if (original) {
            orig = join(*original, e.path);
            if (!fs::is_regular_file(orig)) {
                fail("original " + orig + " missing");
                orig.clear();
            } else if (const Digest od = hash_file(orig); od.size != e.source_size || od.xxh3 != e.source_xxh3) {
                fail("original " + orig + " is not the file that was compressed (size/xxh3 differ)");
                orig.clear();
            }
        }
        if (e.container) {
            VerifyOptions v = vo;
            v.progress = false;
            if (!orig.empty()) v.original = orig;
            else v.original.reset();
            try {
                // Megatron-LM distrib_optim.pt: the hyper-parameters and step the copied
                // model_optim_rng.pt beside it states (its hash is checked as its own row's)
                if (r.layout == "megatron" && base_of(e.path) == "distrib_optim.pt") {
                    const std::string sib = join(parent_of(e.path), "model_optim_rng.pt");
                    const auto it = std::find_if(m.files.begin(), m.files.end(), [&](const Entry& x) { return x.path == sib; });
                    if (it == m.files.end() || it->container || it->stored != sib)
                        fail("its model_optim_rng.pt is not a copied file of the folder (hyper-parameters unchecked)");
                    else
                        v.companion = megatron_companion(join(dir, sib), Limits{});
                }
                const Report vr = verify(path, v);
                const bool was_ok = r.ok;
                fill_from(r, vr, path, orig);
                r.ok = was_ok && vr.ok;
                for (const auto& f : vr.failures) fail(f);
                if (e.extra.contains("megatron_common")) check_megatron_common(dir, m, e, r.report_json, fail);
            } catch (const std::exception& ex) {
                fail(ex.what());
            }
        }
        return {r};
    };
    rep.files = run_shared(c, weights, job, Output{}, vo.progress);
    rep.failures = pre;
    rep.notes = notes;
    rep.ok = pre.empty();
    for (const auto& r : rep.files)
        if (!r.ok) {
            rep.ok = false;
            rep.failures.push_back(r.stored + ": " + r.note);
        }
    std::sort(rep.failures.begin(), rep.failures.end());
    rep.failures.erase(std::unique(rep.failures.begin(), rep.failures.end()), rep.failures.end());
    return rep;
}

// ---------------------------------------------------------------- restore

FolderReport restore_folder(const std::string& dir, const std::string& out_arg, const RestoreOptions& ro,
                            const FolderOptions& fo, Comm& c) {
    const std::string out = without_trailing_slash(out_arg);
    FolderReport rep = new_report("ckpt-restore", dir, out, c);
    Manifest m;
    agree(c, false, [&] {
        if (!is_folder(dir)) throw BadInput(dir, "not a folder");
        m = read_manifest(dir);
        check_output_folder(dir, out, fo.force);
    });
    rep.layouts = m.layouts;
    const Output output = Output::open(c, out, m.dirs);
    // Work units: one per entry, except a DCP folder's gathered moments with its shells.
    std::vector<std::vector<std::size_t>> units;
    std::vector<uint64_t> weights;
    {
        std::map<std::string, std::size_t> unit_of_moments;
        for (std::size_t i = 0; i < m.files.size(); ++i)
            if (m.files[i].is_virtual()) {
                unit_of_moments[m.files[i].path] = units.size();
                units.push_back({i});
                weights.push_back(m.files[i].size);
            }
        for (std::size_t i = 0; i < m.files.size(); ++i) {
            const Entry& e = m.files[i];
            if (e.is_virtual()) continue;
            if (e.is_shell()) {
                auto u = unit_of_moments.find(e.extra.value("moments", std::string()));
                if (u == unit_of_moments.end())
                    throw BadInput(join(dir, kManifestName), "shell " + e.stored + " names no gathered moments entry");
                units[u->second].push_back(i);
                weights[u->second] += e.size;
            } else {
                units.push_back({i});
                weights.push_back(e.size);
            }
        }
    }
    auto check_copy = [&](const std::string& src, const Entry& e, const Digest& d) {
        if (d.size != e.size || d.xxh3 != e.xxh3)
            throw CheckFailed(src + ": size/xxh3 " + std::to_string(d.size) + "/" + hex64(d.xxh3) +
                              " differ from the manifest's " + std::to_string(e.size) + "/" + hex64(e.xxh3));
        if (const std::string why = units_differ(e, d); !why.empty()) throw CheckFailed(src + ": " + why);
    };
    auto job = [&](std::size_t ui) -> std::vector<FileRow> {
        std::vector<FileRow> rows;
        std::string moments;
        std::optional<Scratch> scratch;
        for (std::size_t i : units[ui]) {
        const Entry& e = m.files[i];
        const std::string src = join(dir, e.stored), dst = join(output.tmp, e.path);
        FileRow r;
        r.file = e.path;
        r.stored = e.stored;
        r.layout = layout_of(m.layouts, e.path);
        r.action = "restored";
        if (e.is_virtual()) {   // restored next to the output, used by the shells that follow
            scratch.emplace(join(output.tmp, ".ckptkit-scratch-" + std::to_string(c.rank())));
            moments = join(scratch->path(), base_of(e.path));
            RestoreOptions oo = ro;
            oo.progress = false;
            const Report rr = restore(src, moments, oo);
            fill_from(r, rr, src, "");
            r.virtual_input = true;
            r.bytes_in = io::InputFile(src).size();
            r.bytes_out = 0;
            r.note = "gathered DCP moments (put back into the .distcp files)";
        } else if (e.is_shell()) {
            check_copy(src, e, hash_file(src, e.hash_unit()));
            DcpFile df{e.path, cuts_from(e.extra.at("cuts"))};
            rebuild_from_shell(src, df, moments, dst);
            r.bytes_in = e.size;
            r.bytes_out = io::InputFile(dst).size();
            r.note = fmt::format("{} moment storages put back", df.cuts.size());
        } else if (e.container) {
            RestoreOptions oo = ro;
            oo.progress = false;
            const Report rr = restore(src, dst, oo);
            fill_from(r, rr, src, join(out, e.path));
            r.bytes_in = io::InputFile(src).size();
            r.bytes_out = io::InputFile(dst).size();
        } else {
            const Digest d = copy_file(src, dst);
            check_copy(src, e, d);
            r.action = "copied";
            r.bytes_in = r.bytes_out = d.size;
            r.xxh3 = r.source_xxh3 = d.xxh3;
        }
        rows.push_back(r);
        }
        return rows;
    };
    rep.files = run_shared(c, weights, job, output, fo.progress);
    output.commit(c);
    return rep;
}

// ---------------------------------------------------------------- ckptkit.dcp

namespace {

/// The stored file of `e` hashed and checked against the manifest. Throws CheckFailed.
Digest check_stored(const std::string& dir, const Entry& e) {
    const std::string src = join(dir, e.stored);
    const Digest d = hash_file(src, e.hash_unit());
    if (d.size != e.size || d.xxh3 != e.xxh3)
        throw CheckFailed(src + ": size/xxh3 " + std::to_string(d.size) + "/" + hex64(d.xxh3) + " differ from the manifest's " +
                          std::to_string(e.size) + "/" + hex64(e.xxh3));
    if (const std::string why = units_differ(e, d); !why.empty()) throw CheckFailed(src + ": " + why);
    return d;
}

}  // namespace

void check_stored_file(const std::string& dir, const std::string& path) {
    const Manifest m = read_manifest(dir);
    for (const auto& e : m.files)
        if (e.path == path) {
            (void)check_stored(dir, e);
            return;
        }
    throw BadInput(join(dir, path), std::string("not a file of the folder (") + kManifestName + ")");
}

void check_stored_units(const std::string& dir, const std::string& stored, uint64_t size, uint64_t unit,
                        const std::vector<std::string>& units_hex, uint64_t first, uint64_t count) {
    const std::string src = join(dir, stored);
    if (!units_cover(size, unit, units_hex.size()) || first > units_hex.size() || count > units_hex.size() - first)
        throw BadInput(join(dir, kManifestName), "manifest xxh3_units of " + stored + " do not cover its size");
    std::vector<uint64_t> want;
    try {
        for (uint64_t k = first; k < first + count; ++k) want.push_back(parse_hex64(units_hex[std::size_t(k)]));
    } catch (const std::exception&) {
        throw BadInput(join(dir, kManifestName), "malformed xxh3_units of " + stored);
    }
    std::error_code ec;
    const auto got_size = fs::file_size(src, ec);
    if (ec == std::errc::no_such_file_or_directory) throw BadInput(src, "missing (listed in the manifest)");
    if (ec) throw BadInput(src, "cannot read: " + ec.message());
    if (got_size != size)
        throw CheckFailed(src + ": size " + std::to_string(got_size) + " differs from the manifest's " + std::to_string(size));
    const std::vector<uint64_t> got = hash_units(src, unit, first, want.size());
    for (std::size_t k = 0; k < want.size(); ++k)
        if (got[k] != want[k])
            throw CheckFailed(src + ": " + unit_differs(size, unit, first + k, hex64(got[k]), want[k]));
}

uint64_t restore_folder_file(const std::string& dir, const std::string& path, int fd, const RestoreOptions& ro) {
    const Manifest m = read_manifest(dir);
    auto find = [&](const std::string& p) -> const Entry* {
        for (const auto& e : m.files)
            if (e.path == p) return &e;
        return nullptr;
    };
    const Entry* e = find(path);
    if (!e || e->is_virtual()) throw BadInput(join(dir, path), std::string("not a file of the folder (") + kManifestName + ")");
    const std::string src = join(dir, e->stored);
    RestoreOptions oo = ro;
    oo.progress = false;
    if (e->container) return restore_to_fd(src, fd, oo).file_bytes_out;
    const Digest d = check_stored(dir, *e);
    std::optional<FileWriter> w;
    try {
        w.emplace(fd, 0, join(dir, path));
    } catch (const std::exception& x) {
        throw BadInput(join(dir, path), x.what());
    }
    if (!e->is_shell()) {
        try {
            const io::InputFile f(src);
            std::vector<char> buf(std::size_t(1) << 20);
            for (uint64_t at = 0; at < f.size();) {
                const uint64_t n = std::min<uint64_t>(buf.size(), f.size() - at);
                f.read_at(at, buf.data(), std::size_t(n), "bytes");
                w->write(buf.data(), n);
                at += n;
            }
            w->close();
        } catch (const std::exception& x) {
            throw BadInput(src, x.what());
        }
        return d.size;
    }
    const Entry* v = find(e->extra.value("moments", std::string()));
    if (!v || !v->is_virtual()) throw BadInput(join(dir, kManifestName), "shell " + e->stored + " names no gathered moments entry");
    const int mfd = ::memfd_create("ckptkit.dcp-moments", MFD_CLOEXEC);
    if (mfd < 0) throw std::bad_alloc();
    struct Fd {
        int fd;
        ~Fd() { ::close(fd); }
    } hold{mfd};
    (void)restore_to_fd(join(dir, v->stored), mfd, oo);
    rebuild_from_shell(src, DcpFile{e->path, cuts_from(e->extra.at("cuts"))}, "/proc/self/fd/" + std::to_string(mfd), *w);
    return w->offset();
}

uint64_t read_dcp_moments(const std::string& dir, const std::vector<DcpMomentRead>& reads,
                          const std::function<void(uint64_t, const uint8_t*, std::size_t)>& sink,
                          const std::function<uint8_t*(uint64_t)>& memory) {
    const Manifest m = read_manifest(dir);
    std::vector<uint64_t> at(reads.size());   // each read's byte offset in the output
    uint64_t total = 0;
    std::map<std::string, std::vector<std::size_t>> by_moments;
    for (std::size_t i = 0; i < reads.size(); ++i) {
        const auto& r = reads[i];
        if ((r.element_size != 2 && r.element_size != 4) || r.numel > (uint64_t(1) << 56) || r.begin > r.numel ||
            r.count > r.numel - r.begin)
            throw BadInput(join(dir, r.moments), fmt::format("read of {} outside its {} elements", r.tensor, r.numel));
        at[i] = total;
        total += r.count * r.element_size;
        by_moments[r.moments].push_back(i);
    }
    for (const auto& [path, idx] : by_moments) {
        const auto e = std::find_if(m.files.begin(), m.files.end(), [&](const Entry& x) { return x.path == path; });
        if (e == m.files.end() || !e->is_virtual())
            throw BadInput(join(dir, path), std::string("not a gathered-moments entry of the folder (") + kManifestName + ")");
        const std::string src = join(dir, e->stored);
        (void)check_stored(dir, *e);
        const container::ContainerReader cr(src);
        const container::Manifest& man = cr.manifest();
        // the gathered safetensors' header (in /raw): tensor name -> source offset -> storage
        uint64_t hn = 0;
        if (man.source_size < 8) throw BadInput(src, "gathered moments: not a safetensors source");
        cr.read_raw(0, 8, &hn);
        if (hn > man.source_size - 8) throw BadInput(src, "gathered moments: header past the end");
        std::string text(std::size_t(hn), '\0');
        cr.read_raw(8, hn, text.data());
        const json header = json::parse(text, nullptr, false);
        if (!header.is_object()) throw BadInput(src, "gathered moments: header is not a JSON object");
        std::map<std::size_t, std::vector<std::pair<std::size_t, int>>> by_param;   // j -> (read, role)
        for (std::size_t i : idx) {
            const auto& r = reads[i];
            const auto t = header.find(r.tensor);
            uint64_t off = 0;
            try {
                if (t == header.end()) throw std::invalid_argument("absent");
                off = 8 + hn + json_count_of(t->at("data_offsets").at(0), "data_offsets");
            } catch (const std::exception& x) {
                throw BadInput(src, "gathered moments lack tensor " + r.tensor + " (" + x.what() + ")");
            }
            const auto s = std::lower_bound(man.storages.begin(), man.storages.end(), off,
                                            [](const container::StorageEntry& a, uint64_t o) { return a.offset < o; });
            if (s == man.storages.end() || s->offset != off || s->param < 0)
                throw BadInput(src, "tensor " + r.tensor + " is not a coded moment");
            const auto& p = man.params[std::size_t(s->param)];
            if (float_dtype_size(p.dtype) != r.element_size || s->nbytes != r.numel * r.element_size)
                throw BadInput(src, fmt::format("tensor {} holds {} bytes of {}-byte elements, the DCP metadata {} of {}",
                                                r.tensor, s->nbytes, float_dtype_size(p.dtype), r.numel, r.element_size));
            by_param[std::size_t(s->param)].push_back({i, s->role});
        }
        container::ContainerReader::Chunk chunk;
        std::array<std::vector<uint8_t>, 3> scratch;
        try {
            for (const auto& [j, list] : by_param) {
                const DType dtype = man.params[j].dtype;
                const uint64_t es = float_dtype_size(dtype);
                std::array<std::size_t, 3> direct;   // per role: the read decoded in place this chunk, or SIZE_MAX
                direct.fill(SIZE_MAX);
                chunk.into = [&](int k, uint64_t begin, std::size_t n) -> float* {
                    direct[std::size_t(k)] = SIZE_MAX;
                    if (!memory || dtype != DType::F32) return nullptr;
                    for (const auto& [i, kk] : list) {
                        const auto& r = reads[i];
                        if (kk == k && r.begin <= begin && begin + n <= r.begin + r.count) {
                            direct[std::size_t(k)] = i;
                            return reinterpret_cast<float*>(memory(at[i] + (begin - r.begin) * es));
                        }
                    }
                    return nullptr;
                };
                cr.for_each_chunk(j, container::ContainerReader::default_decode_chunk(), container::ContainerReader::Want::Values,
                                  [&](container::ContainerReader::Chunk& c) {
                    std::array<const uint8_t*, 3> bytes{};
                    for (const auto& [i, k] : list) {
                        const auto& r = reads[i];
                        const uint64_t lo = std::max<uint64_t>(c.begin, r.begin), hi = std::min<uint64_t>(c.begin + c.n, r.begin + r.count);
                        if (lo >= hi) continue;
                        if (!bytes[std::size_t(k)]) bytes[std::size_t(k)] = container::ContainerReader::storage_bytes(dtype, c, k, scratch[std::size_t(k)]);
                        if (direct[std::size_t(k)] != i)   // else decoded (escapes in place) where this read's bytes go
                            sink(at[i] + (lo - r.begin) * es, bytes[std::size_t(k)] + (lo - c.begin) * es, std::size_t((hi - lo) * es));
                    }
                }, &chunk);
            }
            chunk.into = nullptr;
        } catch (const std::runtime_error&) {   // a decode that fails on damage is reported as the damage
            cr.check_damage();
            throw;
        }
        cr.check_damage();
    }
    return total;
}

bool dcp_save_folder(const std::string& name) {
    const std::string pre = "ckptkit-";
    return name.size() == pre.size() + 16 && name.rfind(pre, 0) == 0 &&
           std::all_of(name.begin() + std::ptrdiff_t(pre.size()), name.end(), [](char ch) { return std::isxdigit((unsigned char)ch) && !std::isupper((unsigned char)ch); });
}

bool dcp_writer_folder(const std::string& name) {
    return name.rfind(".ckptkit-", 0) == 0 || name.rfind("..ckptkit-", 0) == 0 || dcp_save_folder(name);
}

void commit_dcp_save(const std::string& dir, const std::vector<std::string>& parts, const std::string& metadata, const std::string& tag) {
    const std::string save = "ckptkit-" + tag;
    if (!dcp_save_folder(save)) throw BadInput(dir, "save tag " + tag + " is not 16 hex digits");
    std::set<std::string> earlier;   // the stored files of the checkpoint this save replaces
    if (fs::is_regular_file(join(dir, kManifestName))) {
        try {
            for (const auto& e : read_manifest(dir).files) earlier.insert(e.stored);
        } catch (const BadInput&) {   // not ours to read: nothing of it is removed
        }
    }
    Manifest m;
    m.source = folder_name(dir);
    std::size_t distcp = 0, moments = 0;
    std::error_code ec;
    fs::create_directories(join(dir, save), ec);
    if (ec) throw BadInput(join(dir, save), ec.message());
    for (const auto& p : parts) {
        const Manifest part = read_manifest(p);
        for (auto e : part.files) {
            if (e.path == ".metadata" || e.path.rfind(".ckptkit-", 0) == 0) continue;
            const std::string to = save + "/" + e.stored;
            fs::rename(join(p, e.stored), join(dir, to), ec);
            if (ec) throw BadInput(join(p, e.stored), "cannot move a rank's file into the checkpoint: " + ec.message());
            e.stored = to;
            distcp += !e.is_virtual();
            moments += e.is_virtual();
            m.files.push_back(e);
        }
    }
    const Digest md = hash_file(metadata);
    m.files.push_back({".metadata", ".metadata", false, md.size, md.xxh3, md.size, md.xxh3, json{{"dcp_metadata", true}}});
    std::sort(m.files.begin(), m.files.end(), [](const Entry& a, const Entry& b) { return a.path < b.path; });
    for (std::size_t i = 1; i < m.files.size(); ++i)
        if (m.files[i].path == m.files[i - 1].path) throw BadInput(join(dir, m.files[i].path), "written by two ranks");
    m.layouts.push_back({"dcp", "", fmt::format(".metadata and {} .distcp files", distcp),
                         fmt::format("written by ckptkit.dcp.FileSystemWriter: {} gathered-moments containers", moments)});
    m.save_dir = save;
    fsync_path(join(dir, save));
    write_manifest(dir, m);
    fs::rename(metadata, join(dir, ".metadata"), ec);   // last: the save is readable only now
    if (ec) throw BadInput(join(dir, ".metadata"), ec.message());
    fsync_path(dir);
    // what the replaced checkpoint and earlier saves left
    std::set<std::string> stale;
    for (const auto& e : m.files)
        for (const std::string& name : {e.path, e.path + kShellSuffix, e.path + ".ckz.h5"}) stale.insert(name);
    stale.insert(earlier.begin(), earlier.end());
    for (const auto& e : m.files) stale.erase(e.stored);
    for (const auto& name : stale)
        if (fs::is_regular_file(join(dir, name), ec)) fs::remove(join(dir, name), ec);
    std::vector<fs::path> leftovers;
    for (const auto& d : fs::directory_iterator(dir, ec)) {
        const std::string name = d.path().filename().string();
        if (name != save && dcp_writer_folder(name)) leftovers.push_back(d.path());
    }
    for (const auto& d : leftovers) fs::remove_all(d, ec);
}

}  // namespace ckpt::folder
