// Layouts recognised from their files (folder.h detect_layouts). Sources:
// HF transformers trainer.py _save_checkpoint (optimizer.pt, scheduler.pt, rng_state.pth,
// trainer_state.json, training_args.bin next to model.safetensors / pytorch_model.bin);
// DeepSpeed engine.py + runtime/zero/stage_1_and_2.py (global_stepN/ with
// [bf16_]zero_pp_rank_R_mp_rank_XX_optim_states.pt and mp_rank_XX_model_states.pt, the
// parent's `latest` naming the newest tag); Megatron-LM megatron/training/checkpointing.py
// (iter_NNNNNNN/mp_rank_XX[_YYY]/ with model_optim_rng.pt and, with the distributed optimizer in
// the legacy "torch" format, distrib_optim.pt: get_distributed_optimizer_checkpoint_name);
// torch.distributed.checkpoint filesystem.py and
// metadata.py (.metadata: a pickled Metadata whose storage_data maps MetadataIndex(fqn,
// offset) to _StorageInfo(relative_path, offset, length); items in *.distcp files).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "folder/folder.h"
#include "folder/dcp.h"
#include "folder/files.h"
#include "common/error.h"
#include "io/file.h"

#include <filesystem>

namespace ckpt::folder {

namespace {

/// What a DCP .metadata says: items, files, and the moment items among them.
std::string dcp_summary(const std::string& dir) {
    std::set<std::string> files, fqns;
    uint64_t moments = 0, moment_bytes = 0;
    const std::vector<DcpItem> items = dcp_items(dir);
    for (const auto& it : items) {
        files.insert(it.file);
        fqns.insert(it.fqn);
        if (is_moment_fqn(it.fqn)) {
            ++moments;
            moment_bytes += it.length;
        }
    }
    return fmt::format("{} FQNs, {} items in {} .distcp files; {} moment items ({} bytes)", fqns.size(), items.size(),
                       files.size(), moments, moment_bytes);
}

}  // namespace

std::optional<std::pair<double, std::string>> model_param_bound(const std::string& dir, const Limits& limits) {
    std::vector<std::string> models;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        const bool st = n == "model.safetensors" || (n.rfind("model-", 0) == 0 && n.ends_with(".safetensors"));
        const bool pt = n == "pytorch_model.bin" || (n.rfind("pytorch_model-", 0) == 0 && n.ends_with(".bin"));
        if ((st || pt) && e.is_regular_file()) models.push_back(n);
    }
    if (models.empty()) return std::nullopt;
    std::sort(models.begin(), models.end());
    double bound = 0;
    std::string names;
    for (const auto& n : models) {
        const std::string path = join(dir, n);
        const Checkpoint ck = read_checkpoint(path, limits);
        bound = std::max(bound, max_abs_storages(ck, io::InputFile(path), "a model tensor"));
        names += (names.empty() ? "" : ", ") + n;
    }
    return std::make_pair(bound, names);
}

std::shared_ptr<const CompanionHyper> megatron_companion(const std::string& path, const Limits& limits) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return nullptr;
    const Checkpoint ck = read_checkpoint(path, limits);
    auto c = megatron_hyper(ck, io::InputFile(path));
    if (!c) return nullptr;
    return std::make_shared<const CompanionHyper>(std::move(*c));
}

std::vector<Layout> detect_layouts(const std::string& root, const std::vector<std::string>& files) {
    std::map<std::string, std::set<std::string>> by_dir;   // folder -> file names
    for (const auto& f : files) by_dir[parent_of(f)].insert(base_of(f));
    std::vector<Layout> out;
    for (const auto& entry : by_dir) {
        const std::string& dir = entry.first;
        const std::set<std::string>& names = entry.second;  // (clang 14: lambdas cannot capture bindings)
        auto has = [&](const char* n) { return names.count(n) > 0; };
        // HF Trainer checkpoint-N/
        if (has("optimizer.pt")) {
            for (const char* m : {"model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                                  "pytorch_model.bin.index.json"})
                if (has(m)) {
                    out.push_back({"hf-trainer", dir, std::string("optimizer.pt + ") + m, ""});
                    break;
                }
        }
        // DeepSpeed ZeRO-1/2 global_stepN/
        std::size_t shards = 0;
        for (const auto& n : names) shards += n.ends_with("optim_states.pt");
        if (shards) {
            const std::string model = std::any_of(names.begin(), names.end(), [](auto& n) { return n.ends_with("model_states.pt"); })
                                          ? " + *model_states.pt" : "";
            out.push_back({"deepspeed-zero", dir, fmt::format("{} *optim_states.pt shards{}", shards, model), ""});
        }
        if (has("latest") && by_dir.size() > 1) {
            std::string tag;
            try {
                const io::InputFile f(join(root, join(dir, "latest")));
                tag = f.read_string(0, std::size_t(std::min<uint64_t>(f.size(), 256)), "latest");
                while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
            } catch (const BadInput&) {}
            if (!tag.empty() && by_dir.count(join(dir, tag)))
                out.push_back({"deepspeed-zero", dir, "latest -> " + tag, "parent folder of the tagged checkpoints"});
        }
        // Megatron-LM legacy checkpoint with the distributed optimizer's parameter state
        if (has("distrib_optim.pt")) {
            if (has("model_optim_rng.pt"))
                out.push_back({"megatron", dir, "distrib_optim.pt + model_optim_rng.pt", ""});
            else
                out.push_back({"megatron", dir, "distrib_optim.pt", std::string(kMegatronAlone)});
        }
        // torch.distributed.checkpoint
        if (has(".metadata") && std::any_of(names.begin(), names.end(), [](auto& n) { return n.ends_with(".distcp"); })) {
            // Megatron-LM's torch_dist (dist_checkpointing's torch_dist strategy): its common
            // state in common.pt, the backend in metadata.json
            Layout l{"dcp", dir, has("common.pt") && has("metadata.json") ? ".metadata + *.distcp + Megatron common.pt" : ".metadata + *.distcp", ""};
            try {
                l.note = dcp_summary(join(root, dir));
            } catch (const std::exception& e) {
                l.note = std::string(".metadata unreadable (") + e.what() + "); every file copied exact";
            }
            out.push_back(l);
        }
    }
    return out;
}

}  // namespace ckpt::folder
