"""Finding and reading a command's lockfile: ``lockfiles/`` here or in a parent, then the
bundled ones."""

from __future__ import annotations

from pathlib import Path

from envguard.errors import InputError
from envguard.gate.lockfile import Lock, parse_lock
from envguard.input_file import read_input


def bundled_lock_dirs() -> list[Path]:
    """Lockfiles shipped with envguard: inside the wheel, or the source checkout's."""
    package = Path(__file__).resolve().parents[1]  # envguard/
    return [package / "lockfiles", package.parent / "lockfiles"]


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
    """The folder that holds ``lockfiles/``: locked file paths are relative to it."""
    folder = lock_path.resolve().parent
    return folder.parent if folder.name == "lockfiles" else folder
