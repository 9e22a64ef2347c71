// libFuzzer target: the container reader behind ckpt-verify / ckpt-restore: open (HDF5 +
// manifest + dataset checks), the pass over /raw, checksums, decoding every parameter chunk by chunk with
// certificates, and every raw storage range. HDF5 itself is the system library (not
// instrumented); its error stack printing is turned off.
#include <hdf5.h>

#include "fuzz_common.h"
#include "container/reader.h"
#include "common/error.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = fuzz::as_file(data, size);
    try {
        const ckpt::container::ContainerReader cr(path);
        (void)cr.scan_source([](const uint8_t*, std::size_t) {}, [](uint64_t) {});
        (void)cr.damaged_datasets();
        (void)cr.moment_bytes();
        for (std::size_t j = 0; j < cr.manifest().params.size(); ++j) (void)cr.coded_bytes(j);
        const auto& man = cr.manifest();
        std::vector<uint8_t> buf;
        for (const auto& s : man.storages) {
            if (s.param >= 0) continue;
            buf.resize(std::size_t(std::min<uint64_t>(s.nbytes, 1 << 16)));
            cr.read_raw(s.offset, buf.size(), buf.data());
        }
        uint64_t budget = 1 << 22;  // coordinates decoded per input (keeps execs fast)
        for (std::size_t j = 0; j < man.params.size() && budget > 0; ++j) {
            const uint64_t n = man.params[j].numel;
            if (n > budget) break;
            budget -= n;
            for (auto w : {ckpt::container::ContainerReader::Want::Codes, ckpt::container::ContainerReader::Want::Bounds})
                cr.for_each_chunk(j, 4096, w, [](const ckpt::container::ContainerReader::Chunk&) {});
        }
    } catch (const ckpt::BadInput&) {
    } catch (const ckpt::CheckFailed&) {
    }
    return 0;
}
