// ckpt-verify IN.ckz.h5 [--original ORIG]: integrity + re-derived certificates (+ original).
#include <CLI/CLI.hpp>

#include <iostream>

#include "ckpt/pipeline.h"
#include "cli.h"

int main(int argc, char** argv) {
    ckpt::app::Cli cli("ckpt-verify", "Prove a container's guarantee: integrity, every certificate re-derived from the "
                 "stored codes, and (with --original) the true update error on a dense gradient grid. "
                 "Exit 0 when everything holds, 1 when a check fails, 2 on bad input or usage.");
    CLI::App& app = cli.app;
    std::string in, orig;
    ckpt::VerifyOptions o;
    app.add_option("input", in, "container (.ckz.h5)")->required();
    auto* og = app.add_option("--original", orig, "the checkpoint that was compressed");
    app.add_option("--grid", o.grid, "gradient points per coordinate")->capture_default_str();
    app.add_flag("--strict", o.strict, "read --original accepting only torch.load(weights_only=True) globals");
    ckpt::app::add_threads_option(app);
    return cli.main(argc, argv, in, [&] {
        ckpt::app::require_container(in, "pass the container (.ckz.h5), and the checkpoint with --original");
        if (og->count()) o.original = orig;
        o.progress = !cli.json;
        const ckpt::Report r = ckpt::verify(in, o);
        std::cout << (cli.json ? r.json() + "\n" : r.table());
        return r.ok ? 0 : 1;
    });
}
