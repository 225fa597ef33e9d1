"""The one builder of package-tool command lines: the argv that ``doctor --fix``, ``restore``
and ``bisect`` run, and the remedies printed for a person to paste, from the same functions.

Every name, version, URL, path and interpreter spec that goes into a uv, pip, conda or
micromamba command line is read from a document (a snapshot, a lock) or from an
environment (METADATA, ``direct_url.json``), so each is checked here before it becomes a
word of a command:

- a distribution name must be PEP 508 shaped (``^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$``,
  stricter than :func:`packaging.utils.canonicalize_name`'s validation);
- a version must parse as a PEP 440 version (local labels such as ``+cu128`` included);
- a Python spec for ``uv venv --python`` is ``X.Y`` or ``X.Y.Z`` digits only (a path is
  only ever one the user typed, never one read from a snapshot);
- a URL must have an allowed scheme; a path must be absolute;
- nothing that goes after the options may start with ``-`` or hold a control character.

The requirements always come after ``--`` (uv, pip, conda and micromamba all end their
options there), so even a word that slipped past the checks cannot be read as an option.
An unusable value raises :class:`UnsafeValue` (exit 2) naming the field it came from; the
printed form of a command is :func:`shell_line` (each word quoted for the shell).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import unquote, urlparse

from packaging.version import InvalidVersion, Version

from envguard.errors import InputError
from envguard.model import DirectUrl, Distribution

_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_CONDA_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
_CONDA_FIELD = re.compile(r"[A-Za-z0-9_.+!*]+")
_PYTHON_SPEC = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,4})?")
_PYTHON_VERSION = re.compile(r"([0-9]{1,3}\.[0-9]{1,3})(\.[0-9]{1,4})?[A-Za-z0-9.+]{0,16}")
_SUBDIR_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
"""Control characters, and surrogates (bytes that were not UTF-8)."""
_PLAIN_REQUIREMENT = re.compile(r"[A-Za-z0-9_.+=<>~,-]+")
URL_SCHEMES = ("https", "http", "file")
VCS_SCHEMES = ("git", "hg", "svn", "bzr")
MAX_WORD = 4096


class UnsafeValue(InputError):
    """A value read from a document or an environment that cannot go into a command line:
    an invalid name, version, URL, path or Python spec (exit 2). The message names the
    field it came from (``packages.torch.version``)."""

    def __init__(self, field: str, value: object, what: str) -> None:
        self.field = field
        super().__init__(f"{field}: {shown(value)} is not {what}; refusing to pass it to "
                         "a package tool")


def shown(value: object, limit: int = 120) -> str:
    """A value as one printable line (repr, control characters escaped, shortened)."""
    text = ascii(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def field_key(text: str) -> str:
    """A name as one part of a dotted field path, printable whatever it holds."""
    return re.sub(r"[^\x21-\x7e]", "?", text)[:120] or "?"


# ------------------------------------------------------------------------- single values

def check_name(name: object, field: str) -> str:
    """A distribution name that may be a word of a command (returned unchanged)."""
    if not isinstance(name, str) or len(name) > 200 or not _NAME.fullmatch(name):
        raise UnsafeValue(field, name, "a valid distribution name")
    return name


def valid_name(name: object) -> bool:
    try:
        check_name(name, "name")
    except UnsafeValue:
        return False
    return True


def check_version(version: object, field: str) -> str:
    """A PEP 440 version (``2.11.0+cu128`` too), returned unchanged."""
    if not isinstance(version, str) or len(version) > 200 or not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9.+!_-]*", version):
        raise UnsafeValue(field, version, "a valid version")
    try:
        Version(version)
    except InvalidVersion:
        raise UnsafeValue(field, version, "a valid version") from None
    return version


def valid_version(version: object) -> bool:
    try:
        check_version(version, "version")
    except UnsafeValue:
        return False
    return True


def check_python_spec(spec: object, field: str) -> str:
    """``X.Y`` or ``X.Y.Z`` digits: what ``uv venv --python`` gets from a document."""
    if not isinstance(spec, str) or not _PYTHON_SPEC.fullmatch(spec):
        raise UnsafeValue(field, spec, "a Python version (X.Y or X.Y.Z)")
    return spec


def python_minor(version: object, field: str) -> str:
    """``X.Y`` of an interpreter version as a snapshot records it (``3.11.7``,
    ``3.13.0rc1``, ``3.12.1+``); anything else is refused."""
    found = _PYTHON_VERSION.fullmatch(version) if isinstance(version, str) else None
    if found is None:
        raise UnsafeValue(field, version, "a Python version (X.Y or X.Y.Z)")
    return check_python_spec(found.group(1), field)


def python_spec(version: object, field: str) -> str:
    """The version itself when it is ``X.Y.Z`` digits, else its ``X.Y``."""
    if isinstance(version, str) and _PYTHON_SPEC.fullmatch(version):
        return version
    return python_minor(version, field)


def user_python(value: str) -> tuple[str, bool]:
    """A ``--python`` the user typed: (``X.Y[.Z]`` spec, False) or (absolute path, True); a
    bare name (``python3.12``) is looked up on PATH."""
    if _PYTHON_SPEC.fullmatch(value):
        return value, False
    found = value if "/" in value else shutil.which(value)
    if found is None:
        raise UnsafeValue("--python", value, "an X.Y version, a path or a command on PATH")
    return os.path.abspath(found), True


def check_url(url: object, field: str, schemes: Sequence[str] = URL_SCHEMES) -> str:
    """A URL with one of ``schemes`` (``git+https`` counts as ``https`` for a VCS URL)."""
    if (not isinstance(url, str) or len(url) > MAX_WORD or url.startswith("-")
            or _CONTROL.search(url) or re.search(r"\s", url)):
        raise UnsafeValue(field, url, "a usable URL")
    scheme = urlparse(url).scheme.lower()
    base = scheme.split("+", 1)[1] if scheme.split("+", 1)[0] in VCS_SCHEMES and "+" in scheme \
        else scheme
    if base not in schemes or not re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", url, re.IGNORECASE):
        raise UnsafeValue(field, url, f"a URL with scheme {', '.join(schemes)}")
    return url


def check_path(path: object, field: str) -> str:
    """An absolute path with no control characters."""
    if (not isinstance(path, str) or not path.startswith("/") or len(path) > MAX_WORD
            or _CONTROL.search(path)):
        raise UnsafeValue(field, path, "an absolute path")
    return path


def check_subdirectory(sub: object, field: str) -> str:
    """A PEP 610 ``subdirectory``: a relative path of plain parts (no ``..``, no ``-x``)."""
    parts = sub.split("/") if isinstance(sub, str) and len(sub) <= 1024 else None
    if not parts or not all(_SUBDIR_PART.fullmatch(p) and p not in (".", "..")
                            for p in parts):
        raise UnsafeValue(field, sub, "a usable subdirectory (a relative path of plain names)")
    return str(sub)


def check_conda_spec(spec: str, field: str) -> str:
    """``name`` or ``name=version=build`` of a conda package."""
    name, *rest = spec.split("=")
    if not _CONDA_NAME.fullmatch(name) or len(rest) > 2 or not all(
            _CONDA_FIELD.fullmatch(x) for x in rest):
        raise UnsafeValue(field, spec, "a valid conda package spec")
    return spec


def pin(name: str, version: str, field: str) -> str:
    """``name==version``, both checked (``field``: ``packages.NAME``)."""
    return f"{check_name(name, f'{field}.name')}=={check_version(version, f'{field}.version')}"


def check_argument(word: str, field: str) -> str:
    """A word that goes after ``--``: a requirement, a wheel path or URL, a name."""
    if not word or word.startswith("-") or len(word) > MAX_WORD or _CONTROL.search(word):
        raise UnsafeValue(field, word, "a requirement, path or URL")
    return word


def reinstall_source(direct: DirectUrl | None, name: str, version: str, field: str,
                     exists: Callable[[str], bool] = os.path.isfile) -> str | None:
    """What reinstalls exactly this build: ``name==version`` from an index, the wheel file
    (an existing one) or URL it was installed from; None for a folder, a VCS checkout or a
    wheel file that is gone."""
    if direct is None:
        return pin(name, version, field)
    check_name(name, f"{field}.name")
    if direct.editable or direct.vcs or not direct.url.endswith(".whl"):
        return None
    url = check_url(direct.url, f"{field}.direct_url.url")
    if url.startswith("file://"):
        path = unquote(urlparse(url).path)
        return check_path(path, f"{field}.direct_url.url") if exists(path) else None
    return url


def build_label(version: str | None) -> str | None:
    """The build variant a version's local label names, as PyTorch's indexes are named:
    ``2.11.0+cu128`` -> ``cu128``, ``+cpu``, ``+rocm6.2``; None for any other label."""
    if not version or "+" not in version:
        return None
    label = version.split("+", 1)[1]
    return label if re.fullmatch(r"(cu[0-9]+|cpu|rocm[0-9]+(\.[0-9]+)*)", label) else None


def pytorch_index(label: str) -> str:
    """The PyTorch wheel index of a build variant: ``cu128`` -> ``.../whl/cu128``."""
    return f"https://download.pytorch.org/whl/{label}"


def index_url_for(version: str | None) -> str | None:
    """The PyTorch wheel index for a local label: ``2.11.0+cu128`` -> ``.../whl/cu128``."""
    label = build_label(version)
    return pytorch_index(label) if label else None


def check_requirement(text: str, field: str) -> str:
    """A PEP 508 requirement (``torch>=2.5``, ``name @ https://...``), as given."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(text)
    except InvalidRequirement:
        raise UnsafeValue(field, text, "a valid requirement") from None
    check_name(req.name, field)
    if req.url:
        check_url(req.url, field)
    return check_argument(text.strip(), field)


# ------------------------------------------------------------------------- commands

def _tail(words: Iterable[str], field: str) -> list[str]:
    return ["--", *(check_argument(w, field) for w in words)]


def uv_pip_install(requirements: Sequence[str], *, uv: str = "uv", python: str | None = None,
                   reinstall: bool = False, no_deps: bool = False,
                   index_url: str | None = None, options: Sequence[str] = (),
                   field: str = "requirement") -> list[str]:
    """``uv pip install [--python PY] [flags] -- REQUIREMENT...``."""
    argv = [uv, "pip", "install", *(["--python", python] if python else [])]
    argv += (["--reinstall"] if reinstall else []) + (["--no-deps"] if no_deps else [])
    if index_url:
        argv += ["--index-url", check_url(index_url, "index URL", ("https", "http"))]
    return argv + list(options) + _tail(requirements, field)


def reinstall_command(dist: Distribution, *, uv: str = "uv", python: str | None = None,
                      exists: Callable[[str], bool] = os.path.isfile,
                      options: Sequence[str] = ()) -> list[str] | None:
    """``uv pip install --reinstall --no-deps`` of exactly the build installed now: from the
    wheel file or URL it came from, else ``name==version`` (from the PyTorch index for a
    ``+cu128`` label); None when nothing exact is there (a folder, a VCS checkout, a wheel
    file that is gone). What ``doctor --fix`` runs and its remedy prints. ``options``: the
    index options the user gave (``--find-links``, ``--index-url``, ``--offline``, as uv
    takes them): then envguard adds no index of its own."""
    field = f"packages.{field_key(dist.name)}"
    source = reinstall_source(dist.direct_url, dist.name, dist.version or "", field, exists)
    if source is None:
        return None
    index = index_url_for(dist.version) if dist.direct_url is None and not options else None
    return uv_pip_install([source], uv=uv, python=python, reinstall=True, no_deps=True,
                          index_url=index, options=options, field=field)


def uv_cache_clean(names: Sequence[str], *, uv: str = "uv",
                   field: str = "packages") -> list[str]:
    """``uv cache clean -- NAME...``: drop those packages' unpacked wheels from uv's cache,
    the copy a hard-linked install shares with every venv linked from it."""
    checked = [check_name(n, f"{field}.{field_key(n)}.name") for n in names]
    return [uv, "cache", "clean", "--", *checked]


def uv_pip_uninstall(names: Sequence[str], *, uv: str = "uv", python: str | None = None,
                     options: Sequence[str] = (), field: str = "packages") -> list[str]:
    """``uv pip uninstall [--python PY] -- NAME...``, each name checked."""
    checked = [check_name(n, f"{field}.{field_key(n)}.name") for n in names]
    return [uv, "pip", "uninstall", *(["--python", python] if python else []), *options,
            "--", *checked]


def uv_pip_sync(requirements_file: str, *, uv: str = "uv", python: str | None = None,
                options: Sequence[str] = ()) -> list[str]:
    """``uv pip sync [--python PY] OPTIONS -- FILE`` (the file is envguard's own)."""
    return [uv, "pip", "sync", *(["--python", python] if python else []), *options, "--",
            requirements_file]


def uv_venv(python: str, path: str, *, uv: str = "uv", options: Sequence[str] = (),
            field: str = "interpreter.version", user_path: bool = False) -> list[str]:
    """``uv venv --python SPEC OPTIONS -- PATH``. ``python`` is an ``X.Y[.Z]`` spec, or an
    absolute interpreter path when ``user_path`` (one the user named, or the probed
    interpreter of the environment the user selected: never one read from a document)."""
    spec = check_path(python, field) if user_path else check_python_spec(python, field)
    return [uv, "venv", "--python", spec, *options, "--", check_operand(path, "venv path")]


def git_command(verb: str, commit: str | None, paths: Sequence[str] = (), *,
                field: str = "git.commit") -> list[str]:
    """``git VERB [COMMIT] -- PATH...`` (``diff``, ``checkout``); the commit must be a hex
    object name, the paths come after ``--``."""
    if commit is not None and not re.fullmatch(r"[0-9a-fA-F]{4,64}", commit):
        raise UnsafeValue(field, commit, "a git commit id")
    return ["git", verb, *([commit] if commit else []), "--",
            *(check_operand(p, "files") for p in paths)]


def check_operand(word: str, field: str) -> str:
    """A path that goes after ``--`` (where a leading ``-`` is harmless): no control
    characters, not empty."""
    if not word or len(word) > MAX_WORD or _CONTROL.search(word):
        raise UnsafeValue(field, word, "a usable path")
    return word


def envguard_command(verb: str, operand: str) -> list[str]:
    """``envguard VERB OPERAND`` (``--`` first where the operand starts with ``-``)."""
    return ["envguard", verb, *(["--"] if operand.startswith("-") else []),
            check_operand(operand, verb)]


def conda_command(verb: str, specs: Sequence[str], *, tool: str = "conda",
                  options: Sequence[str] = (), field: str = "conda") -> list[str]:
    """``conda install|remove OPTIONS -- SPEC...``, each spec checked."""
    checked = [check_conda_spec(s, f"{field}.{field_key(s.split('=')[0])}") for s in specs]
    return [tool, verb, *options, "--", *checked]


def conda_create(tool: str, prefix: str, explicit_file: str) -> list[str]:
    """``TOOL create --yes --prefix PREFIX --file FILE`` (micromamba, mamba, conda alike)."""
    return [tool, "create", "--yes", "--prefix", check_path(prefix, "prefix"), "--file",
            check_path(explicit_file, "explicit spec file")]


# ------------------------------------------------------------------------- printed forms

def shell_word(text: str) -> str:
    """``text`` as one word of a remedy's shell command, safe to paste whatever a snapshot
    holds: a plain requirement in double quotes (``"torch==2.11.0+cu128"``), anything
    else (``$``, quotes, ``;``, spaces) single-quoted by :func:`shlex.quote`."""
    return f'"{text}"' if _PLAIN_REQUIREMENT.fullmatch(text) else shlex.quote(text)


def shell_words(texts: Iterable[str]) -> str:
    """Names as shell words: ``sglang vllm`` stays as it is, an odd name is quoted."""
    return " ".join(shlex.quote(t) for t in texts)


def shell_line(argv: Sequence[str]) -> str:
    """A command as a person pastes it: each word quoted where the shell needs it (a plain
    requirement keeps its usual ``"torch==2.11.0"`` form)."""
    return " ".join(f'"{w}"' if _PLAIN_REQUIREMENT.fullmatch(w) and re.search("[=<>~]", w)
                    else shlex.quote(w) for w in argv)


def chain(*builds: Callable[[], Sequence[str]], suffix: str = "") -> str:
    """Commands that run one after the other (``A && B``) as one remedy line, each built and
    quoted as :func:`remedy` does; a refused value gives ``(no command: ...)``."""
    try:
        lines = [shell_line(build()) for build in builds]
    except UnsafeValue as exc:
        return f"(no command: {exc})"
    return " && ".join(lines) + suffix


def remedy(build: Callable[[], Sequence[str]], prefix: str = "", suffix: str = "") -> str:
    """``prefix`` + the built command as a shell line + ``suffix``; a value the builder
    refuses gives a remedy that says so instead of a command."""
    try:
        line = shell_line(build())
    except UnsafeValue as exc:
        return f"{prefix}(no command: {exc})"
    return f"{prefix}{line}{suffix}"
