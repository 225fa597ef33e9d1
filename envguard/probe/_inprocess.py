"""Interpreter facts, gathered inside the target interpreter.

This file is run as a plain script by *another* interpreter (``envguard snapshot
--python PATH``), which need not have envguard, packaging or anything but the
standard library. Keep it stdlib-only and Python 3.6 compatible: no annotations
that need newer syntax, no walrus, no ``from __future__``-only features.
It prints one JSON object on stdout.
"""

import getpass
import json
import os
import site
import sys
import sysconfig
import tempfile

try:  # typing exists on every Python 3 the probe supports; only for type comments
    from typing import Any, Dict, Optional  # noqa: F401, UP035 - used in type comments
except ImportError:  # pragma: no cover
    pass


def _user():
    # type: () -> Optional[str]
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return None


def collect(drop_first_path=False):
    # type: (bool) -> Dict[str, Any]
    """Facts about the running interpreter, as a JSON-ready dict.

    ``drop_first_path`` removes ``sys.path[0]``: the script's folder or the current
    directory, which is where the probe was started, not part of the environment.
    """
    path = list(sys.path)
    if drop_first_path and path and not getattr(sys.flags, "safe_path", False):
        path = path[1:]
    site_dirs = []  # type: list[str]
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
        "tempdir": tempfile.gettempdir(),
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
    json.dump(collect(drop_first_path=False), sys.stdout)
    sys.stdout.write("\n")
