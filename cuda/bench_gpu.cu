// bench_gpu [coords] [codec]: GPU throughput of encode+certify(+escape compaction) and
// decode over device-resident moments (exp_avg + exp_avg_sq, FP32; default 2^28
// coordinates = 2 GiB of moment input), against a device-to-device cudaMemcpy of the
// same bytes in the same run; then the host API (pinned, double-buffered chunks) on a
// 2^24-coordinate chunk, and a byte comparison with the CPU codec on 2^20 coordinates.
// Without a usable device it prints the reason and exits 2.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "cuda/gpu_codec.h"
#include "cuda/kernels.cuh"

using namespace ckpt;
using gpu::detail::check;

namespace {

__device__ uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/// Adam-like moments: v log-normal around 1e-8, m ~ N(0, 0.3 sqrt(v)); a few zeros.
__global__ void fill(float* m, float* v, std::size_t n, uint64_t seed) {
    const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint64_t a = mix(seed ^ (2 * i)), b = mix(seed ^ (2 * i + 1));
    const double u1 = (double(a >> 11) + 0.5) / 9007199254740992.0, u2 = double(b >> 11) / 9007199254740992.0;
    const double r = sqrt(-2 * log(u1));
    const double z1 = r * cos(6.283185307179586 * u2), z2 = r * sin(6.283185307179586 * u2);
    const double vv = 1e-8 * exp(2.0 * z1);
    v[i] = (a & 1023) == 0 ? 0.0f : float(vv);
    m[i] = (a & 1023) == 0 ? 0.0f : float(0.3 * sqrt(vv) * z2);
}

template <class T>
T* dmalloc(std::size_t n) {
    void* p = nullptr;
    CKPT_CUDA(cudaMalloc(&p, n * sizeof(T)));
    return static_cast<T*>(p);
}

struct Timer {
    cudaEvent_t a, b;
    Timer() { CKPT_CUDA(cudaEventCreate(&a)); CKPT_CUDA(cudaEventCreate(&b)); }
    void start() { CKPT_CUDA(cudaEventRecord(a)); }
    double stop_ms() {
        CKPT_CUDA(cudaEventRecord(b));
        CKPT_CUDA(cudaEventSynchronize(b));
        float ms = 0;
        CKPT_CUDA(cudaEventElapsedTime(&ms, a, b));
        return ms;
    }
};

}  // namespace

int main(int argc, char** argv) {
    std::string why;
    if (!gpu::gpu_available(&why)) {
        std::fprintf(stderr, "bench_gpu: error: no CUDA device (%s)\n", why.c_str());
        return 2;
    }
    const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (std::size_t(1) << 28);
    if (n == 0 || n >= (std::size_t(1) << 31)) {
        std::fprintf(stderr, "bench_gpu: error: coords must be in [1, 2^31)\n");
        return 2;
    }
    codec::TensorSetup s;
    try {
        s.kind = codec::kind_from_name(argc > 2 ? argv[2] : "log8");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_gpu: error: %s\n", e.what());
        return 2;
    }
    s.hyper.step = 1000;
    s.hyper.lr = 1e-3;
    try {
        cudaDeviceProp prop{};
        CKPT_CUDA(cudaGetDeviceProperties(&prop, 0));
        const codec::GuardConst gc = codec::make_guard_const(s.hyper, s.tolerance, s.format6);
        const std::size_t blocks = (n + codec::kBlock - 1) / codec::kBlock;
        const int cb = codec::code_bytes(s.kind), pb = codec::params_per_block(s.kind);
        const double in_bytes = 2.0 * 4.0 * double(n);  // m and v, FP32
        float* m = dmalloc<float>(n);
        float* v = dmalloc<float>(n);
        fill<<<unsigned((n + 255) / 256), 256>>>(m, v, n, 1234);
        CKPT_CUDA(cudaGetLastError());
        gpu::detail::EncodeArgs ea{};
        ea.src[0] = m;
        ea.src[1] = v;
        for (int k = 0; k < 2; ++k) {
            ea.codes[k] = dmalloc<uint8_t>(n * cb);
            ea.params[k] = dmalloc<int16_t>(blocks * pb + 2);
        }
        ea.flags = dmalloc<uint32_t>(n);
        ea.block_max = dmalloc<double>(blocks);
        ea.n = n;
        gpu::detail::CompactArgs ca{};
        ca.flags = ea.flags;
        uint32_t* pos = dmalloc<uint32_t>(n);
        ca.pos = pos;
        ca.src[0] = m;
        ca.src[1] = v;
        ca.nm = 2;
        ca.idx = dmalloc<uint32_t>(n);
        ca.bits[0] = dmalloc<uint32_t>(n);
        ca.bits[1] = dmalloc<uint32_t>(n);
        ca.count = dmalloc<uint32_t>(1);
        ca.n = n;
        double* dmax = dmalloc<double>(1);
        const std::size_t tb = gpu::detail::scan_temp_bytes(std::max(n, blocks));
        void* temp = dmalloc<uint8_t>(tb);
        auto encode_all = [&] {
            gpu::detail::launch_encode(s, gc, ea, nullptr);
            gpu::detail::scan_flags(temp, tb, ea.flags, pos, n, nullptr);
            gpu::detail::launch_compact(ca, nullptr);
            gpu::detail::reduce_max(temp, tb, ea.block_max, dmax, blocks, nullptr);
        };
        Timer t;
        encode_all();  // warm-up (module load)
        CKPT_CUDA(cudaDeviceSynchronize());
        t.start();
        encode_all();
        const double enc_ms = t.stop_ms();
        uint32_t escapes = 0;
        double maxb = 0;
        CKPT_CUDA(cudaMemcpy(&escapes, ca.count, 4, cudaMemcpyDeviceToHost));
        CKPT_CUDA(cudaMemcpy(&maxb, dmax, 8, cudaMemcpyDeviceToHost));

        gpu::detail::DecodeArgs da{};
        float* outm = dmalloc<float>(n);
        float* outv = dmalloc<float>(n);
        for (int k = 0; k < 2; ++k) {
            da.codes[k] = ea.codes[k];
            da.params[k] = ea.params[k];
        }
        da.out[0] = outm;
        da.out[1] = outv;
        da.n = n;
        gpu::detail::launch_decode(s, gc, da, nullptr);  // warm-up
        CKPT_CUDA(cudaDeviceSynchronize());
        t.start();
        gpu::detail::launch_decode(s, gc, da, nullptr);
        const double dec_ms = t.stop_ms();
        double* bounds = dmalloc<double>(n);
        da.bounds = bounds;
        t.start();
        gpu::detail::launch_decode(s, gc, da, nullptr);
        const double ver_ms = t.stop_ms();
        CKPT_CUDA(cudaFree(bounds));

        CKPT_CUDA(cudaMemcpy(outm, m, n * 4, cudaMemcpyDeviceToDevice));  // warm-up
        t.start();
        CKPT_CUDA(cudaMemcpyAsync(outm, m, n * 4, cudaMemcpyDeviceToDevice));
        CKPT_CUDA(cudaMemcpyAsync(outv, v, n * 4, cudaMemcpyDeviceToDevice));
        const double cp_ms = t.stop_ms();

        // host API on one chunk, and byte identity with the CPU codec on its first 2^20
        const std::size_t hn = std::min<std::size_t>(n, std::size_t(1) << 24);
        std::vector<float> hm(hn), hv(hn);
        CKPT_CUDA(cudaMemcpy(hm.data(), m, hn * 4, cudaMemcpyDeviceToHost));
        CKPT_CUDA(cudaMemcpy(hv.data(), v, hn * 4, cudaMemcpyDeviceToHost));
        codec::ChunkIn ci;
        ci.m = hm.data();
        ci.v = hv.data();
        ci.n = hn;
        (void)gpu::encode_chunk_gpu(s, ci);  // warm-up (pinned buffers)
        auto w0 = std::chrono::steady_clock::now();
        const codec::ChunkOut go = gpu::encode_chunk_gpu(s, ci);
        auto w1 = std::chrono::steady_clock::now();
        std::vector<float> rm(hn), rv(hn);
        gpu::decode_chunk_gpu(s, {go.codes[0].data(), go.codes[1].data(), nullptr},
                              {go.params[0].data(), go.params[1].data(), nullptr}, hn, {rm.data(), rv.data(), nullptr},
                              nullptr, nullptr);
        auto w2 = std::chrono::steady_clock::now();
        const double henc_ms = std::chrono::duration<double, std::milli>(w1 - w0).count();
        const double hdec_ms = std::chrono::duration<double, std::milli>(w2 - w1).count();

        const std::size_t cn = std::min<std::size_t>(hn, std::size_t(1) << 20);
        codec::ChunkIn cc = ci;
        cc.n = cn;
        auto c0 = std::chrono::steady_clock::now();
        const codec::ChunkOut co = codec::encode_chunk(s, cc);
        auto c1 = std::chrono::steady_clock::now();
        const codec::ChunkOut gs = gpu::encode_chunk_gpu(s, cc);
        const bool same = co.codes == gs.codes && co.params == gs.params && co.escapes == gs.escapes &&
                          std::memcmp(&co.max_bound, &gs.max_bound, 8) == 0;
        const double cpu_ms = std::chrono::duration<double, std::milli>(c1 - c0).count();

        auto gbs = [](double bytes, double ms) { return bytes / (ms * 1e6); };
        std::printf("\nbench_gpu: %s, codec %s, %zu coordinates (exp_avg + exp_avg_sq FP32 = %.2f GiB input), "
                    "escapes %u (%.3f%%), max bound %.4g lr\n",
                    prop.name, codec::kind_name(s.kind), n, in_bytes / 1073741824.0, escapes,
                    100.0 * escapes / double(n), maxb);
        std::printf("| %-44s | %10s | %12s | %9s |\n", "stage", "ms", "input GB/s", "vs memcpy");
        std::printf("|%s|%s|%s|%s|\n", std::string(46, '-').c_str(), std::string(12, '-').c_str(),
                    std::string(14, '-').c_str(), std::string(11, '-').c_str());
        const double ref = gbs(in_bytes, cp_ms);
        auto row = [&](const char* name, double bytes, double ms) {
            std::printf("| %-44s | %10.2f | %12.2f | %8.3fx |\n", name, ms, gbs(bytes, ms), gbs(bytes, ms) / ref);
        };
        row("cudaMemcpy D2D of the same bytes", in_bytes, cp_ms);
        row("encode+certify+compaction (device)", in_bytes, enc_ms);
        row("decode (device, restore path)", in_bytes, dec_ms);
        row("decode+certificates (device, verify path)", in_bytes, ver_ms);
        row("encode_chunk_gpu host API (2^24, pinned)", 8.0 * double(hn), henc_ms);
        row("decode_chunk_gpu host API (2^24, pinned)", 8.0 * double(hn), hdec_ms);
        row("CPU encode_chunk, 1 thread (2^20)", 8.0 * double(cn), cpu_ms);
        std::printf("GPU vs CPU encode_chunk on 2^20 coordinates: %s\n", same ? "byte-identical" : "DIFFERENT");
        return same ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_gpu: error: %s\n", e.what());
        return 2;
    }
}
