// ckpt-compress in four phases: plan (layout.h: which storages become codes, under which
// guarantee), /raw (every other byte, in file order, hashed), the moment streams (each
// compressible parameter chunk by chunk through the codec; memory bounded by the chunk),
// and a self-check: the written container must pass ckpt-verify (hence restore) before it
// is renamed into place, so no container this tool calls ok fails to restore.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "ckpt/layout.h"
#include "ckpt/pipeline.h"
#include "ckpt/values.h"
#include "common/error.h"
#include "common/file.h"
#include "common/xxh3.h"
#include "container/h5.h"
#include "container/manifest.h"
#include "gpu_codec.h"
#include "io/file.h"

namespace ckpt {

namespace {

namespace ct = container;

/// Phase 2: every byte outside moment storages into /raw, in file order; hashes of the
/// non-moment storages into the manifest. Returns the stored bytes.
uint64_t write_raw(hid_t file, const io::InputFile& f, ct::Manifest& man, Progress& prog) {
    ct::Appender raw(file, ct::kRaw, H5T_NATIVE_UINT8, 1);
    std::vector<uint8_t> buf(1 << 20);
    auto copy = [&](uint64_t from, uint64_t to, XXH3_state_t* h) {
        for (uint64_t off = from; off < to;) {
            const uint64_t n = std::min<uint64_t>(buf.size(), to - off);
            f.read_at(off, buf.data(), n, "raw bytes");
            raw.append(buf.data(), n);
            if (h) XXH3_64bits_update(h, buf.data(), n);
            off += n;
            prog.advance(n);
        }
    };
    const Xxh3State h = make_xxh3();
    uint64_t pos = 0;
    for (auto& s : man.storages) {
        copy(pos, s.offset, nullptr);
        if (s.param < 0) {
            XXH3_64bits_reset(h.get());
            copy(s.offset, s.offset + s.nbytes, h.get());
            s.xxh3 = XXH3_64bits_digest(h.get());
        }
        pos = s.offset + s.nbytes;
    }
    copy(pos, f.size(), nullptr);
    return raw.finish();
}

/// The moment datasets of every role: codes, block parameters and escape rows. A
/// parameter with fewer moments than the file's widest (no amsgrad next to amsgrad
/// groups) gets zero codes, zero block parameters and zero escape rows in the roles it
/// lacks, so every role's streams stay aligned with the manifest's offsets.
struct Streams {
    Streams(hid_t file, int roles) : escidx(file, ct::kEscapeIndex, H5T_NATIVE_UINT64, 8) {
        for (int r = 0; r < roles; ++r) {
            codes.push_back(std::make_unique<ct::Appender>(file, ct::codes_path(r), H5T_NATIVE_UINT8, 1));
            params.push_back(std::make_unique<ct::Appender>(file, ct::params_path(r), H5T_NATIVE_INT16, 2));
            escv.push_back(std::make_unique<ct::Appender>(file, ct::escapes_path(r), H5T_NATIVE_UINT32, 4));
        }
    }
    std::vector<std::unique_ptr<ct::Appender>> codes, params, escv;
    ct::Appender escidx;
    void finish() {
        for (std::size_t r = 0; r < codes.size(); ++r) { codes[r]->finish(); params[r]->finish(); escv[r]->finish(); }
        escidx.finish();
    }
};

/// Reused buffers of one chunk's moment and parameter bytes and values.
struct ChunkBuffers {
    std::vector<uint8_t> bytes[3], tbytes;
    std::vector<float> vals[3], theta;
};

/// Read coordinates [i0, i0+n) of parameter e (moments, and theta when its domain needs
/// it) from the source; hashes the moment bytes into hs and counts progress when given.
codec::ChunkIn read_chunk(const io::InputFile& f, const ct::Manifest& man, const ct::ParamEntry& e, uint64_t i0,
                          std::size_t n, ChunkBuffers& b, const Xxh3State* hs, Progress* prog) {
    const std::size_t es = float_dtype_size(e.dtype);
    const int nm = e.moments();
    codec::ChunkIn ci;
    ci.n = n;
    for (int k = 0; k < nm; ++k) {
        const auto& st = man.storages[std::size_t(e.storage[k])];
        b.bytes[k].resize(n * es);
        b.vals[k].resize(n);
        f.read_at(st.offset + i0 * es, b.bytes[k].data(), n * es, "moment storage");
        if (hs) XXH3_64bits_update(hs[k].get(), b.bytes[k].data(), n * es);
        bytes_to_float(e.dtype, b.bytes[k].data(), n, b.vals[k].data());
        if (prog) prog->advance(n * es);
    }
    ci.m = b.vals[0].data();
    ci.v = b.vals[1].data();
    ci.vmax = nm == 3 ? b.vals[2].data() : nullptr;
    if (e.theta_storage >= 0) {
        const auto& st = man.storages[std::size_t(e.theta_storage)];
        const DType td = e.theta_dtype.value_or(DType::F32);
        const std::size_t ts = float_dtype_size(td);
        b.tbytes.resize(n * ts);
        b.theta.resize(n);
        f.read_at(st.offset + i0 * ts, b.tbytes.data(), n * ts, "parameter storage");
        bytes_to_float(td, b.tbytes.data(), n, b.theta.data());
        ci.theta = b.theta.data();
    }
    return ci;
}

/// When more than 5% of the moment values escaped: estimate, on a sample (the first 16k
/// coordinates of every coded parameter), what a larger tolerance or the bf16 codec would
/// escape, and say so in one warning line.
void warn_escapes(const io::InputFile& f, const ct::Manifest& man, const Report& rep) {
    const uint64_t values = rep.moment_values(), esc = rep.escapes();
    if (!values || double(esc) <= 0.05 * double(values)) return;
    struct Try { codec::Kind kind; double tol; uint64_t esc = 0, n = 0; };
    std::vector<Try> tries;
    for (double x : {2.0, 5.0, 10.0})
        if (man.tolerance * x <= 1) tries.push_back({man.codec, man.tolerance * x});
    if (man.codec != codec::Kind::BF16) tries.push_back({codec::Kind::BF16, man.tolerance});
    ChunkBuffers b;
    for (const auto& e : man.params) {
        const std::size_t n = std::size_t(std::min<uint64_t>(e.numel, 16384));
        const codec::ChunkIn ci = read_chunk(f, man, e, 0, n, b, nullptr, nullptr);
        for (auto& t : tries) {
            t.esc += codec::encode_chunk(ct::tensor_setup(e, t.kind, t.tol), ci).escapes.size() * uint64_t(e.moments());
            t.n += n * uint64_t(e.moments());
        }
    }
    std::string s;
    for (const auto& t : tries)
        if (t.n)
            s += fmt::format("{}{} escapes {:.1f}%", s.empty() ? "" : ", ",
                             t.kind != man.codec ? std::string("--codec ") + codec::kind_name(t.kind) : fmt::format("--tolerance {}", t.tol),
                             100.0 * double(t.esc) / double(t.n));
    spdlog::warn("{}: {:.1f}% of the moment values escaped (more than 5%){}", f.path(), 100.0 * double(esc) / double(values),
                 s.empty() ? "" : "; on a sample: " + s);
}

/// Phase 3: encode parameter e chunk by chunk, appending to the streams.
void encode_param(const io::InputFile& f, ct::Manifest& man, ct::ParamEntry& e, const codec::TensorSetup& setup,
                  const gpu::Device device, std::size_t chunk, Streams& out, Progress& prog) {
    const int nm = e.moments(), roles = int(out.codes.size());
    const int cb = codec::code_bytes(man.codec), pb = codec::params_per_block(man.codec);
    e.code_offset = out.codes[0]->count() / std::size_t(cb);
    e.block_offset = pb == 0 ? 0 : out.params[0]->count() / std::size_t(pb);
    e.escape_offset = out.escidx.count();
    const Xxh3State hs[3] = {make_xxh3(), make_xxh3(), make_xxh3()};
    ChunkBuffers buf;
    std::vector<uint8_t> zeros;
    std::vector<int16_t> zero_params;
    uint64_t last_escape = 0;
    for (uint64_t i0 = 0; i0 < e.numel; i0 += chunk) {
        const std::size_t n = std::size_t(std::min<uint64_t>(chunk, e.numel - i0));
        const codec::ChunkIn ci = read_chunk(f, man, e, i0, n, buf, hs, &prog);
        const codec::ChunkOut co = gpu::encode_chunk_on(device, setup, ci);
        for (int k = 0; k < nm; ++k) {
            out.codes[std::size_t(k)]->append(co.codes[k].data(), co.codes[k].size());
            out.params[std::size_t(k)]->append(co.params[k].data(), co.params[k].size());
        }
        for (int k = nm; k < roles; ++k) {  // aligned filler for roles this parameter lacks
            zeros.assign(co.codes[0].size(), 0);
            zero_params.assign(co.params[0].size(), 0);
            out.codes[std::size_t(k)]->append(zeros.data(), zeros.size());
            out.params[std::size_t(k)]->append(zero_params.data(), zero_params.size());
        }
        for (uint32_t li : co.escapes) {
            const uint64_t gi = i0 + li;
            const uint64_t delta = gi - last_escape;
            last_escape = gi;
            out.escidx.append(&delta, 1);
            for (int k = 0; k < roles; ++k) {
                const uint32_t b = k < nm ? element_bits(e.dtype, buf.bytes[k].data(), li) : 0;
                out.escv[std::size_t(k)]->append(&b, 1);
            }
        }
        e.escapes += co.escapes.size();
        e.max_bound = std::max(e.max_bound, co.max_bound);
    }
    for (int k = 0; k < nm; ++k) man.storages[std::size_t(e.storage[k])].xxh3 = XXH3_64bits_digest(hs[k].get());
}

}  // namespace

Report compress(const std::string& in, const std::string& out, const CompressOptions& o) {
    if (!(o.tolerance > 0 && o.tolerance <= 1)) throw BadInput(in, "--tolerance must be in (0, 1] (units of lr)");
    if (!(o.grad_bound > 0)) throw BadInput(in, "grad bound must be positive");
    gpu::Device device;
    try { device = gpu::resolve_device(o.device); } catch (const std::exception& e) { throw BadInput(in, e.what()); }
    const io::InputFile f(in);
    const Checkpoint ck = read_checkpoint(in, o.limits);
    Layout L = plan_layout(ck, f, o);  // phase 1
    ct::Manifest& man = L.man;
    for (const auto& k : L.kept) {
        spdlog::warn("{}: {} {}", in, k.name, k.note);
        man.kept.push_back({k.name, k.values, k.bytes_out, k.note});
    }

    AtomicOutput atomic(out);
    Report rep("ckpt-compress", in, out, codec::kind_name(o.codec), o.tolerance, o.grad_bound);
    try {
        {
            ct::Handle file = ct::create_file(atomic.temp_path());
            Progress prog(o.progress, "ckpt-compress", f.size(), man.params.size());
            write_raw(file.get(), f, man, prog);  // phase 2
            const int roles = std::any_of(man.params.begin(), man.params.end(), [](auto& p) { return p.hyper.amsgrad; }) ? 3 : 2;
            Streams streams(file.get(), roles);
            const std::size_t chunk = std::max<std::size_t>(codec::kBlock, o.chunk / codec::kBlock * codec::kBlock);
            for (auto& e : man.params) {  // phase 3
                encode_param(f, man, e, ct::tensor_setup(e, o.codec, o.tolerance), device, chunk, streams, prog);
                prog.item_done();
            }
            streams.finish();
            ct::write_manifest(file.get(), man);
            ct::set_attr(file.get(), "format", std::string("ckptkit-container"));
            ct::set_attr(file.get(), "format_version", uint64_t(ct::kFormatVersion));
            file.close_checked();
        }
        // phase 4: what ckpt-verify and ckpt-restore will see, before the rename
        VerifyOptions vo;
        vo.certificates = device != gpu::Device::Cpu;  // a device encoder is checked in full
        const Report chk = verify(atomic.temp_path(), vo);
        if (!chk.ok) {
            std::string why;
            for (const auto& s : chk.failures) why += (why.empty() ? "" : "; ") + s;
            throw CheckFailed(in + ": the written container failed its own verification (nothing written): " + why);
        }
        rep.rows = chk.rows;
        rep.groups = chk.groups;
    } catch (const BadInput&) {
        throw;
    } catch (const CheckFailed&) {
        throw;
    } catch (const std::runtime_error& e) {  // HDF5 write failures: name the output
        throw BadInput(out, e.what());
    }
    try {
        atomic.commit();
    } catch (const std::runtime_error& e) {
        throw BadInput(out, e.what());
    }
    rep.file_bytes_in = f.size();
    rep.file_bytes_out = io::InputFile(out).size();
    rep.ok = rep.max_bound() <= o.tolerance;
    warn_escapes(f, man, rep);
    return rep;
}

}  // namespace ckpt
