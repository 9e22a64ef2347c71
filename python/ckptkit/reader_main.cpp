// ckptkit-reader: the package's helper process for container reads (reader.h). Spawned by
// the extension with one argument, the JSON request; its result pipe at fd 3
// (common/isolate.h) and, for restore_bytes, the memfd to fill at fd 4. Exit 0 after
// sending the result; a crash inside libhdf5 is reported by its signal's name.
#include "common/isolate.h"
#include "common/process.h"
#include "codec/codec.h"
#include "reader.h"

int main(int argc, char** argv) {
    ckpt::isolated_begin();
    ckpt::tool_process_setup();  // as the tools (common/process.h)
    if (argc != 2) return 64;
    const auto sink = ckpt::pkg::collect_logs();
    nlohmann::json req;
    std::vector<std::string> outs;
    const ckpt::pkg::Failure f = ckpt::pkg::call_job("ckptkit-reader", "", [&] {
        req = nlohmann::json::parse(argv[1]);
        ckpt::codec::set_cpu_threads(req.value("threads", 0u));
    });
    ckpt::pkg::Failure g = f;
    if (f.cls.empty())
        g = ckpt::pkg::call_job(req.value("tool", "ckptkit").c_str(), req.value("src", ""),
                                [&] { outs = ckpt::pkg::run_read_job(req, 4); });
    return ckpt::isolated_send(ckpt::pkg::pack_result(g, sink->take(), outs)) ? 0 : 3;
}
