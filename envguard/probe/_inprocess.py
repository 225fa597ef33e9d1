"""Interpreter facts, gathered inside the target interpreter.

This file is run as a plain script by *another* interpreter (``envguard snapshot
--python PATH``), which need not have envguard, packaging or anything but the
standard library. Keep it stdlib-only and Python 3.6 compatible: no annotations
that need newer syntax, no walrus, no ``from __future__``-only features.
It prints one Python literal (a dict of str, int, bool, None and lists) on stdout,
which the parent reads with ``ast.literal_eval``.

It runs before every ``--python`` snapshot, so it imports as little as it can: no
json, tempfile, getpass or typing (about 25 ms of a 40 ms run); their few lines of
logic that matter are reproduced below.
"""

import os
import site
import sys
import sysconfig

MYPY = False
if MYPY:  # type comments only; typing is not imported at run time
    from typing import Any, Dict, List, Optional  # noqa: F401, UP035


def _user():
    # type: () -> Optional[str]
    """``getpass.getuser()``: LOGNAME, USER, LNAME, USERNAME, then the passwd entry."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        value = os.environ.get(name)
        if value:
            return value
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, AttributeError):  # no passwd entry in some containers
        return None


def _tempdir():
    # type: () -> str
    """``tempfile.gettempdir()``: TMPDIR, TEMP, TMP, then the platform's usual folders.

    tempfile also proves a folder writable by creating a file in it; a writable-and-
    searchable check gives the same answer without touching the disk.
    """
    candidates = [os.environ.get(n) for n in ("TMPDIR", "TEMP", "TMP")]
    if os.name == "nt":
        candidates += [r"c:\temp", r"c:\tmp", r"\temp", r"\tmp"]
    else:
        candidates += ["/tmp", "/var/tmp", "/usr/tmp"]  # noqa: S108 - the stdlib order
    for folder in candidates:
        if folder and os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
            return os.path.abspath(folder)
    return os.getcwd()


def collect(drop_first_path=False):
    # type: (bool) -> Dict[str, Any]
    """Facts about the running interpreter, as a JSON-ready dict.

    ``drop_first_path`` removes ``sys.path[0]``: the script's folder or the current
    directory, which is where the probe was started, not part of the environment.
    """
    path = list(sys.path)
    if drop_first_path and path and not getattr(sys.flags, "safe_path", False):
        path = path[1:]
    site_dirs = []  # type: List[str]
    try:
        site_dirs.extend(site.getsitepackages())
    except AttributeError:  # old virtualenv's site module lacks it
        pass
    for key in ("purelib", "platlib"):
        value = sysconfig.get_paths().get(key)
        if value and value not in site_dirs:
            site_dirs.append(value)
    if site.ENABLE_USER_SITE:
        user_site = site.getusersitepackages()
        if user_site not in site_dirs:
            site_dirs.append(user_site)
    soabi = sysconfig.get_config_var("SOABI")
    glibc = None
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        pass
    impl = sys.implementation.name
    short = {"cpython": "cp", "pypy": "pp"}.get(impl, impl)
    return {
        "executable": sys.executable,
        "version": "%d.%d.%d" % sys.version_info[:3],
        "version_full": sys.version,
        "implementation": impl,
        "interpreter_tag": "%s%d%d" % (short, sys.version_info[0], sys.version_info[1]),
        "soabi": soabi,
        "platform": sysconfig.get_platform(),
        "prefix": sys.prefix,
        "base_prefix": getattr(sys, "base_prefix", sys.prefix),
        "is_venv": getattr(sys, "base_prefix", sys.prefix) != sys.prefix,
        "sys_path": path,
        "site_packages": site_dirs,
        "glibc": glibc,
        "tempdir": _tempdir(),
        "user": _user(),
        "uid": os.getuid() if hasattr(os, "getuid") else None,
        "home": os.path.expanduser("~"),
        "scripts": sysconfig.get_paths().get("scripts"),
        "maxsize_64bit": sys.maxsize > 2**32,
    }


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    sys.stdout.write(repr(collect(drop_first_path=False)) + "\n")
