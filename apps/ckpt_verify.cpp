// ckpt-verify IN.ckz.h5 [--original ORIG]: integrity + re-derived certificates (+ original).
// ckpt-verify OUT_DIR [--original DIR]: folder mode (lib/folder/folder.h), also under mpirun / srun.
#include <CLI/CLI.hpp>

#include <iostream>

#include "folder/folder.h"
#include "ckpt/pipeline.h"
#include "cli.h"
#include "folder_cli.h"

int main(int argc, char** argv) {
    ckpt::app::Cli cli("ckpt-verify", "Prove a container's guarantee: integrity, every certificate re-derived from the "
                 "stored codes, and (with --original) the true update error on a dense gradient grid. "
                 "Exit 0 when everything holds, 1 when a check fails, 2 on bad input or usage.");
    CLI::App& app = cli.app;
    ckpt::app::add_folder_help(cli, "pass the folder ckpt-compress wrote, and the checkpoint folder with --original");
    std::string in, orig;
    ckpt::VerifyOptions o;
    app.add_option("input", in, "container (.ckz.h5), or a folder ckpt-compress wrote")->required();
    auto* og = app.add_option("--original", orig, "the checkpoint (or folder) that was compressed");
    app.add_option("--grid", o.grid, "gradient points per coordinate (dense check with --original)")->capture_default_str()
        ->check(CLI::Range(5, 1 << 20));
    app.add_option("--tolerance", o.tolerance, "the largest certificate accepted, in units of lr, whatever tolerance the "
                   "container states (as ckpt-compress's --tolerance: pass the one a container was compressed at)")
        ->capture_default_str()->check(ckpt::app::unit_interval());
    app.add_flag("--strict", o.strict, "read --original accepting only torch.load(weights_only=True) globals");
    ckpt::app::add_threads_option(app);
    return cli.main(argc, argv, in, [&] {
        if (ckpt::folder::is_folder(in))
            return ckpt::app::run_folder(cli, [&](const ckpt::folder::FolderOptions& fo) {
                o.progress = fo.progress;
                return ckpt::folder::verify_folder(in, og->count() ? std::optional<std::string>(orig) : std::nullopt, o);
            });
        ckpt::app::require_container(in, "pass the container (.ckz.h5), and the checkpoint with --original");
        if (og->count()) o.original = orig;
        o.progress = cli.progress();
        const ckpt::Report r = ckpt::verify(in, o);
        cli.print_report(r);
        return r.ok ? 0 : cli.check_failed(in, r.failures.empty() ? "a check failed" : r.failures.front(), cli.json);
    });
}
