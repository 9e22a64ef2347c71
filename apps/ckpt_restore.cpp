// ckpt-restore IN.ckz.h5 -o OUT: the checkpoint back, in its source format.
// ckpt-restore OUT_DIR -o DIR2: folder mode (lib/folder/folder.h), also under mpirun / srun.
#include <CLI/CLI.hpp>

#include <iostream>

#include "folder/folder.h"
#include "ckpt/pipeline.h"
#include "cli.h"
#include "folder_cli.h"
#include "codec/backend.h"

int main(int argc, char** argv) {
    ckpt::app::Cli cli("ckpt-restore", "Rebuild the checkpoint from a container (torch.load / safetensors "
                       "readers accept it). Exit 0 ok, 1 a check failed, 2 bad input or usage.");
    CLI::App& app = cli.app;
    ckpt::app::add_folder_help(cli, "pass the folder ckpt-compress wrote and -o the folder to restore into");
    std::string in, out, device = "auto";
    app.add_option("input", in, "container (.ckz.h5), or a folder ckpt-compress wrote")->required();
    app.add_option("-o,--output", out, "checkpoint to write (.pt or .safetensors, as the source), or the folder to write")->required();
    cli.add_force();
    cli.add_rm();
    app.add_option("--device", device, "cpu | cuda | auto (auto: the GPU when one is present)")
        ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    ckpt::app::add_threads_option(app);
    return cli.main(argc, argv, in, [&] {
        const bool folder = ckpt::folder::is_folder(in);
        cli.require_rm_file(in, folder);
        if (!folder) {
            ckpt::check_outputs({in}, {out}, cli.force);
            ckpt::app::require_container(in, "pass the container (.ckz.h5) that ckpt-compress wrote");
        }
        try {
            ckpt::codec::set_decode_device(ckpt::codec::resolve_device(device));
        } catch (const std::exception& e) {
            throw ckpt::BadInput(in, e.what());
        }
        ckpt::RestoreOptions o;
        if (folder)
            return ckpt::app::run_folder(cli, [&](const ckpt::folder::FolderOptions& fo) {
                return ckpt::folder::restore_folder(in, out, o, fo);
            });
        o.progress = cli.progress();
        const ckpt::Report r = ckpt::restore(in, out, o);  // every checksum checked, fsynced and renamed
        cli.remove_input(in);
        cli.print_report(r);
        return 0;
    });
}
