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

/// A file with no Adam/AdamW optimizer state at all: nothing to compress (folder mode copies
/// such a file as it is).
struct NoAdamState : BadInput {
    using BadInput::BadInput;
};

/// Adam's L2 gradient domain of --horizon 1 needs the parameter values and the file has
/// none (folder mode retries with the bound of the model files next to it).
struct NeedsParamBound : BadInput {
    using BadInput::BadInput;
};

/// A verification check failed (integrity or certificate). Tools exit 1.
struct CheckFailed : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// A job cancelled from another thread (common/cancel.h): no output was written.
struct Interrupted : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Exit codes used by every tool.
enum ExitCode : int { kExitOk = 0, kExitCheckFailed = 1, kExitBadInput = 2 };

}  // namespace ckpt
