// Built instead of gpu_codec.cu when CUDA is off or nvcc is missing: no device.
#include <stdexcept>

#include "cuda/gpu_codec.h"

namespace ckpt::gpu {

bool gpu_available(std::string* why) {
    if (why) *why = "ckptkit was built without CUDA (CKPTKIT_CUDA=OFF or no nvcc)";
    return false;
}

codec::ChunkOut encode_chunk_gpu_ex(const codec::TensorSetup&, const codec::ChunkIn&, EscapeBits*) {
    throw std::runtime_error("no CUDA device (ckptkit was built without CUDA)");
}

codec::ChunkOut encode_chunk_gpu(const codec::TensorSetup& s, const codec::ChunkIn& in) {
    return encode_chunk_gpu_ex(s, in, nullptr);
}

std::size_t decode_chunk_gpu(const codec::TensorSetup&, const std::array<const uint8_t*, 3>&,
                      const std::array<const int16_t*, 3>&, std::size_t, std::array<float*, 3>, const float*,
                      double*) {
    throw std::runtime_error("no CUDA device (ckptkit was built without CUDA)");
}

}  // namespace ckpt::gpu
