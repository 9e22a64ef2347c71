"""Paths checked in Python before the library sees them, so that the common mistakes raise
the user's path, the reason (strerror) and the OSError subclass Python users catch
(_errors.FileNotFound is a FileNotFoundError and a BadInput, ...), never the name of a
hidden temporary: a missing or unwritable output folder, "~" (not expanded, as torch.save
and torch.load do not expand it either), a missing or unreadable input, a folder where a
file is expected, a container shorter than its HDF5 superblock says (truncated)."""
import errno as _errno
import os
import stat

from ._errors import (FileNotFound, IsADirectory, NotADirectory, OSBadInput,
                      PermissionDenied)

_CLASS = {_errno.ENOENT: FileNotFound, _errno.EACCES: PermissionDenied, _errno.EPERM: PermissionDenied,
          _errno.EISDIR: IsADirectory, _errno.ENOTDIR: NotADirectory}


def os_error(tool, path, code, what):
    """The BadInput subclass for errno `code` on the user's `path`: "TOOL: error: PATH: what"."""
    cls = _CLASS.get(code, OSBadInput)
    return cls(f"{tool}: error: {path}: {what}", path, what, code)


def _tilde(path):
    """The hint for a path starting with "~" (which nothing expands here)."""
    if path == "~" or path.startswith("~/") or (path.startswith("~") and "/" in path):
        return (f"; '~' is not expanded (torch.save and torch.load do not expand it either): "
                f"pass os.path.expanduser({path!r})")
    return ""


def check_output(tool, path):
    """Refuse, before any work, an output file that cannot be created: its folder missing,
    not a folder, or not writable (probed by creating and removing a hidden file there, so
    the reason is the system's: permission denied, read-only file system, ...), or the path
    a folder."""
    parent = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise os_error(tool, path, _errno.EISDIR, "cannot write: it is a folder (Is a directory)")
    try:
        st = os.stat(parent)
    except OSError as e:
        if e.errno == _errno.ENOENT:
            raise os_error(tool, path, e.errno, f"cannot write: folder {parent} does not exist "
                                                f"({os.strerror(e.errno)}){_tilde(path)}") from None
        raise os_error(tool, path, e.errno, f"cannot write into folder {parent}: {os.strerror(e.errno)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise os_error(tool, path, _errno.ENOTDIR, f"cannot write: {parent} is not a folder (Not a directory)")
    probe = os.path.join(parent, f".{os.path.basename(path)}.probe-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    except FileExistsError:
        return   # a probe of another thread of this process: the folder is writable
    except OSError as e:
        raise os_error(tool, path, e.errno, f"cannot write into folder {parent}: {os.strerror(e.errno)}") from None
    os.close(fd)
    os.unlink(probe)


def check_input(tool, path, folder_ok=False, folder_hint=""):
    """Refuse an input that is missing ("no such file"), unreadable or, unless `folder_ok`,
    a folder, with the subclass of FileNotFoundError / PermissionError / IsADirectoryError."""
    try:
        st = os.stat(path)
    except OSError as e:
        what = "no such file" if e.errno == _errno.ENOENT else f"cannot read: {os.strerror(e.errno)}"
        if e.errno == _errno.ENOENT:
            what += f" ({os.strerror(e.errno)}){_tilde(path)}"
        raise os_error(tool, path, e.errno, what) from None
    if stat.S_ISDIR(st.st_mode):
        if not folder_ok:
            raise os_error(tool, path, _errno.EISDIR, "is a folder" + folder_hint)
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise os_error(tool, path, e.errno, f"cannot read: {os.strerror(e.errno)}") from None
