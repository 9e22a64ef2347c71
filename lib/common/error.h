// Error types shared by every tool. Source of the exit-code convention: docs/design.md §6.
#pragma once
#include <stdexcept>
#include <string>

namespace ckpt {

/// Malformed, truncated or hostile input. Tools print "FILE: message" and exit 2.
struct BadInput : std::runtime_error {
    std::string file;
    BadInput(std::string file_, const std::string& what)
        : std::runtime_error(what), file(std::move(file_)) {}
};

/// A verification check failed (integrity or certificate). Tools exit 1.
struct CheckFailed : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Exit codes used by every tool.
enum ExitCode : int { kExitOk = 0, kExitCheckFailed = 1, kExitBadInput = 2 };

}  // namespace ckpt
