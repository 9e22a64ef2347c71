// libFuzzer target: the replay trace loader (ckptkit trace JSON, PyTorch Execution Trace
// schema 1.0.1, Chakra-style nested schema) and the trace_to_json -> trace_from_json round trip.
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "common/error.h"
#include "replay/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = fuzz::as_file(data, size);
    try {
        const ckpt::replay::Trace t = ckpt::replay::load_trace(path);
        const nlohmann::json j = ckpt::replay::trace_to_json(t);
        (void)ckpt::replay::trace_from_json(j, path);  // what we write must read back
    } catch (const ckpt::BadInput&) {
    }
    return 0;
}
