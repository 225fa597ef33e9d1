"""Finding and reading a command's lockfile: ``lockfiles/`` here or in a parent, then the
bundled ones."""

from __future__ import annotations

from pathlib import Path

from envguard.errors import InputError
from envguard.gate.lockfile import Lock, parse_lock
from envguard.input_file import read_input

_PACKAGE = Path(__file__).resolve().parents[1]
"""envguard/, as installed or in the checkout."""


def bundled_lock_dirs() -> list[Path]:
    """Lockfiles shipped with envguard: inside the wheel, or the source checkout's."""
    return [_PACKAGE / "lockfiles", _PACKAGE.parent / "lockfiles"]


def find_lock(name: str, cwd: Path) -> Path:
    """``lockfiles/NAME.toml`` in ``cwd`` or the nearest parent that has one, else the
    bundled one."""
    here = cwd.absolute()
    for folder in (*(d / "lockfiles" for d in (here, *here.parents)), *bundled_lock_dirs()):
        candidate = folder / f"{name}.toml"
        if candidate.is_file():
            return candidate
    raise InputError(f"no lockfile for {name!r}: looked in lockfiles/ here and in every parent "
                     f"folder, and the bundled lockfiles; create one with `envguard lock {name}`")


def read_lock(path: Path) -> Lock:
    """The lockfile at ``path``: a regular file of at most MAX_INPUT_BYTES (InputError)."""
    raw = read_input(path, what="lockfile")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    return parse_lock(text, str(path))


def project_root_of(lock_path: Path) -> Path:
    """The folder that holds ``lockfiles/``: locked file paths are relative to it.

    A lock bundled inside the installed package (``envguard/lockfiles/``, where the wheel
    puts the checkout's ``lockfiles/``) pins files of the checkout (``dflash/**/*.py``):
    they are where the same wheel installed them, beside ``envguard/`` (site-packages)."""
    folder = lock_path.resolve().parent
    if folder == _PACKAGE / "lockfiles":
        return _PACKAGE.parent
    return folder.parent if folder.name == "lockfiles" else folder
