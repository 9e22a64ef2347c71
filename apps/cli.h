// What every ckpt-* front end shares: exit codes for errors (BadInput -> 2 with one line
// "tool: error: FILE: reason", CheckFailed -> 1) and parsing of --grad-bound "inf".
#pragma once
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <functional>
#include <string>

#include "codec/codec.h"
#include "common/error.h"

namespace ckpt::app {

/// Run the tool body; map exceptions to one stderr line and the exit code.
inline int run(const char* tool, const std::function<int()>& body) {
    std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit becomes a write error (exit 2), not a kill
    spdlog::set_default_logger(spdlog::stderr_color_mt(tool));
    spdlog::set_pattern("%n: %l: %v");
    try {
        return body();
    } catch (const BadInput& e) {
        std::fprintf(stderr, "%s: error: %s: %s\n", tool, e.file.c_str(), e.what());
        return kExitBadInput;
    } catch (const CheckFailed& e) {
        std::fprintf(stderr, "%s: check failed: %s\n", tool, e.what());
        return kExitCheckFailed;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
        return kExitBadInput;
    }
}

/// "inf" or a positive number.
inline double parse_bound(const std::string& s) {
    if (s == "inf" || s == "Inf" || s == "INF") return INFINITY;
    std::size_t pos = 0;
    const double v = std::stod(s, &pos);
    if (pos != s.size() || !(v > 0)) throw std::invalid_argument("not a positive number or inf: " + s);
    return v;
}

/// --threads N: CPU threads for encoding, decoding and certificates (codec::set_cpu_threads;
/// default all cores; output identical for any N).
inline void add_threads_option(CLI::App& app) {
    app.add_option_function<unsigned>("--threads", [](const unsigned& n) { codec::set_cpu_threads(n); },
                                      "CPU threads (default: all cores; output identical for any count)")
        ->check(CLI::Range(1u, 1024u));
}

}  // namespace ckpt::app
