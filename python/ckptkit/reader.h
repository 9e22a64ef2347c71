// The package's container reads (ckptkit.load / verify / restore), described by one JSON
// request and run either in the helper process ckptkit-reader (reader_main.cpp; the
// default, so that a container that crashes libhdf5 ends the helper and the call raises
// BadInput: common/isolate.h) or in the interpreter (_ckptkit.cpp; decoding on the GPU, or
// CKPTKIT_ISOLATE=0). Both run the functions below, over lib/ckpt and lib/folder as the
// tools do: no logic twice.
#pragma once

#include <nlohmann/json.hpp>
#include <spdlog/sinks/base_sink.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "folder/folder.h"

namespace ckpt::pkg {

/// What a failed job raises in Python: cls "BadInput" | "CheckFailed" | "" (none) with the
/// CLI's one-line message ("TOOL: error: FILE: what"), its file and reason.
struct Failure {
    std::string cls, message, file, reason;
};

/// BadInput's Failure with the tools' line "TOOL: error: FILE: WHY" ("TOOL: error: WHY"
/// when `file` is empty).
Failure bad_input(const std::string& tool, const std::string& file, const std::string& why);

/// Run job() and say what it raised, as the package raises it (BadInput, CheckFailed,
/// std::bad_alloc as BadInput "out of memory", any other std::exception as BadInput);
/// `file` names the input of check failures.
Failure call_job(const char* tool, const std::string& file, const std::function<void()>& job);

/// The package's options (the Python side checked them; _ckptkit.cpp's to_json), with typed
/// getters and defaults. Plain JSON: read without the GIL.
struct Opts {
    nlohmann::json j = nlohmann::json::object();
    bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
    template <class T> T get(const char* k, T def) const { return has(k) ? j[k].get<T>() : def; }
    template <class T> std::optional<T> opt(const char* k) const {
        return has(k) ? std::optional<T>(j[k].get<T>()) : std::nullopt;
    }
};

/// Folder mode's options from the package's options (force, dcp_unit_mib).
folder::FolderOptions folder_options(const Opts& o);

/// One container read. req: {"job": "verify" | "restore" | "restore_bytes", "tool", "src",
/// "dst" (restore), "original" (verify; null for none), "threads", "opts": {"grid",
/// "strict", "force", "device", "dcp_unit_mib"} (each optional)}. Returns its outputs:
/// verify (json, table, "1" | "0" for ok, first failure), restore (json, table),
/// restore_bytes (json, table, bytes: the restored file written into the memfd `memfd`,
/// sized to it). Throws the library's errors (BadInput, CheckFailed, ...).
std::vector<std::string> run_read_job(const nlohmann::json& req, int memfd);

/// A finished job as one message (the helper's result) and back: the failure, the lines
/// the library logged, the outputs. unpack_result throws std::runtime_error on a message
/// that is not one.
std::string pack_result(const Failure& f, const std::vector<std::string>& lines, const std::vector<std::string>& outs);
void unpack_result(const std::string& m, Failure& f, std::vector<std::string>& lines, std::vector<std::string>& outs);

/// spdlog sink gathering the lines a job logs ("warning: ..."), which the package hands
/// back with the report (and raises as CkptkitWarning).
class CollectSink final : public spdlog::sinks::base_sink<std::mutex> {
public:
    std::vector<std::string> take();

protected:
    void sink_it_(const spdlog::details::log_msg& msg) override;
    void flush_() override {}

private:
    std::vector<std::string> lines_;
};

/// Install a CollectSink as spdlog's default logger (pattern "%l: %v"); returns it.
std::shared_ptr<CollectSink> collect_logs();

}  // namespace ckpt::pkg
