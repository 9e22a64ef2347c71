// ckpt-verify: (1) integrity: every dataset's checksum and every stored tensor's hash;
// (2) the manifest is the plan the checkpoint itself implies (layout.h re-run on the
// source bytes kept in /raw: param_groups, step, moment-to-parameter binding, gradient
// domain); (3) every kept coordinate's certificate re-derived from its codes alone must be
// within the tolerance; (4) with --original: identical non-moment bytes, the same moments
// (hash), exact escapes, and the true update difference on a dense gradient grid at or
// below each coordinate's certificate.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>


#include <optional>

#include "common/xxh3.h"
#include "container/reader.h"
#include "ckpt/grid.h"
#include "ckpt/layout.h"
#include "common/file.h"
#include "common/progress.h"
#include "ckpt/pipeline.h"
#include "container/values.h"
#include "common/error.h"
#include "io/file.h"

namespace ckpt {

using container::ContainerReader;

namespace {

/// The source as check 2 parses it, without a copy: an InputFile over the container whose
/// bytes outside the moment storages are read from /raw as the parser asks for them
/// (ContainerReader::read_raw; check 1 has proven /raw's checksum first) and whose moment
/// storages read as zeros (plan_layout reads none of their bytes). Named after the source.
io::InputFile source_view(const ContainerReader& cr) {
    std::vector<io::InputFile::Span> spans;
    for (const container::SourceSpan& sp : container::source_spans(cr.manifest())) {
        if (sp.size() == 0) continue;
        io::InputFile::Span s;
        s.size = sp.size();
        if (sp.moment)
            s.fill = [](uint64_t, void* dst, std::size_t n) { std::memset(dst, 0, n); };
        else
            s.fill = [&cr, at = sp.begin](uint64_t off, void* dst, std::size_t n) { cr.read_raw(at + off, n, dst); };
        spans.push_back(std::move(s));
    }
    return io::InputFile(cr.manifest().source_name, std::move(spans));
}

/// The plan the source implies, under the options the manifest records (and what a sibling
/// file states for it: VerifyOptions::companion).
Layout derive_layout(const ContainerReader& cr, const std::shared_ptr<const CompanionHyper>& companion) {
    const auto& man = cr.manifest();
    CompressOptions o;
    o.tolerance = man.tolerance;
    o.grad_bound = man.grad_bound;
    o.codec = man.codec;
    o.optimizer = man.optimizer;
    if (man.param_bound >= 0) o.param_bound = man.param_bound;
    o.horizon = man.horizon;
    o.bound_param = man.bound_param;
    o.hyper.unstated_ok = true;
    for (const auto& k : man.kept)
        if (k.note.find(kUnstated) != std::string::npos) o.hyper.kept_unstated.push_back(k.name);
    o.hyper.companion = companion;
    // a container of a checkpoint with no optimizer state (CompressOptions::allow_no_state):
    // the source must still have none (else the plan has states the manifest lacks)
    o.allow_no_state = man.params.empty() && man.kept.empty();
    // hyper-parameters the source does not state were filled in by overrides: take them
    // from the manifest (compare_layout checks only what the source states)
    const io::InputFile f = source_view(cr);
    const Checkpoint ck = read_checkpoint(f);
    return plan_layout(ck, f, o);
}

/// A failed check: recorded in the report (the first 50 are kept) and the report not ok.
void add_failure(Report& rep, const std::string& s) {
    if (rep.failures.size() < 50) rep.failures.push_back(s);
    rep.ok = false;
}

/// Check 1, integrity, first part: /raw's checksum and every tensor kept in /raw against its
/// hash, in one pass over /raw. Returns the number of kept tensors. The moment datasets'
/// checksums: check_moment_datasets, once check 3 has read them.
uint64_t check_integrity(const ContainerReader& cr, Report& rep) {
    const auto& man = cr.manifest();
    const auto scan = cr.scan_source([](const uint8_t*, std::size_t) {}, [](uint64_t) {});
    if (!scan.raw_ok) add_failure(rep, std::string("dataset ") + container::kRaw + ": checksum mismatch (damaged)");
    if (scan.bad_tensors) {
        const auto& s = man.storages[std::size_t(scan.first_bad)];
        const std::string first = fmt::format("stored tensor at source offset {} ({} bytes): hash mismatch", s.offset, s.nbytes);
        add_failure(rep, scan.bad_tensors == 1 ? first : fmt::format("{} (and {} more)", first, scan.bad_tensors - 1));
    }
    return scan.tensors;
}

/// Check 1, integrity, second part: every other dataset's checksum (DatasetReader hashed
/// them as check 3 read them, so no second pass where it read them all in order). Their
/// failures go first in the report: a damaged dataset explains whatever check 3 found.
void check_moment_datasets(const ContainerReader& cr, Report& rep, uint64_t raw_checked) {
    std::vector<std::string> damage;
    for (const auto& d : cr.damaged_datasets()) damage.push_back("dataset " + d + ": checksum mismatch (damaged)");
    if (!damage.empty()) {
        rep.failures.insert(rep.failures.begin(), damage.begin(), damage.end());
        if (rep.failures.size() > 50) rep.failures.resize(50);
        rep.ok = false;
    }
    rep.checks.insert(rep.checks.begin(), fmt::format("integrity: all datasets and {} stored tensors hashed", raw_checked));
}

/// Check 2: the manifest agrees with the checkpoint's own state: the plan re-derived from
/// the source bytes kept in /raw (source_view), or, in compress's self-check, the plan compress
/// made from the source itself (`planned`; /raw is those bytes when check 1 passed, and
/// plan_layout reads no moment byte, so the re-derived plan would be this one).
void check_manifest(const ContainerReader& cr, Report& rep, const Layout* planned,
                    const std::shared_ptr<const CompanionHyper>& companion) {
    auto fail = [&](const std::string& s) { add_failure(rep, s); };
    const auto& man = cr.manifest();
    try {
        const Layout derived = planned ? Layout{} : derive_layout(cr, companion);
        for (const auto& d : compare_layout(man, planned ? *planned : derived)) fail(d);
        if (rep.ok) rep.checks.push_back(fmt::format("manifest: {} coded states match the source's param_groups, step and storages", man.params.size()));
    } catch (const BadInput& ex) {
        fail(std::string("the source kept in the container cannot be re-read: ") + ex.what());
    }
}

/// The folder a zip's first local record is under ("archive" of "archive/data.pkl"), or ""
/// when the file does not start with a zip record that has one.
std::string zip_top_folder(const io::InputFile& f) {
    try {
        if (f.size() < 30 || f.read_string(0, 4, "zip") != std::string("PK\x03\x04", 4)) return "";
        const std::string h = f.read_string(26, 2, "zip");
        const std::size_t n = std::size_t(uint8_t(h[0]) | uint8_t(h[1]) << 8);
        if (30 + n > f.size()) return "";
        const std::string name = f.read_string(30, n, "zip");
        const auto slash = name.find('/');
        return slash == std::string::npos ? "" : name.substr(0, slash);
    } catch (const std::exception&) {
        return "";
    }
}

/// The original checkpoint of --original, validated as any input (BadInput), opened for
/// comparison; nullptr (and a failure) when its size is not the container's source size
/// (naming the zip folders when they differ: torch.save names them after the file).
std::unique_ptr<io::InputFile> open_original(const ContainerReader& cr, const VerifyOptions& o, Report& rep) {
    const auto& man = cr.manifest();
    Limits lim;
    lim.strict = o.strict;
    read_checkpoint(*o.original, lim);  // validates the original as any input
    auto orig = std::make_unique<io::InputFile>(*o.original);
    if (orig->size() != man.source_size) {
        std::string why = fmt::format("original has {} bytes, the container's source had {}", orig->size(), man.source_size);
        const std::string a = zip_top_folder(*orig), b = zip_top_folder(source_view(cr));
        if (!a.empty() && !b.empty() && a != b)
            why += fmt::format("; its zip records are under '{}/', the source's under '{}/' (torch.save names them after the "
                               "file it writes, '{}' for a file object such as ckptkit.save's), so no copy saved under "
                               "another name matches: compare with what ckpt-restore gives",
                               a, b, "archive");
        add_failure(rep, why);
        return nullptr;
    }
    return orig;
}

/// Check 4, first part: every byte outside moment storages identical to the original's.
void compare_non_moment(const ContainerReader& cr, const io::InputFile& orig, Report& rep) {
    std::vector<uint8_t> b(1 << 20);
    uint64_t diffs = 0;
    for (const container::SourceSpan& sp : container::source_spans(cr.manifest())) {
        if (sp.moment) continue;
        cr.for_each_raw_piece(sp.begin, sp.end, [&](uint64_t off, const uint8_t* a, std::size_t n) {
            orig.read_at(off, b.data(), n, "original bytes");
            if (std::memcmp(a, b.data(), n) != 0) ++diffs;
        });
    }
    if (diffs) add_failure(rep, "non-moment bytes differ from the original");
    rep.checks.push_back("original: every non-moment byte identical");
}

/// The certificates of n kept coordinates: adds those <= `tolerance` to `certified`, the
/// others (NaN too) to `over`, and returns the largest certified one or `max_so_far`.
/// Branch-free over 64-bit lanes only, so it vectorises: certificates are >= 0, and for
/// doubles >= 0 the order of their bit patterns is their numeric order (a negative one,
/// impossible, would count as certified and not change the max, as in check_moments'
/// loop with the original).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("O3")))
#endif
double certificate_stats(const double* bounds, std::size_t n, double tolerance, uint64_t& certified, uint64_t& over,
                         double max_so_far) {
    uint64_t cert = 0;
    int64_t top = 0;  // bit patterns of doubles >= 0 (sign bit clear): signed order is numeric order
    for (std::size_t i = 0; i < n; ++i) {
        const double b = bounds[i];
        const uint64_t ok = b <= tolerance;
        cert += ok;
        int64_t bits;
        std::memcpy(&bits, &b, 8);
        bits &= -int64_t(ok & uint64_t(b >= 0));
        top = bits > top ? bits : top;
    }
    certified += cert;
    over += n - cert;
    double m;
    std::memcpy(&m, &top, 8);
    return std::max(max_so_far, m);
}

/// certificate_stats over chunk coordinates [i0, i1) except the escaped ones (`escaped`:
/// chunk-local, ascending): one call per run between escapes.
double certificate_stats_kept(const std::vector<double>& bounds, const std::vector<uint32_t>& escaped, std::size_t i0,
                              std::size_t i1, double tolerance, uint64_t& certified, uint64_t& over, double max_so_far) {
    auto q = std::lower_bound(escaped.begin(), escaped.end(), uint32_t(i0));
    for (std::size_t i = i0;; ++q) {
        const std::size_t end = q != escaped.end() && *q < i1 ? *q : i1;
        max_so_far = certificate_stats(bounds.data() + i, end - i, tolerance, certified, over, max_so_far);
        if (end == i1) return max_so_far;
        i = end + 1;
    }
}

/// Checks 3 and 4: every coded parameter decoded; each kept coordinate's certificate
/// re-derived from its codes (o.certificates) must be within the tolerance; with the
/// original (orig != nullptr), the same moments (hash), exact escapes and the dense-grid
/// update difference at or below each certificate. Fills rows' max bounds. Under
/// compress's self-check (o.code_hashes, no certificates) it decodes codes only and checks
/// their hashes.
void check_moments(const ContainerReader& cr, const VerifyOptions& o, const io::InputFile* orig, Report& rep) {
    auto fail = [&](const std::string& s) { add_failure(rep, s); };
    const auto& man = cr.manifest();
    const bool cmp = orig != nullptr;
    using Want = ContainerReader::Want;
    if (o.code_hashes && o.code_hashes->size() != man.params.size())  // an internal mismatch: never a silent fallback
        fail("self-check: " + std::to_string(o.code_hashes->size()) + " parameters encoded, " +
             std::to_string(man.params.size()) + " in the container");
    const bool codes_only = !o.certificates && !cmp && o.code_hashes && o.code_hashes->size() == man.params.size();
    const Want want = cmp ? Want::Bounds : o.certificates ? Want::Certificates : codes_only ? Want::Codes : Want::Values;
    uint64_t certified = 0, grid_points = 0, escapes_checked = 0, seq_checked = 0, seq_points = 0;
    double max_true = 0, max_seq = 0;
    double max_certified = 0;  // the largest re-derived certificate of every parameter (against o.tolerance)
    uint64_t above_limit = 0;  // parameters with a certificate above o.tolerance
    GridPoints grid(o.grid);
    const std::size_t code_bytes = std::size_t(codec::code_bytes(man.codec));
    ContainerReader::Chunk chunk;  // reused by every parameter (for_each_chunk)
    std::vector<uint8_t> ob[3];
    std::vector<float> ov[3];
    std::vector<char> esc;  // per chunk: 1 at its escaped coordinates
    std::vector<double> closed;  // per chunk: closed_form_values (grid.h)
    uint64_t moment_bytes = 0;
    for (const auto& e : man.params) moment_bytes += e.numel * uint64_t(e.moments()) * float_dtype_size(e.dtype);
    Progress prog(o.progress, "ckpt-verify", moment_bytes, man.params.size());
    for (std::size_t j = 0; j < man.params.size(); ++j) {
        const auto& e = man.params[j];
        const codec::TensorSetup s = cr.setup(j);
        const codec::GuardConst gc = codec::make_guard_const(s.hyper, s.tolerance, s.format6);
        grid.set_b2(gc.b2);
        // horizon all: gradient sequences on every `stride`-th coordinate (every 8th, at
        // most ~16k per tensor), as well as the single gradients of the dense grid
        std::optional<SeqPoints> seq;
        if (cmp && gc.all) seq.emplace(s.hyper);
        const uint64_t stride = std::max<uint64_t>(8, e.numel >> 14);
        uint64_t seq_fail = 0;
        const std::size_t es = float_dtype_size(e.dtype);
        const int nm = e.moments();
        double max_bound = 0;
        uint64_t escapes = 0, over = 0, grid_fail = 0, esc_fail = 0;
        const Xxh3State hash[3] = {make_xxh3(), make_xxh3(), make_xxh3()};
        XXH3_state_t* hs[3] = {hash[0].get(), hash[1].get(), hash[2].get()};
        try {
            cr.for_each_chunk(j, ContainerReader::default_decode_chunk(), want, [&](const ContainerReader::Chunk& c) {
                prog.advance(c.n * uint64_t(nm) * es);
                if (codes_only) {  // self-check: the decoded codes hashed (hs[] serves the original otherwise), a role per thread
                    codec::parallel_items(std::size_t(nm), [&](unsigned, std::size_t k0, std::size_t k1) {
                        for (std::size_t k = k0; k < k1; ++k) XXH3_64bits_update(hs[k], c.codes[k].data(), c.n * code_bytes);
                    });
                    escapes += c.escaped.size();
                    return;
                }
                escapes += c.escaped.size();
                if (!cmp && c.bounds.empty()) return;  // decode-only pass (VerifyOptions::certificates off)
                if (cmp) {
                    esc.assign(c.n, 0);
                    closed.resize(c.n);
                    for (uint32_t q : c.escaped) esc[q] = 1;
                    for (int k = 0; k < nm; ++k) {
                        ob[k].resize(c.n * es);
                        ov[k].resize(c.n);
                        orig->read_at(man.storages[std::size_t(e.storage[k])].offset + c.begin * es, ob[k].data(), c.n * es, "moment storage");
                        XXH3_64bits_update(hs[k], ob[k].data(), ob[k].size());
                        bytes_to_float(e.dtype, ob[k].data(), c.n, ov[k].data());
                        for (std::size_t q = 0; q < c.escaped.size(); ++q, ++escapes_checked)
                            if (element_bits(e.dtype, ob[k].data(), c.escaped[q]) != c.escaped_bits[k][q]) ++esc_fail;
                    }
                }
                // per-coordinate checks, split over the CPU threads (one accumulator each)
                struct Acc {
                    uint64_t certified = 0, over = 0, grid_points = 0, grid_fail = 0, seq_checked = 0, seq_points = 0, seq_fail = 0;
                    double max_bound = 0, max_true = 0, max_seq = 0;
                };
                std::vector<Acc> acc(codec::parallel_parts(c.n));
                codec::parallel_ranges(c.n, [&](unsigned part, std::size_t i0, std::size_t i1) {
                    Acc& a = acc[part];
                    if (!cmp) {  // certificates only: counts and max without branches, run by run between escapes
                        a.max_bound = certificate_stats_kept(c.bounds, c.escaped, i0, i1, man.tolerance, a.certified, a.over, 0.0);
                        return;
                    }
                    // the closed form of the whole range first, in one vectorised pass
                    const bool ams = nm == 3;
                    closed_form_values(gc, ams, ov[0].data() + i0, ov[1].data() + i0, ams ? ov[2].data() + i0 : nullptr,
                                       c.values[0].data() + i0, c.values[1].data() + i0, ams ? c.values[2].data() + i0 : nullptr,
                                       i1 - i0, closed.data() + i0);
                    for (std::size_t i = i0; i < i1; ++i) {
                        if (esc[i]) continue;
                        const double b = c.bounds[i];
                        if (!(b <= man.tolerance)) { ++a.over; continue; }
                        ++a.certified;
                        a.max_bound = std::max(a.max_bound, b);
                        double lo, hi;
                        codec::gradient_domain(e.domain, c.theta.empty() ? nullptr : c.theta.data(), i, lo, hi);
                        const double vt = nm == 3 ? c.values[2][i] : 0.0, vo = nm == 3 ? ov[2][i] : 0.0;
                        // only a max above this part's running max can change the report
                        // (grid_check's screen skips the rest exactly)
                        const GridResult r = grid_check(gc, nm == 3, ov[0][i], ov[1][i], vo, c.values[0][i], c.values[1][i], vt, lo, hi,
                                                        std::sqrt(std::max<double>(ov[1][i], 1e-30)), b, grid, true, a.max_true,
                                                        closed[i]);
                        a.grid_points += r.points;
                        a.grid_fail += r.over;
                        a.max_true = std::max(a.max_true, r.max_diff);
                        if (seq && (c.begin + i) % stride == 0) {
                            const GridResult q = sequence_check(*seq, ov[0][i], ov[1][i], vo, c.values[0][i], c.values[1][i], vt, b);
                            ++a.seq_checked;
                            a.seq_points += q.points;
                            a.seq_fail += q.over;
                            a.max_seq = std::max(a.max_seq, q.max_diff);
                        }
                    }
                });
                for (const Acc& a : acc) {
                    certified += a.certified;
                    over += a.over;
                    grid_points += a.grid_points;
                    grid_fail += a.grid_fail;
                    max_bound = std::max(max_bound, a.max_bound);
                    max_true = std::max(max_true, a.max_true);
                    seq_checked += a.seq_checked;
                    seq_points += a.seq_points;
                    seq_fail += a.seq_fail;
                    max_seq = std::max(max_seq, a.max_seq);
                }
            }, &chunk);
        } catch (const BadInput& ex) {
            fail(e.name + ": " + ex.what());
        }
        if (codes_only)
            for (int k = 0; k < nm; ++k)
                if (XXH3_64bits_digest(hs[k]) != (*o.code_hashes)[j][std::size_t(k)])
                    fail(e.name + ": decoded " + container::kRoleNames[k] + " codes differ from the encoded ones");
        if (cmp)
            for (int k = 0; k < nm; ++k)
                if (XXH3_64bits_digest(hs[k]) != man.storages[std::size_t(e.storage[k])].xxh3)
                    fail(e.name + ": original " + container::kRoleNames[k] + " differs from the one that was compressed");
        if (escapes != e.escapes) fail(fmt::format("{}: {} escapes found, manifest says {}", e.name, escapes, e.escapes));
        if (over) fail(fmt::format("{}: {} coordinates kept with a certificate above tolerance", e.name, over));
        if ((o.certificates || cmp) && max_bound != e.max_bound) fail(fmt::format("{}: re-derived max bound {} differs from stored {}", e.name, max_bound, e.max_bound));
        if (grid_fail) fail(fmt::format("{}: {} grid points exceed their certificate", e.name, grid_fail));
        if (seq_fail) fail(fmt::format("{}: {} gradient sequences exceed their certificate", e.name, seq_fail));
        if (esc_fail) fail(fmt::format("{}: {} escaped values differ from the original", e.name, esc_fail));
        if (o.certificates || cmp) {
            rep.rows[j].max_bound = max_bound;
            max_certified = std::max(max_certified, max_bound);
            above_limit += max_bound > o.tolerance;
        }
        prog.item_done();
    }
    // The manifest's tolerance is the writer's word: certificates are held to the caller's
    // (--tolerance), whatever the manifest says (a raised manifest tolerance with its max
    // bounds rewritten is otherwise a consistent forgery)
    if (above_limit)
        fail(fmt::format("certificates up to {:.4g} lr ({} of {} tensors) exceed {}{}: the container was compressed "
                         "at tolerance {}: pass {}{} to accept it",
                         max_certified, above_limit, man.params.size(), o.python_names ? "tolerance=" : "--tolerance ",
                         o.tolerance, man.tolerance, o.python_names ? "tolerance=" : "--tolerance ", man.tolerance));
    if (o.certificates || cmp)
        rep.checks.push_back(fmt::format("certificates: {} coordinates re-derived from codes, all <= tolerance {}", certified,
                                         std::min(man.tolerance, o.tolerance)));
    if (cmp)
        rep.checks.push_back(fmt::format("original: {} escaped values exact; {} gradient grid points, max |u-u~| = {:.3e} lr",
                                         escapes_checked, grid_points, max_true));
    if (cmp && seq_checked)
        rep.checks.push_back(fmt::format("original, every later update: {} coordinates x {} steps, {} gradient sequences, "
                                         "max over steps |u-u~| = {:.3e} lr", seq_checked, kSeqSteps, seq_points, max_seq));
}

}  // namespace

Report verify(const std::string& path, const VerifyOptions& o) {
    const ContainerReader cr(path, o.planned ? &o.planned->man : nullptr, o.manifest_xxh3);  // compress's self-check: its own manifest
    const auto& man = cr.manifest();
    Report rep("ckpt-verify", path, o.original.value_or(""), codec::kind_name(man.codec), man.tolerance,
               man.grad_bound);
    rep.horizon = man.horizon;
    rep.bound_param = man.bound_param;
    rep.accepted_tolerance = o.tolerance;
    rep.file_bytes_in = man.source_size;
    rep.file_bytes_out = io::InputFile(path).size();
    rep.rows = tensor_rows(cr);
    rep.bits = moment_bits(cr);
    rep.escape_causes = escape_causes(cr);
    const uint64_t raw_checked = check_integrity(cr, rep);  // 1, /raw
    rep.groups = param_groups(cr);
    if (rep.ok) check_manifest(cr, rep, o.planned, o.companion);  // 2
    std::unique_ptr<io::InputFile> orig;
    if (o.original) orig = open_original(cr, o, rep);
    if (orig) compare_non_moment(cr, *orig, rep);  // 4, non-moment bytes
    check_moments(cr, o, orig.get(), rep);       // 3, and 4 for the moments
    check_moment_datasets(cr, rep, raw_checked);  // 1, the datasets check 3 read
    return rep;
}

}  // namespace ckpt
