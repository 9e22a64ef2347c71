// libFuzzer target: the torch.save zip reader (zip central directory, local headers,
// zip64, data.pkl, storages) through read_checkpoint's zip path.
#include "fuzz_common.h"
#include "common/error.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/torch_file.h"
#include "io/zip.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = fuzz::as_file(data, size);
    const ckpt::Limits lim = fuzz::small_limits();
    try {
        const ckpt::io::InputFile f(path);
        if (ckpt::io::has_zip_eocd(f)) {
            (void)ckpt::io::read_zip(f, lim);
            (void)ckpt::io::read_torch_zip(f, lim);
        }
    } catch (const ckpt::BadInput&) {
    }
    try {
        (void)ckpt::read_checkpoint(path, lim);
    } catch (const ckpt::BadInput&) {
    }
    return 0;
}
