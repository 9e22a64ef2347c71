// ckpt-restore IN.ckz.h5 -o OUT: the checkpoint back, in its source format.
#include <CLI/CLI.hpp>

#include <iostream>

#include "ckpt/pipeline.h"
#include "cli.h"
#include "gpu_codec.h"

int main(int argc, char** argv) {
    CLI::App app{"Rebuild the checkpoint from a container (torch.load / safetensors readers accept it)."};
    std::string in, out, device = "auto";
    bool json = false;
    app.add_option("input", in, "container (.ckz.h5)")->required();
    app.add_option("-o,--output", out, "checkpoint to write (.pt or .safetensors, as the source)")->required();
    app.add_option("--device", device, "cpu | cuda | auto (auto: the GPU when one is present)")
        ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    ckpt::app::add_threads_option(app);
    app.add_flag("--json", json, "print one JSON object on stdout");
    CLI11_PARSE(app, argc, argv);
    return ckpt::app::run("ckpt-restore", [&] {
        try {
            ckpt::gpu::set_decode_device(ckpt::gpu::resolve_device(device));
        } catch (const std::exception& e) {
            throw ckpt::BadInput(in, e.what());
        }
        ckpt::RestoreOptions o;
        o.progress = !json;
        const ckpt::Report r = ckpt::restore(in, out, o);
        std::cout << (json ? r.json() + "\n" : r.table());
        return 0;
    });
}
