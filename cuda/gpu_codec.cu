// Chunked GPU encode/decode: a chunk is cut into slices of kSlice coordinates (whole
// blocks); two lanes (stream + pinned host buffers + device buffers) alternate, so the
// host staging copy and the transfers of one slice overlap the kernels of the other.
// Device and pinned memory are bounded by 2 * kSlice coordinates, whatever the chunk.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "cuda/gpu_codec.h"
#include "cuda/kernels.cuh"

namespace ckpt::gpu {

using detail::check;

namespace {

constexpr std::size_t kSlice = std::size_t(1) << 18;  // coordinates per slice
constexpr std::size_t kSliceBlocks = kSlice / codec::kBlock;
static_assert(kSlice % codec::kBlock == 0, "slices hold whole blocks");

template <class T>
T* dev_alloc(std::size_t n) {
    void* p = nullptr;
    CKPT_CUDA(cudaMalloc(&p, n * sizeof(T)));
    return static_cast<T*>(p);
}
template <class T>
T* host_alloc(std::size_t n) {
    void* p = nullptr;
    CKPT_CUDA(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocDefault));
    return static_cast<T*>(p);
}

/// One lane of the double buffer: everything a slice needs, host (pinned) and device.
struct Lane {
    cudaStream_t st = nullptr;
    // pinned host staging
    float* h_in[4] = {};         // m, v, vmax, theta (encode) / theta (decode, [3])
    uint8_t* h_codes[3] = {};    // kSlice * 2 bytes each
    int16_t* h_params[3] = {};   // kSliceBlocks * 2 each
    uint32_t* h_count = nullptr;
    double* h_max = nullptr;
    float* h_out[3] = {};        // decode output
    double* h_bounds = nullptr;
    unsigned long long* h_bad = nullptr;  // decode: the slice's first block outside the float range (~0: none)
    // device
    float* d_in[4] = {};
    uint8_t* d_codes[3] = {};
    int16_t* d_params[3] = {};
    uint32_t* d_flags = nullptr;
    uint32_t* d_pos = nullptr;
    double* d_block_max = nullptr;
    double* d_max = nullptr;
    uint32_t* d_idx = nullptr;
    uint32_t* d_bits[3] = {};
    uint32_t* d_count = nullptr;
    float* d_out[3] = {};
    double* d_bounds = nullptr;
    unsigned long long* d_bad = nullptr;
    void* d_temp = nullptr;
    std::size_t temp_bytes = 0;
    // slice in flight on this lane
    bool busy = false;
    std::size_t begin = 0, n = 0;
};

/// The process-wide GPU context: created on first use, kept until exit.
struct Context {
    std::mutex mu;
    Lane lane[2];

    Context() {
        for (Lane& l : lane) {
            CKPT_CUDA(cudaStreamCreateWithFlags(&l.st, cudaStreamNonBlocking));
            for (auto& p : l.h_in) p = host_alloc<float>(kSlice);
            for (auto& p : l.h_codes) p = host_alloc<uint8_t>(2 * kSlice);
            for (auto& p : l.h_params) p = host_alloc<int16_t>(2 * kSliceBlocks + 2);
            for (auto& p : l.h_out) p = host_alloc<float>(kSlice);
            l.h_bounds = host_alloc<double>(kSlice);
            l.h_count = host_alloc<uint32_t>(1);
            l.h_max = host_alloc<double>(1);
            l.h_bad = host_alloc<unsigned long long>(1);
            for (auto& p : l.d_in) p = dev_alloc<float>(kSlice);
            for (auto& p : l.d_codes) p = dev_alloc<uint8_t>(2 * kSlice);
            for (auto& p : l.d_params) p = dev_alloc<int16_t>(2 * kSliceBlocks + 2);
            for (auto& p : l.d_bits) p = dev_alloc<uint32_t>(kSlice);
            for (auto& p : l.d_out) p = dev_alloc<float>(kSlice);
            l.d_flags = dev_alloc<uint32_t>(kSlice);
            l.d_pos = dev_alloc<uint32_t>(kSlice);
            l.d_idx = dev_alloc<uint32_t>(kSlice);
            l.d_block_max = dev_alloc<double>(kSliceBlocks);
            l.d_max = dev_alloc<double>(1);
            l.d_count = dev_alloc<uint32_t>(1);
            l.d_bounds = dev_alloc<double>(kSlice);
            l.d_bad = dev_alloc<unsigned long long>(1);
            l.temp_bytes = detail::scan_temp_bytes(kSlice);
            CKPT_CUDA(cudaMalloc(&l.d_temp, l.temp_bytes));
        }
    }
};

Context& context() {
    static Context* c = new Context();  // never destroyed: CUDA may be torn down first at exit
    return *c;
}

struct Avail {
    bool ok = false;
    std::string why;
};

Avail probe() {
    Avail a;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        a.why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
        return a;
    }
    if (n == 0) { a.why = "no CUDA device found"; return a; }
    cudaDeviceProp p{};
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) { a.why = cudaGetErrorString(e); return a; }
    if (p.major < 9) {
        a.why = std::string(p.name) + " has compute capability " + std::to_string(p.major) + "." +
                std::to_string(p.minor) + "; this build targets sm_90 and newer";
        return a;
    }
    e = cudaFree(nullptr);  // create the context now
    if (e != cudaSuccess) { a.why = cudaGetErrorString(e); return a; }
    a.ok = true;
    return a;
}

/// Encode: stage slice [begin, begin+n) of `in` on lane l and enqueue all its work.
void encode_issue(Lane& l, const codec::TensorSetup& s, const codec::GuardConst& gc, const codec::ChunkIn& in,
                  std::size_t begin, std::size_t n) {
    const int nm = s.moments();
    const int cb = codec::code_bytes(s.kind), pb = codec::params_per_block(s.kind);
    const std::size_t blocks = (n + codec::kBlock - 1) / codec::kBlock;
    const float* src[4] = {in.m, in.v, in.vmax, in.theta};
    for (int k = 0; k < 4; ++k) {
        if (k < 3 ? k >= nm : src[3] == nullptr) continue;
        std::memcpy(l.h_in[k], src[k] + begin, n * sizeof(float));
        CKPT_CUDA(cudaMemcpyAsync(l.d_in[k], l.h_in[k], n * sizeof(float), cudaMemcpyHostToDevice, l.st));
    }
    detail::EncodeArgs a{};
    for (int k = 0; k < 3; ++k) {
        a.src[k] = k < nm ? l.d_in[k] : nullptr;
        a.codes[k] = l.d_codes[k];
        a.params[k] = l.d_params[k];
    }
    a.theta = in.theta ? l.d_in[3] : nullptr;
    a.flags = l.d_flags;
    a.block_max = l.d_block_max;
    a.n = n;
    detail::launch_encode(s, gc, a, l.st);
    detail::scan_flags(l.d_temp, l.temp_bytes, l.d_flags, l.d_pos, n, l.st);
    detail::CompactArgs c{};
    c.flags = l.d_flags;
    c.pos = l.d_pos;
    for (int k = 0; k < 3; ++k) { c.src[k] = a.src[k]; c.bits[k] = l.d_bits[k]; }
    c.nm = nm;
    c.idx = l.d_idx;
    c.count = l.d_count;
    c.n = n;
    detail::launch_compact(c, l.st);
    detail::reduce_max(l.d_temp, l.temp_bytes, l.d_block_max, l.d_max, blocks, l.st);
    for (int k = 0; k < nm; ++k) {
        CKPT_CUDA(cudaMemcpyAsync(l.h_codes[k], l.d_codes[k], n * cb, cudaMemcpyDeviceToHost, l.st));
        if (pb)
            CKPT_CUDA(cudaMemcpyAsync(l.h_params[k], l.d_params[k], blocks * pb * sizeof(int16_t),
                                      cudaMemcpyDeviceToHost, l.st));
    }
    CKPT_CUDA(cudaMemcpyAsync(l.h_count, l.d_count, sizeof(uint32_t), cudaMemcpyDeviceToHost, l.st));
    CKPT_CUDA(cudaMemcpyAsync(l.h_max, l.d_max, sizeof(double), cudaMemcpyDeviceToHost, l.st));
    l.busy = true;
    l.begin = begin;
    l.n = n;
}

/// Encode: wait for lane l's slice and append its results to out (slices in order).
void encode_harvest(Lane& l, const codec::TensorSetup& s, codec::ChunkOut& out, EscapeBits* bits) {
    if (!l.busy) return;
    l.busy = false;
    CKPT_CUDA(cudaStreamSynchronize(l.st));
    const int nm = s.moments();
    const int cb = codec::code_bytes(s.kind), pb = codec::params_per_block(s.kind);
    const std::size_t blocks = (l.n + codec::kBlock - 1) / codec::kBlock;
    for (int k = 0; k < nm; ++k) {
        std::memcpy(out.codes[k].data() + l.begin * cb, l.h_codes[k], l.n * cb);
        if (pb) std::memcpy(out.params[k].data() + (l.begin / codec::kBlock) * pb, l.h_params[k], blocks * pb * sizeof(int16_t));
    }
    out.max_bound = std::max(out.max_bound, *l.h_max);
    const uint32_t count = *l.h_count;
    if (count == 0) return;
    if (count > l.n) throw std::runtime_error("CUDA: escape count out of range");
    std::vector<uint32_t> idx(count);
    CKPT_CUDA(cudaMemcpy(idx.data(), l.d_idx, count * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (uint32_t i : idx) out.escapes.push_back(uint32_t(l.begin + i));
    if (bits) {
        for (int k = 0; k < nm; ++k) {
            const std::size_t at = (*bits)[k].size();
            (*bits)[k].resize(at + count);
            CKPT_CUDA(cudaMemcpy((*bits)[k].data() + at, l.d_bits[k], count * sizeof(uint32_t), cudaMemcpyDeviceToHost));
        }
    }
}

}  // namespace

bool gpu_available(std::string* why) {
    static const Avail a = probe();
    if (why) *why = a.why;
    return a.ok;
}

codec::ChunkOut encode_chunk_gpu_ex(const codec::TensorSetup& s, const codec::ChunkIn& in, EscapeBits* bits) {
    std::string why;
    if (!gpu_available(&why)) throw std::runtime_error("no CUDA device (" + why + ")");
    Context& ctx = context();
    std::lock_guard<std::mutex> lock(ctx.mu);
    const int nm = s.moments();
    const std::size_t n = in.n, blocks = (n + codec::kBlock - 1) / codec::kBlock;
    const codec::GuardConst gc = codec::make_guard_const(s.hyper, s.tolerance, s.format6);
    codec::ChunkOut out;
    for (int k = 0; k < nm; ++k) {
        out.codes[k].assign(n * std::size_t(codec::code_bytes(s.kind)), 0);
        out.params[k].assign(blocks * std::size_t(codec::params_per_block(s.kind)), 0);
    }
    if (bits)
        for (auto& b : *bits) b.clear();
    try {
        std::size_t slice = 0;
        for (std::size_t b0 = 0; b0 < n; b0 += kSlice, ++slice) {
            Lane& l = ctx.lane[slice % 2];
            encode_harvest(l, s, out, bits);  // the slice issued two steps ago
            encode_issue(l, s, gc, in, b0, std::min(kSlice, n - b0));
        }
        encode_harvest(ctx.lane[slice % 2], s, out, bits);  // older of the two in flight
        encode_harvest(ctx.lane[(slice + 1) % 2], s, out, bits);
    } catch (...) {
        for (Lane& l : ctx.lane) { l.busy = false; cudaStreamSynchronize(l.st); }
        throw;
    }
    return out;
}

codec::ChunkOut encode_chunk_gpu(const codec::TensorSetup& s, const codec::ChunkIn& in) {
    return encode_chunk_gpu_ex(s, in, nullptr);
}

namespace {

struct DecodeJob {
    const codec::TensorSetup& s;
    const std::array<const uint8_t*, 3>& codes;
    const std::array<const int16_t*, 3>& params;
    std::array<float*, 3> out;
    const float* theta;
    double* bounds;
    std::size_t bad = SIZE_MAX;  ///< the chunk's first block outside the float range (decode_harvest)
};

void decode_issue(Lane& l, const DecodeJob& j, const codec::GuardConst& gc, std::size_t begin, std::size_t n) {
    const int nm = j.s.moments();
    const int cb = codec::code_bytes(j.s.kind), pb = codec::params_per_block(j.s.kind);
    const std::size_t blocks = (n + codec::kBlock - 1) / codec::kBlock;
    detail::DecodeArgs a{};
    for (int k = 0; k < nm; ++k) {
        std::memcpy(l.h_codes[k], j.codes[k] + begin * cb, n * cb);
        CKPT_CUDA(cudaMemcpyAsync(l.d_codes[k], l.h_codes[k], n * cb, cudaMemcpyHostToDevice, l.st));
        if (pb) {
            std::memcpy(l.h_params[k], j.params[k] + (begin / codec::kBlock) * pb, blocks * pb * sizeof(int16_t));
            CKPT_CUDA(cudaMemcpyAsync(l.d_params[k], l.h_params[k], blocks * pb * sizeof(int16_t),
                                      cudaMemcpyHostToDevice, l.st));
        }
        a.codes[k] = l.d_codes[k];
        a.params[k] = l.d_params[k];
        a.out[k] = j.out[k] ? l.d_out[k] : nullptr;
    }
    if (j.theta) {
        std::memcpy(l.h_in[3], j.theta + begin, n * sizeof(float));
        CKPT_CUDA(cudaMemcpyAsync(l.d_in[3], l.h_in[3], n * sizeof(float), cudaMemcpyHostToDevice, l.st));
        a.theta = l.d_in[3];
    }
    a.bounds = j.bounds ? l.d_bounds : nullptr;
    a.n = n;
    CKPT_CUDA(cudaMemsetAsync(l.d_bad, 0xff, sizeof(unsigned long long), l.st));
    a.bad = l.d_bad;
    detail::launch_decode(j.s, gc, a, l.st);
    for (int k = 0; k < nm; ++k)
        if (j.out[k]) CKPT_CUDA(cudaMemcpyAsync(l.h_out[k], l.d_out[k], n * sizeof(float), cudaMemcpyDeviceToHost, l.st));
    if (j.bounds) CKPT_CUDA(cudaMemcpyAsync(l.h_bounds, l.d_bounds, n * sizeof(double), cudaMemcpyDeviceToHost, l.st));
    CKPT_CUDA(cudaMemcpyAsync(l.h_bad, l.d_bad, sizeof(unsigned long long), cudaMemcpyDeviceToHost, l.st));
    l.busy = true;
    l.begin = begin;
    l.n = n;
}

void decode_harvest(Lane& l, DecodeJob& j) {
    if (!l.busy) return;
    l.busy = false;
    CKPT_CUDA(cudaStreamSynchronize(l.st));
    for (int k = 0; k < j.s.moments(); ++k)
        if (j.out[k]) std::memcpy(j.out[k] + l.begin, l.h_out[k], l.n * sizeof(float));
    if (j.bounds) std::memcpy(j.bounds + l.begin, l.h_bounds, l.n * sizeof(double));
    if (*l.h_bad != ~0ull) j.bad = std::min<std::size_t>(j.bad, l.begin / codec::kBlock + std::size_t(*l.h_bad));
}

}  // namespace

std::size_t decode_chunk_gpu(const codec::TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                             const std::array<const int16_t*, 3>& params, std::size_t n, std::array<float*, 3> out,
                             const float* theta, double* bounds) {
    std::string why;
    if (!gpu_available(&why)) throw std::runtime_error("no CUDA device (" + why + ")");
    Context& ctx = context();
    std::lock_guard<std::mutex> lock(ctx.mu);
    const codec::GuardConst gc = codec::make_guard_const(s.hyper, s.tolerance, s.format6);
    DecodeJob j{s, codes, params, out, theta, bounds};
    try {
        std::size_t slice = 0;
        for (std::size_t b0 = 0; b0 < n; b0 += kSlice, ++slice) {
            Lane& l = ctx.lane[slice % 2];
            decode_harvest(l, j);
            decode_issue(l, j, gc, b0, std::min(kSlice, n - b0));
        }
        decode_harvest(ctx.lane[slice % 2], j);
        decode_harvest(ctx.lane[(slice + 1) % 2], j);
    } catch (...) {
        for (Lane& l : ctx.lane) { l.busy = false; cudaStreamSynchronize(l.st); }
        throw;
    }
    return j.bad;
}

}  // namespace ckpt::gpu
