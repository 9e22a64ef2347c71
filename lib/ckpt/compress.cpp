// ckpt-compress: raw bytes stream into /raw in file order; each compressible parameter's
// moments stream through the codec chunk by chunk (memory bounded by the chunk).
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "common/xxh3.h"
#include "ckpt/pipeline.h"
#include "ckpt/values.h"
#include "common/error.h"
#include "common/file.h"
#include "container/h5.h"
#include "container/manifest.h"
#include "gpu_codec.h"
#include "io/file.h"

namespace ckpt {

namespace {

namespace ct = container;

std::string basename_of(const std::string& p) {
    const auto s = p.rfind('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

/// Gradient-domain rule of one parameter (SPEC §2.2).
codec::DomainRule domain_for(const ParamState& p, const CompressOptions& o, const std::string& file) {
    codec::DomainRule d;
    d.grad_bound = o.grad_bound;
    d.weight_decay = p.hyper.weight_decay;
    const bool wd = p.hyper.weight_decay != 0;
    bool adamw = false, adam = false;
    if (o.optimizer == "adamw") adamw = true;
    else if (o.optimizer == "adam") adam = true;
    else if (p.decoupled) (*p.decoupled ? adamw : adam) = true;
    else { adamw = true; adam = true; }  // unknown kind: union of both domains
    d.plain = adamw || !wd;
    d.l2 = adam && wd;
    if (d.l2 && std::isfinite(o.grad_bound) && p.theta < 0) {
        if (!o.param_bound)
            throw BadInput(file, "cannot locate the parameter of optimizer state " + p.index +
                                     " for the Adam L2 gradient domain; pass --optimizer adamw, "
                                     "--grad-bound inf or --param-bound B");
        d.theta_bound = *o.param_bound;
    }
    return d;
}

}  // namespace

Report compress(const std::string& in, const std::string& out, const CompressOptions& o) {
    if (!(o.tolerance > 0)) throw BadInput(in, "tolerance must be positive");
    if (!(o.grad_bound > 0)) throw BadInput(in, "grad bound must be positive");
    gpu::Device device;
    try { device = gpu::resolve_device(o.device); } catch (const std::exception& e) { throw BadInput(in, e.what()); }
    const io::InputFile f(in);
    const Checkpoint ck = read_checkpoint(in, o.limits);
    const std::vector<ParamState> states = find_param_states(ck, f, o.hyper);
    if (states.empty()) throw BadInput(in, "no Adam/AdamW optimizer state (exp_avg, exp_avg_sq) found");

    Report rep("ckpt-compress", in, out, codec::kind_name(o.codec), o.tolerance, o.grad_bound);
    rep.file_bytes_in = f.size();

    ct::Manifest man;
    man.tool_version = CKPTKIT_VERSION;
    man.source_format = format_name(ck.format);
    man.source_name = basename_of(in);
    man.source_size = f.size();
    man.codec = o.codec;
    man.tolerance = o.tolerance;
    man.grad_bound = o.grad_bound;
    man.optimizer = o.optimizer;
    for (const auto& s : ck.storages) {
        ct::StorageEntry e;
        e.offset = s.file_offset;
        e.nbytes = s.nbytes;
        e.crc_offsets = s.crc_offsets;
        man.storages.push_back(e);
    }
    // Parameters whose moments become codes.
    struct Job { const ParamState* p; codec::TensorSetup setup; int theta_storage; };
    std::vector<Job> jobs;
    for (const auto& p : states) {
        const int nm = p.hyper.amsgrad ? 3 : 2;
        if (!p.compressible) {
            TensorRow row;
            row.name = p.name;
            for (int k = 0; k < nm; ++k)
                if (p.tensor[k] >= 0) {
                    const auto& t = ck.tensors[std::size_t(p.tensor[k])];
                    const uint64_t n = ck.storages[t.storage].numel;
                    row.values += n;
                    row.bytes_fp32 += 4 * n;
                    row.bytes_out += ck.storages[t.storage].nbytes;
                }
            row.escapes = row.values;
            row.note = "kept exact: " + p.why_not;
            spdlog::warn("{}: {} {}", in, p.name, row.note);
            rep.rows.push_back(row);
            continue;
        }
        ct::ParamEntry e;
        e.name = p.name;
        const TensorInfo& m = ck.tensors[std::size_t(p.tensor[0])];
        e.numel = ck.storages[m.storage].numel;
        e.dtype = dtype_name(m.dtype);
        e.hyper = p.hyper;
        e.domain = domain_for(p, o, in);
        Job j{&p, {}, -1};
        j.setup.kind = o.codec;
        j.setup.hyper = p.hyper;
        j.setup.tolerance = o.tolerance;
        j.setup.domain = e.domain;
        j.setup.type = e.dtype == "F32" ? codec::MomentType::F32 : e.dtype == "F16" ? codec::MomentType::F16 : codec::MomentType::BF16;
        const bool need_theta = e.domain.l2 && std::isfinite(o.grad_bound) && p.theta >= 0;
        if (need_theta) {
            const TensorInfo& th = ck.tensors[std::size_t(p.theta)];
            const auto& st = ck.storages[th.storage];
            if (float_dtype_size(dtype_name(th.dtype)) == 0 || th.storage_offset != 0 || st.numel != e.numel)
                throw BadInput(in, "parameter of state " + p.index + " is not a whole FP32/F16/BF16 storage; pass --param-bound B");
            e.theta_storage = int64_t(th.storage);
            e.theta_dtype = dtype_name(th.dtype);
        }
        for (int k = 0; k < nm; ++k) {
            const std::size_t s = ck.tensors[std::size_t(p.tensor[k])].storage;
            e.storage[k] = int(s);
            man.storages[s].param = int(man.params.size());
            man.storages[s].role = k;
        }
        j.theta_storage = int(e.theta_storage);
        man.params.push_back(e);
        jobs.push_back(j);
    }
    for (const auto& e : man.params)
        if (e.theta_storage >= 0 && man.storages[std::size_t(e.theta_storage)].param >= 0)
            throw BadInput(in, "parameter storage of " + e.name + " is also a moment storage");

    AtomicOutput atomic(out);
    uint64_t total_out = 0;
    try {
        ct::Handle file = ct::create_file(atomic.temp_path());
        uint64_t work = f.size();
        Progress prog(o.progress, "ckpt-compress", work, jobs.size());
        // 1. /raw: every byte outside moment storages, in file order; hash raw storages.
        {
            ct::Appender raw(file.get(), ct::kRaw, H5T_NATIVE_UINT8, 1);
            std::vector<uint8_t> buf(1 << 20);
            uint64_t pos = 0;
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
            total_out += raw.finish();
        }
        // 2. moment streams.
        const int roles = std::any_of(man.params.begin(), man.params.end(), [](auto& p) { return p.hyper.amsgrad; }) ? 3 : 2;
        const int cb = codec::code_bytes(o.codec), pb = codec::params_per_block(o.codec);
        std::vector<std::unique_ptr<ct::Appender>> codes, params, escv;
        for (int r = 0; r < roles; ++r) {
            codes.push_back(std::make_unique<ct::Appender>(file.get(), ct::codes_path(r), H5T_NATIVE_UINT8, 1));
            params.push_back(std::make_unique<ct::Appender>(file.get(), ct::params_path(r), H5T_NATIVE_INT16, 2));
            escv.push_back(std::make_unique<ct::Appender>(file.get(), ct::escapes_path(r), H5T_NATIVE_UINT32, 4));
        }
        ct::Appender escidx(file.get(), ct::kEscapeIndex, H5T_NATIVE_UINT64, 8);
        std::vector<double> est(jobs.size(), 0);
        const std::size_t chunk = std::max<std::size_t>(codec::kBlock, o.chunk / codec::kBlock * codec::kBlock);
        const Xxh3State hs[3] = {make_xxh3(), make_xxh3(), make_xxh3()};
        // chunk buffers, reused by every tensor (allocated and cleared once)
        std::vector<uint8_t> bytes[3];
        std::vector<float> vals[3], theta;
        std::vector<uint8_t> tbytes;
        for (std::size_t j = 0; j < jobs.size(); ++j) {
            ct::ParamEntry& e = man.params[j];
            const int nm = e.moments();
            const std::size_t es = float_dtype_size(e.dtype);
            e.code_offset = codes[0]->count() / std::size_t(cb);
            e.block_offset = params[0]->count() / std::size_t(std::max(pb, 1));
            if (pb == 0) e.block_offset = 0;
            e.escape_offset = escidx.count();
            for (int k = 0; k < nm; ++k) XXH3_64bits_reset(hs[k].get());
            uint64_t last_escape = 0;
            for (uint64_t i0 = 0; i0 < e.numel; i0 += chunk) {
                const std::size_t n = std::size_t(std::min<uint64_t>(chunk, e.numel - i0));
                codec::ChunkIn ci;
                ci.n = n;
                for (int k = 0; k < nm; ++k) {
                    const auto& st = man.storages[std::size_t(e.storage[k])];
                    bytes[k].resize(n * es);
                    vals[k].resize(n);
                    f.read_at(st.offset + i0 * es, bytes[k].data(), n * es, "moment storage");
                    XXH3_64bits_update(hs[k].get(), bytes[k].data(), n * es);
                    bytes_to_float(e.dtype, bytes[k].data(), n, vals[k].data());
                    prog.advance(n * es);
                }
                ci.m = vals[0].data();
                ci.v = vals[1].data();
                ci.vmax = nm == 3 ? vals[2].data() : nullptr;
                if (e.theta_storage >= 0) {
                    const auto& st = man.storages[std::size_t(e.theta_storage)];
                    const std::size_t ts = float_dtype_size(e.theta_dtype);
                    tbytes.resize(n * ts);
                    theta.resize(n);
                    f.read_at(st.offset + i0 * ts, tbytes.data(), n * ts, "parameter storage");
                    bytes_to_float(e.theta_dtype, tbytes.data(), n, theta.data());
                    ci.theta = theta.data();
                }
                const codec::ChunkOut co = gpu::encode_chunk_on(device, jobs[j].setup, ci);
                for (int k = 0; k < nm; ++k) {
                    codes[std::size_t(k)]->append(co.codes[k].data(), co.codes[k].size());
                    params[std::size_t(k)]->append(co.params[k].data(), co.params[k].size());
                    est[j] += double(co.codes[k].size() + 2 * co.params[k].size());
                }
                for (uint32_t li : co.escapes) {
                    const uint64_t gi = i0 + li;
                    const uint64_t delta = gi - last_escape;
                    last_escape = gi;
                    escidx.append(&delta, 1);
                    for (int k = 0; k < nm; ++k) {
                        const uint32_t b = element_bits(e.dtype, bytes[k].data(), li);
                        escv[std::size_t(k)]->append(&b, 1);
                    }
                    est[j] += 8.0 + 4.0 * nm;
                }
                // roles this param does not use stay aligned with zero-filled escape rows
                for (int k = nm; k < roles; ++k) {
                    const uint32_t zero = 0;
                    for (std::size_t q = 0; q < co.escapes.size(); ++q) escv[std::size_t(k)]->append(&zero, 1);
                }
                e.escapes += co.escapes.size();
                e.max_bound = std::max(e.max_bound, co.max_bound);
            }
            for (int k = 0; k < nm; ++k) man.storages[std::size_t(e.storage[k])].xxh3 = XXH3_64bits_digest(hs[k].get());
            prog.item_done();
        }
        uint64_t moment_out = 0;
        for (int r = 0; r < roles; ++r)
            moment_out += codes[std::size_t(r)]->finish() + params[std::size_t(r)]->finish() + escv[std::size_t(r)]->finish();
        moment_out += escidx.finish();
        // per-tensor metadata: the manifest's params part
        moment_out += ct::param_metadata_bytes(man, ct::write_manifest(file.get(), man));
        total_out += moment_out;
        ct::set_attr(file.get(), "format", std::string("ckptkit-container"));
        ct::set_attr(file.get(), "format_version", uint64_t(ct::kFormatVersion));
        file.close_checked();
        // apportion the stored moment bytes to parameters by their uncompressed share
        double est_total = 0;
        for (double x : est) est_total += x;
        for (std::size_t j = 0; j < jobs.size(); ++j) {
            const ct::ParamEntry& e = man.params[j];
            TensorRow row;
            row.name = e.name;
            row.values = e.numel * uint64_t(e.moments());
            row.escapes = e.escapes * uint64_t(e.moments());
            row.bytes_fp32 = 4 * row.values;
            row.bytes_out = uint64_t(std::llround(est_total > 0 ? double(moment_out) * est[j] / est_total : 0));
            row.max_bound = e.max_bound;
            rep.rows.push_back(row);
        }
    } catch (const BadInput&) {
        throw;
    } catch (const std::runtime_error& e) {  // HDF5 write failures: name the output
        throw BadInput(out, e.what());
    }
    try {
        atomic.commit();
    } catch (const std::runtime_error& e) {
        throw BadInput(out, e.what());
    }
    rep.file_bytes_out = io::InputFile(out).size();
    rep.ok = rep.max_bound() <= o.tolerance;
    return rep;
}

}  // namespace ckpt
