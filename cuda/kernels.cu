// The kernels: the bodies are lib/codec/block.h (shared with the CPU loops).
// First correct version: one thread per block of kBlock coordinates for the encoder
// (block.h's parameter choice and trials are sequential per block), one thread per
// coordinate for the decoder and the compaction.
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>

#include "codec/block.h"
#include "cuda/kernels.cuh"

namespace ckpt::gpu::detail {

namespace {

template <class Q>
__global__ void encode_kernel(codec::TensorSetup s, codec::GuardConst gc, EncodeArgs a) {
    const std::size_t blocks = (a.n + codec::kBlock - 1) / codec::kBlock;
    const std::size_t b = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (b >= blocks) return;
    const std::size_t i0 = b * codec::kBlock;
    const std::size_t rest = a.n - i0;
    const int bn = rest < std::size_t(codec::kBlock) ? int(rest) : codec::kBlock;
    codec::BlockWork<Q> w;
    const codec::BlockTrial<Q>& best = codec::encode_block<Q>(s, gc, a.src, a.theta, i0, bn, w);
    const int nm = s.moments();
    for (int k = 0; k < nm; ++k)
        for (int q = 0; q < Q::kParams; ++q) a.params[k][b * Q::kParams + q] = best.p[k][q];
    double mx = 0;
    for (int j = 0; j < bn; ++j) {
        const std::size_t i = i0 + std::size_t(j);
        const bool keep = best.keep[j];
        a.flags[i] = keep ? 0u : 1u;
        if (keep && mx < best.bound[j]) mx = best.bound[j];  // std::max(mx, bound)
        for (int k = 0; k < nm; ++k) codec::store_code(a.codes[k], Q::kCodeBytes, i, keep ? best.code[k][j] : uint16_t(0));
    }
    a.block_max[b] = mx;
}

__global__ void compact_kernel(CompactArgs a) {
    const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    if (i + 1 == a.n) *a.count = a.pos[i] + a.flags[i];
    if (!a.flags[i]) return;
    const uint32_t p = a.pos[i];
    a.idx[p] = uint32_t(i);
    for (int k = 0; k < a.nm; ++k) {
        uint32_t u;
        memcpy(&u, &a.src[k][i], 4);
        a.bits[k][p] = u;
    }
}

template <class Q>
__global__ void decode_kernel(codec::TensorSetup s, codec::GuardConst gc, DecodeArgs a) {
    const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    if (!codec::decode_coord<Q>(s, gc, a.codes, a.params, i, a.out, a.theta, a.bounds) && a.bad)
        atomicMin(a.bad, static_cast<unsigned long long>(i / codec::kBlock));
}

}  // namespace

constexpr int kEncodeThreads = 64;
constexpr int kThreads = 256;

inline unsigned grid_for(std::size_t items, int threads) { return unsigned((items + threads - 1) / threads); }

/// Launch the encoder for setup s on stream st.
void launch_encode(const codec::TensorSetup& s, const codec::GuardConst& gc, const EncodeArgs& a,
                          cudaStream_t st) {
    const std::size_t blocks = (a.n + codec::kBlock - 1) / codec::kBlock;
    if (blocks == 0) return;
    const unsigned g = grid_for(blocks, kEncodeThreads);
    switch (s.kind) {
        case codec::Kind::Log8: encode_kernel<codec::Log8><<<g, kEncodeThreads, 0, st>>>(s, gc, a); break;
        case codec::Kind::BF16: encode_kernel<codec::BF16><<<g, kEncodeThreads, 0, st>>>(s, gc, a); break;
        case codec::Kind::Blockwise8: encode_kernel<codec::Blockwise8><<<g, kEncodeThreads, 0, st>>>(s, gc, a); break;
        case codec::Kind::VLog: encode_kernel<codec::VLog><<<g, kEncodeThreads, 0, st>>>(s, gc, a); break;
    }
    CKPT_CUDA(cudaGetLastError());
}

void launch_decode(const codec::TensorSetup& s, const codec::GuardConst& gc, const DecodeArgs& a,
                          cudaStream_t st) {
    if (a.n == 0) return;
    const unsigned g = grid_for(a.n, kThreads);
    switch (s.kind) {
        case codec::Kind::Log8: decode_kernel<codec::Log8><<<g, kThreads, 0, st>>>(s, gc, a); break;
        case codec::Kind::BF16: decode_kernel<codec::BF16><<<g, kThreads, 0, st>>>(s, gc, a); break;
        case codec::Kind::Blockwise8: decode_kernel<codec::Blockwise8><<<g, kThreads, 0, st>>>(s, gc, a); break;
        case codec::Kind::VLog: decode_kernel<codec::VLog><<<g, kThreads, 0, st>>>(s, gc, a); break;
    }
    CKPT_CUDA(cudaGetLastError());
}

void launch_compact(const CompactArgs& a, cudaStream_t st) {
    if (a.n == 0) return;
    compact_kernel<<<grid_for(a.n, kThreads), kThreads, 0, st>>>(a);
    CKPT_CUDA(cudaGetLastError());
}

std::size_t scan_temp_bytes(std::size_t n) {
    std::size_t scan = 0, red = 0;
    CKPT_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const uint32_t*>(nullptr),
                                            static_cast<uint32_t*>(nullptr), int(n)));
    CKPT_CUDA(cub::DeviceReduce::Max(nullptr, red, static_cast<const double*>(nullptr), static_cast<double*>(nullptr),
                                     int(n)));
    return std::max(scan, red);
}

void scan_flags(void* temp, std::size_t temp_bytes, const uint32_t* flags, uint32_t* pos, std::size_t n,
                cudaStream_t st) {
    if (n == 0) return;
    CKPT_CUDA(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, flags, pos, int(n), st));
}

void reduce_max(void* temp, std::size_t temp_bytes, const double* x, double* out, std::size_t n, cudaStream_t st) {
    if (n == 0) return;
    CKPT_CUDA(cub::DeviceReduce::Max(temp, temp_bytes, x, out, int(n), st));
}

}  // namespace ckpt::gpu::detail
