// libFuzzer target: the safetensors reader (u64 header length, JSON header, offsets,
// dtypes, shapes, coverage of the data section).
#include "fuzz_common.h"
#include "common/error.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = fuzz::as_file(data, size);
    ckpt::Limits lim;
    lim.max_header_bytes = 1 << 20;
    try {
        const ckpt::io::InputFile f(path);
        (void)ckpt::io::read_safetensors(f, lim);
    } catch (const ckpt::BadInput&) {
    }
    return 0;
}
