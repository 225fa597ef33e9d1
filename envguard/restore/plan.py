"""``envguard restore``: plan the good snapshot's package set, and write it as requirements.

Pure: a plan is a function of two snapshots (GOOD and the current environment) and the
index options; nothing here runs uv or prints. :mod:`envguard.restore.export` writes a plan as
requirements.txt or pylock.toml, :mod:`envguard.restore.build` builds it into a venv and
:mod:`envguard.restore.verify` checks the result against GOOD.

Actions are relative to the current environment: ``install`` (in GOOD, not installed),
``change`` (another version, another build of the same version, another source),
``remove`` (installed, not in GOOD), ``keep`` (same version and build) and ``skip`` (in
GOOD but it cannot be pinned: an invalid name or version in a hand-edited file, an
editable install whose folder is gone).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from urllib.parse import urlparse

from envguard.explain.remedies import (
    VCS_SCHEMES,
    UnsafeValue,
    check_name,
    check_subdirectory,
    check_url,
    field_key,
    python_minor,
    valid_name,
    valid_version,
)
from envguard.frozen import frozen
from envguard.model import Distribution, Snapshot
from envguard.redact import redact_argv

INSTALL, CHANGE, REMOVE, KEEP, SKIP = "install", "change", "remove", "keep", "skip"
ACTIONS = (INSTALL, CHANGE, REMOVE, KEEP, SKIP)
PLAN_SCHEMA = "envguard.restore/1"
PYTORCH_INDEX = "https://download.pytorch.org/whl/"
SEED_PACKAGES = frozenset({"pip", "setuptools", "wheel"})
"""Kept by ``uv pip sync`` in an existing env even when the requirements omit them."""

_VCS_URL_SCHEMES = ("https", "http", "ssh", "file")
TORCH_LABEL = re.compile(r"^(cu[0-9]+|cpu|rocm[0-9]+(\.[0-9]+)*)$")


@frozen
class IndexOptions:
    """Where uv may look for the wheels (the pip-style options of the command line)."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    offline: bool = False
    """uv's offline mode: no network at all, only its cache and local files."""

    @property
    def user_chose_index(self) -> bool:
        """The user said where the wheels are: envguard adds no index of its own."""
        return (self.no_index or self.index_url is not None or bool(self.extra_index_urls)
                or bool(self.find_links))

    def uv_args(self, hints: Sequence[str] = ()) -> list[str]:
        """Index options for ``uv pip sync``/``install``; ``hints``: PyTorch indexes added as
        extra indexes (with the strategy that lets PyPI serve the rest)."""
        args: list[str] = ["--no-index"] if self.no_index else []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in [*self.extra_index_urls, *hints]:
            args += ["--extra-index-url", url]
        if hints:
            # uv's default (first-index) stops at the PyTorch index for numpy, jinja2 & co
            # even when the pinned version is only on PyPI.
            args += ["--index-strategy", "unsafe-best-match"]
        for folder in self.find_links:
            args += ["--find-links", folder]
        return args + (["--offline"] if self.offline else [])


def link_paths(items: Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """``--find-links`` values as uv gets them: URLs as given, folders made absolute."""
    texts = [os.fspath(item) for item in items]
    return tuple(text if "://" in text else os.path.abspath(text) for text in texts)


@frozen
class PlanRow:
    name: str
    action: str
    current_version: str | None
    good_version: str | None
    reason: str
    requirement: str | None = None
    """The requirements.txt line that reproduces GOOD's package; None for remove/skip."""
    good_fingerprint: str | None = None
    current_fingerprint: str | None = None
    source: str | None = None
    """``index``, ``vcs``, ``archive`` (a file or URL), ``directory`` or ``editable``."""


@frozen
class RestorePlan:
    good_name: str
    good_python: str
    """GOOD's interpreter version (``3.11.7``)."""
    current_python: str
    """The current environment's interpreter (the one compared against)."""
    current_python_version: str
    current_prefix: str
    current_is_venv: bool
    rows: tuple[PlanRow, ...]
    index: IndexOptions
    index_hints: tuple[str, ...]
    """PyTorch indexes implied by local labels (``+cu128``) in GOOD's versions."""
    notes: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        """Rows of each action, every action named (0 where none), in :data:`ACTIONS` order."""
        found = Counter(r.action for r in self.rows)
        return {a: found[a] for a in ACTIONS}

    def tally(self) -> str:
        """``1 install, 2 change, 1 remove``: every action that occurs, and those three
        always."""
        return ", ".join(f"{n} {a}" for a, n in self.counts().items()
                         if n or a in (INSTALL, CHANGE, REMOVE))

    @property
    def hints_applied(self) -> bool:
        """The hints are used unless the user named indexes, --find-links or --no-index."""
        return bool(self.index_hints) and not self.index.user_chose_index

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(r.requirement for r in self.rows if r.requirement)

    @property
    def same_python_minor(self) -> bool:
        return minor(self.good_python) == minor(self.current_python_version)

    def uv_index_args(self) -> list[str]:
        """Index options for ``uv pip sync``, hints included."""
        return self.index.uv_args(self.index_hints if self.hints_applied else ())

    def uv_network_args(self) -> list[str]:
        """``--offline`` when asked for: every uv command of the restore gets it."""
        return ["--offline"] if self.index.offline else []


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def file_url_path(url: str) -> str | None:
    """The local path of a ``file://`` URL, else None."""
    parsed = urlparse(url)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    from urllib.request import url2pathname  # urllib.request costs 25 ms to import

    return url2pathname(parsed.path)  # unquotes once: a literal "%41" in a name stays


def requirement_for(dist: Distribution,
                    exists: Callable[[str], bool] = os.path.exists) -> tuple[str | None, str, str]:
    """(requirements.txt line or None, source kind, note) reproducing ``dist`` exactly.

    ``name==version`` from an index; ``name @ URL`` for a PEP 610 direct URL (VCS:
    ``name @ git+URL@commit``); ``-e PATH`` for an editable install whose folder exists.
    An unusable PEP 610 ``subdirectory`` is refused (:class:`UnsafeValue`, exit 2), never
    dropped; a usable one is kept: ``#subdirectory=`` on a VCS or archive URL, joined to
    the path of a local folder (uv reads no ``#subdirectory=`` on a folder).
    """
    name, version = dist.name, dist.version
    if not valid_name(name):
        return None, "index", "not a valid package name: left out"
    field = f"packages.{field_key(name)}"
    pinned = f"{name}=={version}" if valid_version(version) else None
    direct = dist.direct_url
    if direct is None:
        return pinned, "index", "" if pinned else "no valid version recorded: left out"
    url = direct.url
    sub = (check_subdirectory(direct.subdirectory, f"{field}.direct_url.subdirectory")
           if direct.subdirectory is not None else None)
    try:
        check_url(url, f"{field}.direct_url.url",
                  _VCS_URL_SCHEMES if direct.vcs else ("https", "http", "file"))
    except UnsafeValue:
        return None, "archive", "its recorded URL is not usable: left out"
    fragment = f"#subdirectory={sub}" if sub else ""
    local = file_url_path(url)
    if local is not None and sub and not direct.vcs and not _is_archive(local):
        # a folder: the project is in its subdirectory
        local, url, fragment = os.path.join(local, sub), f"{url.rstrip('/')}/{sub}", ""
    if dist.editable or direct.editable:
        if local is not None and exists(local):
            target = local if not re.search(r"\s", local) else url
            return f"-e {target}{fragment}", "editable", ""
        return None, "editable", f"editable source {url} is gone: left out"
    if direct.vcs:
        if direct.vcs not in VCS_SCHEMES:
            return None, "vcs", "its recorded VCS is not git, hg, svn or bzr: left out"
        if not direct.commit_id or not re.fullmatch(r"[0-9A-Za-z._/-]+", direct.commit_id) \
                or direct.commit_id.startswith("-"):
            return None, "vcs", "VCS install without a commit id: left out"
        prefix = "" if url.startswith(f"{direct.vcs}+") else f"{direct.vcs}+"
        return f"{name} @ {prefix}{url}@{direct.commit_id}{fragment}", "vcs", ""
    kind = "archive"
    if local is not None and not _is_archive(local):
        kind = "directory"
    if local is not None and not exists(local):
        if pinned:
            return pinned, "index", (f"{url} is gone: pinned by version instead, "
                                     "the index may serve another build")
        return None, kind, f"{url} is gone: left out"
    return f"{check_name(name, f'{field}.name')} @ {url}{fragment}", kind, ""


def _is_archive(path: str) -> bool:
    return bool(re.search(r"\.(whl|zip|tar\.gz|tgz|tar\.bz2)$", path))


def index_hints(good: Snapshot) -> tuple[str, ...]:
    """PyTorch wheel indexes for the local labels in GOOD: ``+cu128`` -> ``.../whl/cu128``."""
    found: list[str] = []
    for dist in good.packages:
        if dist.direct_url is not None or not dist.version or "+" not in dist.version:
            continue
        label = dist.version.split("+", 1)[1]
        if TORCH_LABEL.match(label) and PYTORCH_INDEX + label not in found:
            found.append(PYTORCH_INDEX + label)
    return tuple(sorted(found))


def _change_reason(good: Distribution, cur: Distribution) -> str | None:
    if good.version != cur.version:
        return f"version {cur.version} → {good.version}"
    if good.fingerprint and cur.fingerprint and good.fingerprint != cur.fingerprint:
        return (f"same version, another build (fingerprint {_short(cur.fingerprint)} → "
                f"{_short(good.fingerprint)})")
    if (good.direct_url.url if good.direct_url else None) != (
            cur.direct_url.url if cur.direct_url else None):
        return "installed from another source"
    if good.editable != cur.editable:
        return "editable install" if good.editable else "not an editable install"
    return None


def _short(digest: str | None) -> str:
    text = (digest or "none").removeprefix("sha256:")
    return text[:12] + "…" if len(text) > 12 else text


def plan_restore(good: Snapshot, current: Snapshot, *, good_name: str,
                 index: IndexOptions | None = None,
                 exists: Callable[[str], bool] = os.path.exists) -> RestorePlan:
    """The rows that turn ``current``'s package set into ``good``'s, sorted by name.

    GOOD's interpreter version becomes ``uv venv --python X.Y``: anything but a Python
    version there (a path, an option) is refused (UnsafeValue, exit 2)."""
    python_minor(good.interpreter.version, "interpreter.version")
    goods = {d.name: d for d in good.packages}
    curs = {d.name: d for d in current.packages}
    rows: list[PlanRow] = []
    for name in sorted(goods.keys() | curs.keys()):
        g, c = goods.get(name), curs.get(name)
        if g is None and c is not None:
            rows.append(PlanRow(name=name, action=REMOVE, current_version=c.version,
                                good_version=None, reason=f"not in {good_name}",
                                current_fingerprint=c.fingerprint))
            continue
        if g is None:  # pragma: no cover - every name comes from one of the two
            continue
        requirement, source, note = requirement_for(g, exists)
        if c is None:
            action, reason = INSTALL, "not installed"
        else:
            changed = _change_reason(g, c)
            action, reason = (CHANGE, changed) if changed else (KEEP, "same version and build")
        if requirement is None:
            action = SKIP
        rows.append(PlanRow(
            name=name, action=action, current_version=c.version if c else None,
            good_version=g.version, reason="; ".join(x for x in (reason, note) if x),
            requirement=requirement, good_fingerprint=g.fingerprint,
            current_fingerprint=c.fingerprint if c else None, source=source))
    notes: list[str] = []
    if minor(good.interpreter.version) != minor(current.interpreter.version):
        notes.append(f"{good_name} ran Python {good.interpreter.version}, this interpreter is "
                     f"{current.interpreter.version}: the new venv asks uv for Python "
                     f"{minor(good.interpreter.version)}")
    return RestorePlan(
        good_name=good_name, good_python=good.interpreter.version,
        current_python=current.interpreter.executable,
        current_python_version=current.interpreter.version,
        current_prefix=current.interpreter.prefix, current_is_venv=current.interpreter.is_venv,
        rows=tuple(rows), index=index or IndexOptions(), index_hints=index_hints(good),
        notes=tuple(notes))


def plan_to_dict(plan: RestorePlan) -> dict[str, object]:
    """The plan as plain JSON data (part of the ``envguard.restore/1`` document)."""
    return {
        "good": plan.good_name, "good_python": plan.good_python,
        "current_python": plan.current_python,
        "current_python_version": plan.current_python_version,
        "counts": plan.counts(),
        "rows": [asdict(r) for r in plan.rows],
        "index_hints": list(plan.index_hints), "hints_applied": plan.hints_applied,
        "uv_index_args": redact_argv(plan.uv_index_args()),
        "requirements": list(plan.requirements),
        "notes": list(plan.notes),
    }
