// ckpt-compress in four phases: plan (layout.h: which storages become codes, under which
// guarantee), /raw (every other byte, in file order, hashed), the moment streams (each
// compressible parameter chunk by chunk through the codec; memory bounded by the chunk;
// phases 2 and 3 interleave, so that a parameter's theta is read once for both), and a
// self-check: the written container must pass ckpt-verify (hence restore) before it
// is renamed into place, so no container this tool calls ok fails to restore.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "ckpt/layout.h"
#include "ckpt/pipeline.h"
#include "container/values.h"
#include "common/chunk_buffer.h"
#include "common/error.h"
#include "common/file.h"
#include "common/lane.h"
#include "common/progress.h"
#include "common/xxh3.h"
#include "container/h5.h"
#include "container/manifest.h"
#include "container/writer.h"
#include "codec/backend.h"
#include "io/file.h"

namespace ckpt {

namespace {

namespace ct = container;

/// Phase 2: every byte outside moment storages into /raw, in file order, and the hashes of
/// the non-moment storages into the manifest, span by span as phase 3 reaches them. A
/// parameter's theta storage (read by phase 3 for the Adam L2 gradient domain) that is
/// still to come in file order is read once: take() copies the spans before it, and phase
/// 3 appends the theta bytes it reads (ThetaToRaw).
class RawWriter {
public:
    RawWriter(ct::ContainerWriter& out, const io::InputFile& f, ct::Manifest& man, Progress& prog)
        : out_(out), f_(f), man_(man), prog_(prog), spans_(ct::source_spans(man)), span_of_(man.storages.size()) {
        for (std::size_t i = 0; i < spans_.size(); ++i)
            if (spans_[i].storage >= 0) span_of_[std::size_t(spans_[i].storage)] = i;
    }
    /// Whether storage s (not a moment) is exactly `nbytes` long and not yet copied; then
    /// every span before it is copied, and its bytes are the caller's to append, in order.
    bool take(int64_t s, uint64_t nbytes) {
        const std::size_t i = span_of_[std::size_t(s)];
        if (i < next_ || spans_[i].moment || spans_[i].size() != nbytes) return false;
        copy_before(i);
        next_ = i + 1;
        return true;
    }
    /// Copy every span not yet copied and close /raw.
    void finish() {
        copy_before(spans_.size());
        out_.end_raw();
    }

private:
    /// Copy spans [next_, end): each piece read (pread) straight into /raw's chunk being
    /// filled (ContainerWriter::raw_room) and hashed there, no copy in between.
    void copy_before(std::size_t end) {
        for (; next_ < end; ++next_) {
            const ct::SourceSpan& sp = spans_[next_];
            if (sp.moment) continue;
            XXH3_64bits_reset(h_.get());
            XXH3_state_t* h = sp.storage >= 0 ? h_.get() : nullptr;
            for (uint64_t off = sp.begin; off < sp.end;) {
                std::size_t n = std::size_t(sp.end - off);  // raw_room: what fits in the chunk
                unsigned char* p = out_.raw_room(n);
                f_.read_at(off, p, n, "raw bytes");
                if (h) XXH3_64bits_update(h, p, n);
                out_.raw_commit(n);
                off += n;
                prog_.advance(n);
            }
            if (h) man_.storages[std::size_t(sp.storage)].xxh3 = XXH3_64bits_digest(h);
        }
    }
    ct::ContainerWriter& out_;
    const io::InputFile& f_;
    ct::Manifest& man_;
    Progress& prog_;
    std::vector<ct::SourceSpan> spans_;
    std::vector<std::size_t> span_of_;  ///< storage index -> its span
    std::size_t next_ = 0;              ///< the first span not yet copied
    Xxh3State h_ = make_xxh3();
};

/// Buffers of one chunk's moment and parameter bytes and values, reused across chunks and
/// parameters: they only grow (no zero-fill per chunk). F32 bytes are read straight into
/// the values (a little-endian copy, as bytes_to_float's); raw[k] points at moment k's
/// bytes as read, in either case.
struct ChunkBuffers {
    std::vector<uint8_t> bytes[3], tbytes;
    std::vector<float> vals[3], theta;
    const uint8_t* raw[3] = {};
    const uint8_t* theta_raw = nullptr;  ///< theta's bytes as read (when read)
};

/// Read n elements of `dtype` at source offset `off` into values (through `bytes` unless
/// F32: element_bytes); returns the bytes as read.
const uint8_t* read_floats(const io::InputFile& f, uint64_t off, DType dtype, std::size_t n, std::vector<float>& values,
                           std::vector<uint8_t>& bytes, const char* what) {
    float* vals = room(values, n);
    uint8_t* raw = element_bytes(dtype, vals, n, bytes);
    f.read_at(off, raw, n * float_dtype_size(dtype), what);
    if (dtype != DType::F32) bytes_to_float(dtype, raw, n, vals);
    return raw;
}

/// Where parameter e's theta is read from: its manifest storage when the certificate needs it
/// (ParamEntry::theta_storage), else `counted` (the report's ulp count; storage -1: none).
Layout::ThetaAt theta_of(const ct::ParamEntry& e, const Layout::ThetaAt& counted = {}) {
    if (e.theta_storage >= 0) return {e.theta_storage, e.theta_dtype.value_or(DType::F32)};
    return counted;
}

/// Read coordinates [i0, i0+n) of parameter e (moments, and theta from `theta` when it has a
/// storage: into b.theta, handed to the codec only when e's certificate needs it) from the
/// source; hashes the moment bytes into hs and counts progress when given; hashes the theta
/// bytes into theta_hash when given (the caller appends them to /raw: RawWriter::take).
codec::ChunkIn read_chunk(const io::InputFile& f, const ct::Manifest& man, const ct::ParamEntry& e, uint64_t i0,
                          std::size_t n, ChunkBuffers& b, const Xxh3State* hs, Progress* prog,
                          const Layout::ThetaAt& theta, XXH3_state_t* theta_hash = nullptr) {
    const std::size_t es = float_dtype_size(e.dtype);
    const int nm = e.moments();
    codec::ChunkIn ci;
    ci.n = n;
    for (int k = 0; k < nm; ++k) {
        const auto& st = man.storages[std::size_t(e.storage[k])];
        b.raw[k] = read_floats(f, st.offset + i0 * es, e.dtype, n, b.vals[k], b.bytes[k], "moment storage");
        if (hs) XXH3_64bits_update(hs[k].get(), b.raw[k], n * es);
        if (prog) prog->advance(n * es);
    }
    ci.m = b.vals[0].data();
    ci.v = b.vals[1].data();
    ci.vmax = nm == 3 ? b.vals[2].data() : nullptr;
    b.theta_raw = nullptr;
    if (theta.storage >= 0) {
        const auto& st = man.storages[std::size_t(theta.storage)];
        const std::size_t ts = float_dtype_size(theta.dtype);
        b.theta_raw = read_floats(f, st.offset + i0 * ts, theta.dtype, n, b.theta, b.tbytes, "parameter storage");
        if (e.theta_storage >= 0) ci.theta = b.theta.data();
        if (theta_hash) XXH3_64bits_update(theta_hash, b.theta_raw, n * ts);
    }
    return ci;
}

/// One warning line per reason a state is kept exact ("kept exact: NAdam state (not Adam):
/// 2 tensors (a.weight, a.bias)"), naming at most 3 tensors.
void warn_kept(const std::string& in, const std::vector<TensorRow>& kept) {
    std::vector<std::pair<std::string, std::vector<std::string>>> by_note;  // in first-seen order
    for (const auto& k : kept) {
        auto it = std::find_if(by_note.begin(), by_note.end(), [&](const auto& b) { return b.first == k.note; });
        if (it == by_note.end()) it = by_note.insert(by_note.end(), {k.note, {}});
        it->second.push_back(k.name);
    }
    for (const auto& [note, names] : by_note) {
        std::string list;
        for (std::size_t i = 0; i < names.size() && i < 3; ++i) list += (i ? ", " : "") + names[i];
        if (names.size() > 3) list += fmt::format(", ... {} more", names.size() - 3);
        spdlog::warn("{}: {}: {} tensor{} ({})", in, note, names.size(), names.size() == 1 ? "" : "s", list);
    }
}

/// When more than 5% of the moment values escaped: estimate, on a sample (the first 16k
/// coordinates of every coded parameter), what a larger tolerance or the bf16 codec would
/// escape, and say so in one warning line with the escapes by cause and what each means;
/// options as the caller spells them (CompressOptions::python_names).
void warn_escapes(const io::InputFile& f, const ct::Manifest& man, const Report& rep, bool python_names) {
    uint64_t values = 0, esc = 0;  // coded tensors only: a state kept exact has its own note
    for (const auto& r : rep.rows)
        if (r.note.empty()) values += r.values, esc += r.escapes;
    if (!values || double(esc) <= 0.05 * double(values)) return;
    struct Try { codec::Kind kind; double tol; uint64_t esc = 0, n = 0; };
    std::vector<Try> tries;
    for (double x : {2.0, 5.0, 10.0})
        if (man.tolerance * x <= 1) tries.push_back({man.codec, man.tolerance * x});
    if (man.codec != codec::Kind::BF16) tries.push_back({codec::Kind::BF16, man.tolerance});
    ChunkBuffers b;
    for (const auto& e : man.params) {
        const std::size_t n = std::size_t(std::min<uint64_t>(e.numel, 16384));
        const codec::ChunkIn ci = read_chunk(f, man, e, 0, n, b, nullptr, nullptr, theta_of(e));
        for (auto& t : tries) {
            t.esc += codec::encode_chunk(ct::tensor_setup(e, t.kind, t.tol), ci).escapes.size() * uint64_t(e.moments());
            t.n += n * uint64_t(e.moments());
        }
    }
    std::string s;
    for (const auto& t : tries)
        if (t.n)
            s += fmt::format("{}{} escapes {:.1f}%", s.empty() ? "" : ", ",
                             t.kind != man.codec ? fmt::format(fmt::runtime(python_names ? "codec='{}'" : "--codec {}"), codec::kind_name(t.kind))
                                                 : fmt::format(fmt::runtime(python_names ? "tolerance={}" : "--tolerance {}"), t.tol),
                             100.0 * double(t.esc) / double(t.n));
    const auto& causes = rep.escape_causes;  // moment values, as the percentage
    spdlog::warn("{}: {:.1f}% of the moment values escaped (more than 5%; stored exactly, so only the size suffers){}; by "
                 "cause: {} no code (a value the block's codes cannot represent), {} certificate (coded, but the "
                 "guard could not prove the update bound), {} non-finite (NaN or inf)",
                 f.path(), 100.0 * double(esc) / double(values), s.empty() ? "" : "; on a sample: " + s, causes[0], causes[1],
                 causes[2]);
}

/// xxh3 of one parameter's codes per role, as encoded (VerifyOptions::code_hashes).
using CodeHashes = std::array<uint64_t, 3>;

/// The ulp regime of one parameter (TensorRow::ulp_regime): where its theta lies and the
/// threshold 2^23 tolerance lr (|theta| above it: ulp32(theta) can exceed tolerance x lr).
struct UlpCount {
    Layout::ThetaAt at;
    double threshold = 0;
    int64_t count = -1;  ///< coded coordinates (escapes excluded) above the threshold; -1 unknown
};

/// Count the coordinates of a chunk whose |theta| is above u.threshold, escaped ones
/// excepted (their moments are exact, so the parameter is too). theta: the chunk's values.
void count_ulp_regime(const float* theta, std::size_t n, const std::vector<uint32_t>& escapes, UlpCount& u) {
    const float thr = float(u.threshold);  // float(2^23 tau lr): |theta| > thr in float compares the same where it matters
    int64_t c = 0;
    for (std::size_t i = 0; i < n; ++i) c += std::fabs(theta[i]) > thr;
    for (uint32_t li : escapes) c -= std::fabs(theta[li]) > thr;
    u.count += c;
}

/// Phase 3: encode parameter e chunk by chunk into the moment streams; the hashes of its
/// moment storages into the manifest (bufs: two sets of reused chunk buffers). Its theta
/// storage (the certificate's, or the one `ulp` counts on), when `raw` has not copied it yet,
/// goes into /raw as it is read, so theta is read once. A pipeline of three stages: the lane
/// reads and hashes chunk c+1 and hashes chunk c-1's codes (and counts its ulp regime) while
/// the worker pool encodes chunk c, then this thread appends c to the container. Returns the
/// hashes of its codes.
CodeHashes encode_param(const io::InputFile& f, ct::Manifest& man, ct::ParamEntry& e, const codec::TensorSetup& setup,
                        const codec::Device device, std::size_t chunk, ct::ContainerWriter& out, RawWriter& raw,
                        Progress& prog, ChunkBuffers (&bufs)[2], UlpCount* ulp, SerialLane& lane) {
    const int nm = e.moments();
    const std::size_t es = float_dtype_size(e.dtype);
    const Xxh3State ht = make_xxh3();
    const Layout::ThetaAt theta = theta_of(e, ulp ? ulp->at : Layout::ThetaAt{});
    const std::size_t ts = theta.storage >= 0 ? float_dtype_size(theta.dtype) : 0;
    const bool fused = theta.storage >= 0 && raw.take(theta.storage, e.numel * ts);
    out.begin_param(e);
    const Xxh3State hs[3] = {make_xxh3(), make_xxh3(), make_xxh3()};
    const Xxh3State hc[3] = {make_xxh3(), make_xxh3(), make_xxh3()};
    std::array<std::vector<uint32_t>, 3> bits;   // exact bits of the escaped values, per role
    struct Slot {
        codec::ChunkIn ci;
        codec::ChunkOut co;
        std::future<void> read, post;   // the lane's tasks on this slot's buffers
    } slot[2];
    // the lane's copy of a chunk's theta bytes into /raw (ContainerWriter::stage_raw: no libhdf5
    // call, beside the encode), settled by this thread before it appends the chunk
    std::future<void> to_raw;
    const bool stage = fused && out.raw_stageable();
    LaneTasks wait{{&slot[0].read, &slot[0].post, &slot[1].read, &slot[1].post, &to_raw}};
    auto start_read = [&](int s, uint64_t i0) {
        if (slot[s].post.valid()) slot[s].post.get();   // the codes hashed before the buffers are reused
        const std::size_t n = std::size_t(std::min<uint64_t>(chunk, e.numel - i0));
        slot[s].read = lane.submit([&, s, i0, n] {
            slot[s].ci = read_chunk(f, man, e, i0, n, bufs[s], hs, nullptr, theta, fused ? ht.get() : nullptr);
        });
    };
    if (e.numel) start_read(0, 0);
    int s = 0;
    for (uint64_t i0 = 0; i0 < e.numel; i0 += chunk, s ^= 1) {
        const std::size_t n = std::size_t(std::min<uint64_t>(chunk, e.numel - i0));
        if (i0 + chunk < e.numel) start_read(s ^ 1, i0 + chunk);
        slot[s].read.get();
        prog.advance(n * es * std::size_t(nm));
        ChunkBuffers& b = bufs[s];
        if (stage) {
            to_raw = lane.submit([&out, p = b.theta_raw, bytes = n * ts] { out.stage_raw(p, bytes); });
            prog.advance(n * ts);
        } else if (fused) {
            out.append_raw(b.theta_raw, n * ts);
            prog.advance(n * ts);
        }
        codec::ChunkOut& co = slot[s].co;
        codec::backend(device).encode(setup, slot[s].ci, co);
        if (to_raw.valid()) {
            to_raw.get();
            out.settle_raw();   // the batches it filled written now, where append_raw wrote them
        }
        slot[s].post = lane.submit([&, s, n] {
            const codec::ChunkOut& c = slot[s].co;
            if (ulp) count_ulp_regime(bufs[s].theta.data(), n, c.escapes, *ulp);
            for (int k = 0; k < nm; ++k) XXH3_64bits_update(hc[k].get(), c.codes[k].data(), c.codes[k].size());
        });
        for (int k = 0; k < nm; ++k) {
            bits[std::size_t(k)].clear();
            for (uint32_t li : co.escapes) bits[std::size_t(k)].push_back(element_bits(e.dtype, b.raw[k], li));
        }
        out.append_chunk(i0, co, bits);
    }
    for (auto& sl : slot)
        if (sl.post.valid()) sl.post.get();
    CodeHashes h{};
    for (int k = 0; k < nm; ++k) {
        man.storages[std::size_t(e.storage[k])].xxh3 = XXH3_64bits_digest(hs[k].get());
        h[std::size_t(k)] = XXH3_64bits_digest(hc[k].get());
    }
    if (fused) man.storages[std::size_t(theta.storage)].xxh3 = XXH3_64bits_digest(ht.get());
    return h;
}

/// What phases 2 and 3 give the rest: the hashes of every parameter's codes and of the
/// manifest's text (for the self-check: VerifyOptions::code_hashes, manifest_xxh3), and per
/// parameter its ulp-regime count (TensorRow::ulp_regime).
struct Written {
    std::vector<CodeHashes> codes;
    uint64_t manifest_xxh3 = 0;
    std::vector<int64_t> ulp_regime;
};

/// Phases 2 and 3 into the container at `path`: /raw and the moment streams (filling the
/// manifest's hashes, stream offsets, escapes and bounds), then the manifest itself.
/// `theta`: Layout::theta (per parameter; counted under the default bound only).
Written write_container(const std::string& path, const io::InputFile& f, ct::Manifest& man,
                        const std::vector<Layout::ThetaAt>& theta, const CompressOptions& o, codec::Device device) {
    ct::ContainerWriter out(path);
    Progress prog(o.progress, "ckpt-compress", f.size(), man.params.size());
    out.begin_moments(man);
    SerialLane lane(codec::cpu_threads() > 1);  // declared after out: its tasks end first
    RawWriter raw(out, f, man, prog);
    const std::size_t unit = codec::entropy_coded(o.codec) ? codec::kSegment : codec::kBlock;  // chunks start on segments
    const std::size_t want = o.chunk ? o.chunk : codec::backend(device).chunk;
    const std::size_t chunk = std::max<std::size_t>(unit, want / unit * unit);
    Written w;
    ChunkBuffers buf[2];
    for (std::size_t j = 0; j < man.params.size(); ++j) {
        ct::ParamEntry& e = man.params[j];
        UlpCount u{theta[j], std::ldexp(o.tolerance * e.hyper.lr, 23), 0};
        const bool count = theta[j].storage >= 0 && !o.bound_param;
        w.codes.push_back(encode_param(f, man, e, ct::tensor_setup(e, o.codec, o.tolerance), device, chunk, out, raw, prog,
                                       buf, count ? &u : nullptr, lane));
        w.ulp_regime.push_back(count ? u.count : -1);
        prog.item_done();
    }
    raw.finish();
    w.manifest_xxh3 = out.finish(man);
    return w;
}

/// Phase 4: what ckpt-verify and ckpt-restore will see, before the rename. Returns the
/// verify report (its rows are the compress report's: one byte accounting for every tool).
/// Throws CheckFailed when the written container fails. On the CPU it decodes codes only
/// and compares them with `codes` (what was encoded); the manifest is compared with
/// `planned`, the plan phase 1 made (VerifyOptions::planned).
Report self_check(const std::string& path, const std::string& in, codec::Device device, const std::vector<CodeHashes>& codes,
                  const Layout& planned, uint64_t manifest_xxh3) {
    VerifyOptions vo;
    vo.planned = &planned;
    vo.tolerance = planned.man.tolerance;  // the certificates are held to compress's own --tolerance
    vo.manifest_xxh3 = manifest_xxh3;
    vo.certificates = device != codec::Device::Cpu;  // a device encoder is checked in full
    vo.code_hashes = &codes;
    Report chk = verify(path, vo);
    if (!chk.ok) {
        std::string why;
        for (const auto& s : chk.failures) why += (why.empty() ? "" : "; ") + s;
        throw CheckFailed(in + ": the written container failed its own verification (nothing written): " + why);
    }
    return chk;
}

}  // namespace

namespace {
/// The options' checks, before the input is opened; returns the device to encode on.
codec::Device check_options(const std::string& in, const CompressOptions& o) {
    if (!(o.tolerance > 0 && o.tolerance <= 1)) throw BadInput(in, "--tolerance must be in (0, 1] (units of lr)");
    if (!(o.grad_bound > 0)) throw BadInput(in, "grad bound must be positive");
    try { return codec::resolve_device(o.device); } catch (const std::exception& e) { throw BadInput(in, e.what()); }
}

Report compress_input(const io::InputFile& f, const std::string& out, const CompressOptions& o, codec::Device device);
}  // namespace

Report compress(const std::string& in, const std::string& out, const CompressOptions& o) {
    const codec::Device device = check_options(in, o);
    const io::InputFile f(in);
    return compress_input(f, out, o, device);
}

Report compress(const io::InputFile& f, const std::string& out, const CompressOptions& o) {
    return compress_input(f, out, o, check_options(f.path(), o));
}

namespace {
Report compress_input(const io::InputFile& f, const std::string& out, const CompressOptions& o, codec::Device device) {
    const std::string& in = f.path();
    // phase 1; the parsed checkpoint is dropped once planned (only the plan is needed
    // after, and the tree is the largest object on files of many tensors)
    Layout L = plan_layout(read_checkpoint(f, o.limits), f, o);
    ct::Manifest& man = L.man;
    warn_kept(in, L.kept);
    if (man.params.empty() && L.kept.empty())  // CompressOptions::allow_no_state
        spdlog::warn("{}: no optimizer state: nothing was coded, the checkpoint is stored exactly", in);
    for (const auto& k : L.kept) man.kept.push_back({k.name, k.values, k.bytes_out, k.note});

    AtomicOutput atomic(out);
    Report rep("ckpt-compress", in, out, codec::kind_name(o.codec), o.tolerance, o.grad_bound);
    rep.horizon = o.horizon;
    rep.bound_param = o.bound_param;
    try {
        const Written w = write_container(atomic.temp_path(), f, man, L.theta, o, device);  // phases 2 and 3
        const Report chk = self_check(atomic.temp_path(), in, device, w.codes, L, w.manifest_xxh3);  // phase 4
        rep.rows = chk.rows;
        for (std::size_t j = 0; j < w.ulp_regime.size(); ++j) rep.rows[j].ulp_regime = w.ulp_regime[j];  // rows j: params j
        rep.groups = chk.groups;
        rep.bits = chk.bits;
        rep.escape_causes = chk.escape_causes;
    } catch (const BadInput&) {
        throw;
    } catch (const CheckFailed&) {
        throw;
    } catch (const std::runtime_error& e) {  // HDF5 write failures: name the output, not the temporary
        std::string why = e.what();
        if (why.rfind(atomic.temp_path() + ": ", 0) == 0) why.erase(0, atomic.temp_path().size() + 2);
        throw BadInput(out, why);
    }
    try {
        atomic.commit();
    } catch (const std::runtime_error& e) {
        throw BadInput(out, e.what());
    }
    rep.file_bytes_in = f.size();
    rep.file_bytes_out = io::InputFile(out).size();
    rep.ok = rep.max_bound() <= o.tolerance;
    warn_escapes(f, man, rep, o.python_names);
    return rep;
}
}  // namespace

}  // namespace ckpt
