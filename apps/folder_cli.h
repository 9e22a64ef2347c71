// Folder mode front end shared by ckpt-compress, ckpt-verify and ckpt-restore: the folder
// options from the Cli flags, the job, and the summary printed by rank 0 only.
#pragma once
#include <unistd.h>

#include <functional>
#include <iostream>

#include "folder/folder.h"
#include "cli.h"

namespace ckpt::app {

/// --help footer on folder mode; names mpirun only when the tools were built with MPI.
/// `what` says what the tool takes in folder mode.
inline void add_folder_help(Cli& cli, const std::string& what) {
    cli.app.footer("Folder mode: " + what + "; formats/folder.md. " +
                   (mpi_built() ? "Built with MPI: under mpirun / srun the ranks share the files."
                                : "Built without MPI (CKPTKIT_MPI=OFF or not found): one process."));
}

/// Run a folder job (lib/folder/folder.h) with `fo` plus --force and a per-file progress line
/// (stderr a terminal, no --json or --quiet); rank 0 prints the summary (Cli::print_report) and, when
/// a check failed, the one line "TOOL: check failed: DIR: FILE: what" on stderr (also under -q) with
/// how many more failed. Returns the exit code: 0 ok, 1 a check failed; errors propagate to
/// Cli::main (exit 2 naming the file).
inline int run_folder(const Cli& cli, const std::function<folder::FolderReport(const folder::FolderOptions&)>& job,
                      folder::FolderOptions fo = {}) {
    fo.force = cli.force;
    fo.progress = cli.progress() && ::isatty(2);
    const folder::FolderReport r = job(fo);
    if (world_comm().rank() != 0) return r.ok ? 0 : 1;
    cli.print_report(r);
    if (r.ok) return 0;
    std::string what = r.failures.empty() ? "a check failed" : r.failures.front();
    if (r.failures.size() > 1)
        what += " (and " + std::to_string(r.failures.size() - 1) + " more " + (r.failures.size() == 2 ? "failure" : "failures") +
                ", listed in the report)";
    return cli.check_failed(r.input, what, true);
}

}  // namespace ckpt::app
