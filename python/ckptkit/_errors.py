"""The package's exceptions, raised by the bindings (_ckptkit.cpp) with the CLI's one-line
messages: "TOOL: error: FILE: what is wrong", "TOOL: check failed: FILE: what failed"."""


class CkptkitError(Exception):
    """Base of ckptkit's errors: `message` (one line), `file` and `reason` (its parts)."""

    def __init__(self, message, file=None, reason=None, report=None):
        super().__init__(message)
        self.message = message
        self.file = file or None
        self.reason = reason or message
        #: the Report of a check that failed (verify, compress), when there is one
        self.report = report


class BadInput(CkptkitError, ValueError):
    """Malformed, truncated or hostile input, a bad option, or an output that cannot be
    written (the CLI's exit 2). Nothing partial is left behind."""


class CheckFailed(CkptkitError):
    """A verification check failed (the CLI's exit 1); `report` holds the full Report when
    the job made one."""


class CkptkitWarning(UserWarning):
    """A warning line of the library (states kept exact, many escapes)."""
