// What every front end shares (ckpt-compress, ckpt-verify, ckpt-restore, replay-plan):
// --version, --json, --quiet, --force, --rm; exit codes 0 ok, 1 a check failed, 2 bad input or bad usage
// (every CLI11 parse error included); one stderr line per error, "TOOL: error: FILE: reason"
// (usage errors end with "(run 'TOOL --help')"); under --json one object on stdout, also on
// failure: {"ok": false, "tool", "file", "error", "exit_code"}; under --quiet nothing else
// (no table, warning or progress line: silent on success). Also --grad-bound "inf",
// --tolerance in (0, 1], --threads and the container check of verify and restore.
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <iostream>
#include <string>

#include <unistd.h>

#include "codec/codec.h"
#include "common/cleanup.h"
#include "common/process.h"
#include "common/error.h"
#include "common/file.h"

#ifndef CKPTKIT_VERSION
#error "CKPTKIT_VERSION must be defined (apps/CMakeLists.txt)"
#endif

namespace ckpt::app {

/// A usage mistake found after parsing (e.g. no --budget): exit 2 with the --help hint.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// One tool's front end: the CLI11 app with --version and --json, and the run loop that maps
/// every error to its exit code, stderr line and (under --json) error object.
class Cli {
    const char* tool_;

public:
    CLI::App app;  ///< add the tool's own options here
    bool json = false;   ///< --json given
    bool quiet = false;  ///< -q/--quiet given: errors and the --json object only
    bool force = false;  ///< --force given (after add_force)
    bool rm = false;     ///< --rm given (after add_rm)

    /// `tool` is the program name used in every message.
    Cli(const char* tool, const std::string& description) : tool_(tool), app(description, tool) {
        app.set_version_flag("--version", std::string(tool) + " ckptkit " CKPTKIT_VERSION,
                             "print the version and exit");
        app.add_flag("--json", json, "print one JSON object on stdout (also on failure)");
        app.add_flag("-q,--quiet", quiet, "print nothing on success (no table, warnings or progress); "
                     "errors stay one line on stderr, --json still prints its object");
    }

    /// A progress line is wanted (neither --json nor --quiet; common/progress.h also needs a
    /// terminal).
    bool progress() const { return !json && !quiet; }

    /// Print a finished report `r` (anything with json() and table()): its JSON object under
    /// --json, else its table unless --quiet.
    template <class R>
    void print_report(const R& r) const {
        if (json) std::cout << r.json() << "\n";
        else if (!quiet) std::cout << r.table();
        std::cout << std::flush;
    }

    /// --force: overwrite existing outputs (never an input). For tools that write files.
    void add_force() { app.add_flag("-f,--force", force, "overwrite an existing output (never the input)"); }

    /// --rm: remove the input file after success (as zstd). For tools that turn one file into
    /// another; a folder input is refused (require_rm_file).
    void add_rm() {
        app.add_flag("--rm", rm, "remove the input file once the output is written, fsynced, renamed and checked; "
                     "kept on any failure or signal. Files only: a folder input is refused (exit 2)");
    }

    /// Under --rm, refuse a folder input `in` (exit 2) before any work.
    void require_rm_file(const std::string& in, bool folder) const {
        if (rm && folder) throw BadInput(in, "--rm removes input files only, never a folder; run without --rm");
    }

    /// Under --rm, remove the input file `in` (the name given: a symlink is removed, not its
    /// target). Call only once the run has succeeded: its output written, fsynced, renamed
    /// and checked. A failure to remove is an error (exit 2); the output stays.
    void remove_input(const std::string& in) const {
        if (rm && ::unlink(in.c_str()) != 0)
            throw BadInput(in, std::string("--rm: cannot remove the input: ") + std::strerror(errno));
    }

    /// Parse argv, then run `body` (returns the exit code). `file` names the main input for
    /// error objects (it is read after parsing). Returns the process exit code.
    int main(int argc, char** argv, const std::string& file, const std::function<int()>& body) {
        tool_process_setup();  // SIGXFSZ ignored, chunk buffers kept in the heap (common/process.h)
        spdlog::set_default_logger(spdlog::stderr_color_mt(tool_));
        spdlog::set_pattern("%n: %l: %v");
        try {
            app.parse(argc, argv);
        } catch (const CLI::Success& e) {  // --help, --version: print, exit 0
            return app.exit(e);
        } catch (const CLI::ParseError& e) {
            json = json || json_requested(argc, argv);
            return usage(e.what(), "");
        }
        if (quiet) spdlog::set_level(spdlog::level::err);  // warnings and notes off; errors are not logged
        // Ctrl-C, kill and crashes remove the temporaries being written (common/cleanup.h);
        // a crash exits 2 with the usual error line and object
        install_signal_cleanup([&](const char* signame) {
            const std::string what = fatal_signal_reason(signame);
            FatalMessages m;
            m.err = file.empty() ? fmt::format("{}: error: {}\n", tool_, what) : fmt::format("{}: error: {}: {}\n", tool_, file, what);
            if (json) m.out = json_text(file, what, kExitBadInput) + "\n";
            return m;
        });
        try {
            return body();
        } catch (const UsageError& e) {
            return usage(e.what(), file);
        } catch (const BadInput& e) {
            return error(e.file, e.what(), kExitBadInput);
        } catch (const CheckFailed& e) {
            return check_failed(file, e.what());
        } catch (const std::bad_alloc&) {
            return error(file, "out of memory", kExitBadInput);
        } catch (const std::exception& e) {
            return error("", e.what(), kExitBadInput);
        }
    }

    /// A check failed (exit 1): "TOOL: check failed: [FILE: ]WHAT" on stderr (and the error
    /// object under --json unless `json_printed`: a report already on stdout carries it).
    int check_failed(const std::string& file, const std::string& what, bool json_printed = false) const {
        std::string w = one_line(what);
        if (!file.empty() && w.rfind(file + ": ", 0) == 0) w = w.substr(file.size() + 2);  // name the file once
        if (file.empty()) std::fprintf(stderr, "%s: check failed: %s\n", tool_, w.c_str());
        else std::fprintf(stderr, "%s: check failed: %s: %s\n", tool_, file.c_str(), w.c_str());
        if (json && !json_printed) print_json(file, w, kExitCheckFailed);
        return kExitCheckFailed;
    }

private:
    static std::string one_line(std::string s) {
        for (char& c : s)
            if (c == '\n' || c == '\r') c = ' ';
        return s;
    }
    // --json on the command line, for parse errors that stop before the flag is stored.
    static bool json_requested(int argc, char** argv) {
        for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i)
            if (std::strcmp(argv[i], "--json") == 0) return true;
        return false;
    }
    std::string json_text(const std::string& file, const std::string& what, int code) const {
        nlohmann::json j{{"ok", false}, {"tool", tool_}, {"error", one_line(what)}, {"exit_code", code}};
        if (!file.empty()) j["file"] = file;
        return j.dump();
    }
    void print_json(const std::string& file, const std::string& what, int code) const {
        std::cout << json_text(file, what, code) << std::endl;
    }
    int usage(const std::string& what, const std::string& file) const {
        return error("", what + " (run '" + tool_ + " --help')", kExitBadInput, file);
    }
    // "TOOL: error: [FILE: ]WHAT" on stderr; the error object under --json.
    int error(const std::string& file, const std::string& what, int code, const std::string& json_file = "") const {
        const std::string w = one_line(what);
        if (file.empty()) std::fprintf(stderr, "%s: error: %s\n", tool_, w.c_str());
        else std::fprintf(stderr, "%s: error: %s: %s\n", tool_, file.c_str(), w.c_str());
        if (json) print_json(file.empty() ? json_file : file, w, code);
        return code;
    }
};

/// "inf" or a positive number.
inline double parse_bound(const std::string& s) {
    if (s == "inf" || s == "Inf" || s == "INF") return INFINITY;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !(v > 0)) throw std::invalid_argument("not a positive number or inf: " + s);
    if (std::isinf(v)) throw std::invalid_argument("too large for a double: " + s + " (write inf for no bound)");
    return v;
}

/// CLI11 check for a number x with ok(x); otherwise the message is "S" + `outside`
/// (a non-number is "not a number: S"). `desc` is the --help text of the range.
inline CLI::Validator number_where(bool (*ok)(double), const char* outside, const char* desc) {
    return CLI::Validator(
        [ok, outside](std::string& s) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(s.c_str(), &end);
            if (s.empty() || *end != '\0') return "not a number: " + s;
            return ok(v) ? std::string() : s + outside;
        },
        desc);
}

/// CLI11 check for a finite number >= 0 (nan, inf and negatives are usage errors).
inline CLI::Validator finite_nonnegative() {
    return number_where([](double v) { return v >= 0 && v < INFINITY; }, " is not a finite number >= 0", "finite, >= 0");
}

/// CLI11 check for a tolerance: a number in (0, 1] (nan, 0, negatives and > 1 are usage errors).
inline CLI::Validator unit_interval() {
    return number_where([](double v) { return v > 0 && v <= 1; }, " is outside (0, 1] (units of lr)", "in (0, 1]");
}

/// --threads N: CPU threads for encoding, decoding and certificates (codec::set_cpu_threads;
/// default all cores; output identical for any N).
inline void add_threads_option(CLI::App& app) {
    app.add_option_function<unsigned>("--threads", [](const unsigned& n) { codec::set_cpu_threads(n); },
                                      "CPU threads (default: all cores; output identical for any count)")
        ->check(CLI::Range(1u, 1024u));
}

/// Verify and restore read a container: a readable file without the HDF5 signature (a .pt,
/// a .safetensors) is refused with what to pass instead. `what_to_do` ends the message.
inline void require_container(const std::string& path, const std::string& what_to_do) {
    if (readable_non_hdf5(path)) throw BadInput(path, "not a ckptkit container; " + what_to_do);
}

}  // namespace ckpt::app
