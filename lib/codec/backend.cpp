// The backend table (backend.h): the CPU row and the CUDA row (cuda/: the kernels, or
// the stub of a build without CUDA), and the device choice of the tools.
#include "codec/backend.h"

#include <atomic>
#include <stdexcept>

#include "cuda/gpu_codec.h"

namespace ckpt::codec {

namespace {

bool cpu_available(std::string*) { return true; }

void cuda_encode(const TensorSetup& s, const ChunkIn& in, ChunkOut& out) {
    out = gpu::encode_chunk_gpu(s, in);
    classify_escapes(s, in, out);   // causes: the CPU encoder re-run on the blocks holding escapes
}

constexpr Backend kBackends[] = {
    {Device::Cpu, "cpu", kCpuChunk, cpu_available, encode_chunk_into, decode_chunk},
    {Device::Cuda, "cuda", kDeviceChunk, gpu::gpu_available, cuda_encode, gpu::decode_chunk_gpu},
};

std::atomic<int> g_decode{-1};  // -1: not chosen yet (auto on first use)

}  // namespace

const Backend& backend(Device d) { return kBackends[std::size_t(d)]; }

Device resolve_device(const std::string& name) {
    if (name == "cpu") return Device::Cpu;
    if (name != "cuda" && name != "auto") throw std::invalid_argument("--device: '" + name + "' is not cpu, cuda or auto");
    std::string why;
    const bool ok = backend(Device::Cuda).available(&why);
    if (name == "cuda" && !ok) throw std::runtime_error("--device cuda: no CUDA device (" + why + ")");
    return ok ? Device::Cuda : Device::Cpu;
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

}  // namespace ckpt::codec
