// Codec backends: one table of the implementations that run a chunk's encode and decode,
// after zfp's execution policies. The CPU loops (codec.h encode_chunk / decode_chunk) are
// always there; CUDA (cuda/) is a real backend when ckptkit was built with it
// (CKPTKIT_CUDA), otherwise its row stays and answers available() == false
// (cuda/gpu_stub.cpp). Every backend gives the same output byte for byte: they run
// block.h's per-block math, with no FMA contraction on either side (docs/design.md §4).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "codec/codec.h"

namespace ckpt::codec {

/// Coordinates per chunk, every tool's default: on the CPU one chunk's values, codes and
/// streams stay in L2 between the passes over them (read, encode or decode, entropy
/// coding, write), and are paged in once; a device wants large transfers.
constexpr std::size_t kCpuChunk = std::size_t(1) << 18, kDeviceChunk = std::size_t(1) << 20;

/// A backend of the table (its row index).
enum class Device { Cpu, Cuda };

/// One row of the backend table.
struct Backend {
    Device device;
    const char* name;     ///< "cpu", "cuda": the tools' --device value
    std::size_t chunk;    ///< default coordinates per chunk (kCpuChunk, kDeviceChunk)
    /// True when the backend can run in this process; otherwise false with the reason in
    /// *why (when non-null). Cached after the first call.
    bool (*available)(std::string* why);
    /// encode_chunk_into's semantics and output (out's buffers reused), escape causes
    /// classified (classify_escapes). Throws std::runtime_error when the backend is not
    /// available or a device call fails.
    void (*encode)(const TensorSetup&, const ChunkIn&, ChunkOut& out);
    /// decode_chunk's semantics and output (the first block with a used code outside the
    /// float range, or SIZE_MAX). Throws std::runtime_error as encode does.
    std::size_t (*decode)(const TensorSetup&, const std::array<const uint8_t*, 3>& codes,
                   const std::array<const int16_t*, 3>& params, std::size_t n, std::array<float*, 3> out,
                   const float* theta, double* bounds);
};

/// The table's row of `d`.
const Backend& backend(Device d);

/// "cpu" | "cuda" | "auto" -> Device. auto: Cuda when its backend is available, else Cpu.
/// "cuda" without a device throws std::runtime_error("--device cuda: no CUDA device (reason)").
/// Anything else throws std::invalid_argument.
Device resolve_device(const std::string& name);

/// The backend the container reader decodes with (ckpt-restore / ckpt-verify). Default:
/// resolved "auto" on first use; ckpt-restore --device sets it. Thread-safe.
void set_decode_device(Device);
Device decode_device();

}  // namespace ckpt::codec
