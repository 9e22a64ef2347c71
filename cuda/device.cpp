// Device selection for the pipeline (both builds).
#include <atomic>
#include <stdexcept>

#include "gpu_codec.h"

namespace ckpt::gpu {

Device resolve_device(const std::string& name) {
    if (name == "cpu") return Device::Cpu;
    if (name != "cuda" && name != "auto") throw std::invalid_argument("--device: '" + name + "' is not cpu, cuda or auto");
    std::string why;
    const bool ok = gpu_available(&why);
    if (name == "cuda" && !ok) throw std::runtime_error("--device cuda: no CUDA device (" + why + ")");
    return ok ? Device::Cuda : Device::Cpu;
}

namespace {
std::atomic<int> g_decode{-1};  // -1: not chosen yet (auto on first use)
}

void set_decode_device(Device d) { g_decode = int(d); }

Device decode_device() {
    int d = g_decode;
    if (d < 0) {
        d = int(resolve_device("auto"));
        g_decode = d;
    }
    return Device(d);
}

codec::ChunkOut encode_chunk_on(Device d, const codec::TensorSetup& s, const codec::ChunkIn& in) {
    if (d != Device::Cuda) return codec::encode_chunk(s, in);
    codec::ChunkOut out = encode_chunk_gpu(s, in);
    codec::classify_escapes(s, in, out);
    return out;
}

void decode_chunk_on(Device d, const codec::TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                     const std::array<const int16_t*, 3>& params, std::size_t n, std::array<float*, 3> out,
                     const float* theta, double* bounds) {
    if (d == Device::Cuda) decode_chunk_gpu(s, codes, params, n, out, theta, bounds);
    else codec::decode_chunk(s, codes, params, n, out, theta, bounds);
}

}  // namespace ckpt::gpu
