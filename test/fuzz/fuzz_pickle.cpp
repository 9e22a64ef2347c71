// libFuzzer target: the safe unpickler on raw pickle bytes, in each persistent-id mode
// (none, torch zip 5-tuples, legacy 6-tuples), and the legacy torch file reader.
#include "fuzz_common.h"
#include "common/error.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/pickle.h"
#include "io/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = fuzz::as_file(data, size);
    const ckpt::Limits lim = fuzz::small_limits();
    for (auto ids : {ckpt::io::PersistentIds::TorchZip, ckpt::io::PersistentIds::None,
                     ckpt::io::PersistentIds::TorchLegacy}) {
        try {
            const ckpt::io::InputFile f(path);
            ckpt::io::RangeReader r(f, 0, f.size());
            (void)ckpt::io::unpickle(r, lim, ids);
        } catch (const ckpt::BadInput&) {
        }
    }
    try {
        const ckpt::io::InputFile f(path);
        if (ckpt::io::is_torch_legacy(f)) (void)ckpt::io::read_torch_legacy(f, lim);
    } catch (const ckpt::BadInput&) {
    }
    return 0;
}
