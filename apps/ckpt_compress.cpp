// ckpt-compress IN -o OUT.ckz.h5: guarded compression of the Adam/AdamW moments.
// ckpt-compress DIR -o OUT_DIR: folder mode (lib/folder/folder.h), also under mpirun / srun.
#include <CLI/CLI.hpp>

#include <iostream>

#include "folder/folder.h"
#include "ckpt/pipeline.h"
#include "container/h5.h"
#include "cli.h"
#include "folder_cli.h"
#include "codec/backend.h"
#include "ckpt/optimizer.h"

/// CLI11 check for a hyper-parameter override (--lr, --beta1, ...): a number torch.optim.Adam
/// accepts (ckpt/optimizer.h override_out_of_range).
static CLI::Validator hyper_override(const char* name) {
    return CLI::Validator(
        [name](std::string& s) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(s.c_str(), &end);
            if (s.empty() || *end != '\0') return "not a number: " + s;
            return ckpt::override_out_of_range(name, v);
        },
        "");
}

int main(int argc, char** argv) {
    ckpt::container::enable_direct_chunk_writes();  // before any other HDF5 call (container/h5.h says why)
    ckpt::app::Cli cli("ckpt-compress", "Compress the Adam/AdamW moments of a PyTorch or safetensors "
                       "checkpoint with a guarded variable-rate codec (vlog; log8, bf16, blockwise8 on request); every "
                       "other byte is kept exactly. Reduction is counted against 4 bytes per moment value. "
                       "Exit 0 ok, 1 a check failed, 2 bad input or usage.");
    CLI::App& app = cli.app;
    ckpt::app::add_folder_help(cli, "pass a checkpoint folder (HF Trainer checkpoint-N/, DeepSpeed global_stepN/ or its parent, DCP, any tree) and -o an output folder");
    std::string in, out, grad = "1.0", codec = "vlog";
    ckpt::CompressOptions o;
    double param_bound = 0;
    app.add_option("input", in, "checkpoint (.pt torch.save zip or legacy, .safetensors), or a checkpoint folder")->required();
    app.add_option("-o,--output", out, "container to write (.ckz.h5), or the output folder for a folder input")->required();
    cli.add_force();
    cli.add_rm();
    ckpt::app::add_threads_option(app);
    app.add_option("--tolerance", o.tolerance, "max |restored update - original update| (FP32), in units of lr, in (0, 1]")
        ->capture_default_str()->check(ckpt::app::unit_interval());
    std::string horizon = "all";
    app.add_option("--horizon", horizon, "updates the tolerance holds for: all (every update after restore, any "
                   "gradient sequence) | 1 (the first only; smaller files)")
        ->capture_default_str()->check(CLI::IsMember({"all", "1"}));
    std::string bound = "update";
    app.add_option("--bound", bound, "what the tolerance bounds: update (the update torch subtracts) | param (also the "
                   "parameter written at the first update: coordinates where 1 ulp of theta does not fit are kept exact)")
        ->capture_default_str()->check(CLI::IsMember({"update", "param"}));
    app.add_option("--grad-bound", grad, "per-coordinate gradient bound G, or inf")->capture_default_str();
    app.add_option("--codec", codec, "vlog (variable rate, entropy-coded) | log8 | bf16 | blockwise8")->capture_default_str()
        ->check(CLI::IsMember({"vlog", "log8", "bf16", "blockwise8"}));
    app.add_option("--optimizer", o.optimizer, "auto | adam | adamw (auto certifies both when unknown; never name "
                   "another optimizer than the file's: adamw on an Adam + L2 state certifies the wrong domain)")
        ->capture_default_str()->check(CLI::IsMember({"auto", "adam", "adamw"}));
    auto* pb = app.add_option("--param-bound", param_bound, "|theta| bound for Adam L2 when parameters are absent")
                   ->check(ckpt::app::finite_nonnegative());
    app.add_option("--lr", o.hyper.lr, "override the learning rate")->check(hyper_override("lr"));
    app.add_option("--beta1", o.hyper.beta1, "override beta1")->check(hyper_override("beta1"));
    app.add_option("--beta2", o.hyper.beta2, "override beta2")->check(hyper_override("beta2"));
    app.add_option("--eps", o.hyper.eps, "override eps")->check(hyper_override("eps"));
    app.add_option("--weight-decay", o.hyper.weight_decay, "override weight decay")->check(hyper_override("weight_decay"));
    app.add_option("--amsgrad", o.hyper.amsgrad, "override amsgrad (true/false)");
    app.add_option("--maximize", o.hyper.maximize, "override maximize (true/false)");
    app.add_option("--chunk", o.chunk, "coordinates per chunk (memory bound; rounded down to a multiple of 64; default " +
                   std::to_string(ckpt::codec::kCpuChunk) + " on the CPU, " + std::to_string(ckpt::codec::kDeviceChunk) + " on a CUDA device)")
        ->check(CLI::Range(std::size_t(64), std::size_t(1) << 30));
    app.add_option("--max-header-bytes", o.limits.max_header_bytes, "safetensors header limit")->capture_default_str();
    app.add_option("--max-pickle-bytes", o.limits.max_pickle_bytes, "data.pkl / legacy pickle limit")->capture_default_str();
    app.add_option("--max-memo-entries", o.limits.max_memo_entries, "pickle memo entries limit")->capture_default_str();
    app.add_flag("--strict", o.limits.strict, "accept only the globals torch.load(weights_only=True) accepts "
                 "(default: any other object is read as opaque data, never run)");
    ckpt::folder::FolderOptions fo;
    unsigned dcp_unit_mib = 256;
    app.add_option("--dcp-unit-mib", dcp_unit_mib, "folder mode, DCP: .distcp MiB gathered into one moments container "
                   "(at least; 0: one per group of linked files); the containers are shared among MPI ranks")
        ->capture_default_str();
    app.add_option("--device", o.device, "cpu | cuda | auto (auto: the GPU when one is present)")
        ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    return cli.main(argc, argv, in, [&] {
        try {
            o.grad_bound = ckpt::app::parse_bound(grad);
        } catch (const std::exception& e) {
            throw ckpt::app::UsageError(std::string("--grad-bound: ") + e.what());
        }
        o.codec = ckpt::codec::kind_from_name(codec);
        try {
            ckpt::codec::resolve_device(o.device);
        } catch (const std::exception& e) {
            throw ckpt::BadInput(in, e.what());
        }
        if (pb->count()) o.param_bound = param_bound;
        o.horizon = horizon == "all" ? 0 : 1;
        o.bound_param = bound == "param";
        const bool folder = ckpt::folder::is_folder(in);
        cli.require_rm_file(in, folder);
        if (folder) {
            fo.dcp_unit_bytes = uint64_t(dcp_unit_mib) << 20;
            return ckpt::app::run_folder(cli, [&](const ckpt::folder::FolderOptions& f) {
                return ckpt::folder::compress_folder(in, out, o, f);
            }, fo);
        }
        ckpt::check_outputs({in}, {out}, cli.force);
        o.progress = cli.progress();
        const ckpt::Report r = ckpt::compress(in, out, o);  // written, self-checked, fsynced and renamed
        if (r.ok) cli.remove_input(in);
        cli.print_report(r);
        return r.ok ? 0 : cli.check_failed(in, r.failures.empty() ? "a check failed" : r.failures.front(), cli.json);
    });
}
