"""The package's exceptions, raised by the bindings (_ckptkit.cpp) with the CLI's one-line
messages: "TOOL: error: FILE: what is wrong", "TOOL: check failed: FILE: what failed".
Errors about a path are also the OSError subclass Python users expect (FileNotFound is a
FileNotFoundError, ...), with errno and filename set."""
import os as _os


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


class _OSBadInput(BadInput):
    """BadInput about a path, for the OSError subclass Python users catch (FileNotFoundError,
    PermissionError, ...): `errno`, `strerror` and `filename` (the user's path) are set as
    OSError's; str() is the one-line message."""

    def __init__(self, message, file=None, reason=None, errno=None):
        CkptkitError.__init__(self, message, file, reason)
        self.errno = errno
        self.strerror = _os.strerror(errno) if errno else None
        self.filename = file

    def __str__(self):
        return self.message

    def __reduce__(self):
        return (type(self), (self.message, self.file, self.reason, self.errno))


class FileNotFound(_OSBadInput, FileNotFoundError):
    """A missing file or folder (ENOENT): a FileNotFoundError that is also BadInput."""


class PermissionDenied(_OSBadInput, PermissionError):
    """A file or folder that may not be read or written (EACCES, EPERM): a PermissionError
    that is also BadInput."""


class IsADirectory(_OSBadInput, IsADirectoryError):
    """A folder where a file was expected (EISDIR): an IsADirectoryError that is also BadInput."""


class NotADirectory(_OSBadInput, NotADirectoryError):
    """A file where a folder was expected on the path (ENOTDIR): a NotADirectoryError that
    is also BadInput."""


class OSBadInput(_OSBadInput, OSError):
    """Any other OS error on a path (a read-only file system, a full disk): an OSError that
    is also BadInput."""
