"""From what an error names to the distributions it points at, and findings put in that
order.

:func:`suspects` maps the modules, paths and distributions of an error
(:func:`envguard.explain.error_forms.read_error`) to installed distributions: a module to
the distribution whose files hold it (``Distribution.top_level``, read from RECORD by the
probe), else by the import names the world uses (:data:`IMPORT_NAMES`:
``yaml`` → ``pyyaml``), else by its own name. :func:`names_suspect` says whether a
finding is about one of them, and :func:`rank_key` is the one order of findings: findings
about a suspect first (the most directly named first), then by severity; a symptom's
other words reorder only findings of equal severity, never lift a warning over a critical
finding.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from envguard.explain.error_forms import ErrorFacts, read_error
from envguard.explain.symptoms import keyed_match
from envguard.findings import Finding
from envguard.model import Snapshot
from envguard.names import normalize_name

__all__ = ["IMPORT_NAMES", "names_suspect", "ordered", "rank_key", "suspects"]

IMPORT_NAMES: dict[str, tuple[str, ...]] = {
    # import name → distributions that provide it, where the two differ (normalized).
    "yaml": ("pyyaml",), "PIL": ("pillow",), "cv2": ("opencv-python", "opencv-python-headless",
    "opencv-contrib-python", "opencv-contrib-python-headless"), "sklearn": ("scikit-learn",),
    "skimage": ("scikit-image",), "google.protobuf": ("protobuf",), "attr": ("attrs",),
    "dateutil": ("python-dateutil",), "bs4": ("beautifulsoup4",), "OpenSSL": ("pyopenssl",),
    "jwt": ("pyjwt",), "pkg_resources": ("setuptools",), "_distutils_hack": ("setuptools",),
    "setuptools": ("setuptools",), "dotenv": ("python-dotenv",), "jose": ("python-jose",),
    "git": ("gitpython",), "Crypto": ("pycryptodome",), "zmq": ("pyzmq",),
    "serial": ("pyserial",), "fitz": ("pymupdf",), "MySQLdb": ("mysqlclient",),
    "psycopg2": ("psycopg2", "psycopg2-binary"), "websocket": ("websocket-client",),
    "google.auth": ("google-auth",), "grpc": ("grpcio",), "faiss": ("faiss-cpu", "faiss-gpu"),
    "flash_attn": ("flash-attn",), "sentencepiece": ("sentencepiece",),
    "typing_extensions": ("typing-extensions",), "importlib_metadata": ("importlib-metadata",),
    "charset_normalizer": ("charset-normalizer",), "huggingface_hub": ("huggingface-hub",),
    "jaxlib": ("jaxlib",), "tensorboard": ("tensorboard",), "magic": ("python-magic",),
    "docx": ("python-docx",), "multipart": ("python-multipart",),
}
"""Import names that are not their distribution's name (normalized): a fallback for
snapshots without ``top_level`` and for a module no installed distribution holds any more."""

_SITE = re.compile(r"[/\\](?:site|dist)-packages[/\\](?P<top>[A-Za-z_][A-Za-z0-9_]*)")


def _owners(module: str, snapshots: Sequence[Snapshot]) -> list[str]:
    """Distributions holding ``module`` (or its nearest parent), in any of ``snapshots``."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        found = [d.name for s in snapshots for d in s.packages if prefix in d.top_level]
        if found:
            return found
    installed = {d.name for s in snapshots for d in s.packages}
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        known = [d for d in IMPORT_NAMES.get(prefix, ()) if d in installed]
        if known:
            return known
        if normalize_name(prefix) in installed:
            return [normalize_name(prefix)]
    return []


def suspects(facts: ErrorFacts, snapshots: Sequence[Snapshot], text: str = ""
             ) -> tuple[str, ...]:
    """Distributions (normalized names) the error points at, most directly named first:
    the dependency of a known break whose reported error ``text`` holds
    (:mod:`envguard.explain.knowledge`), those the error names itself, then the owners of
    its modules, then of its traceback's site-packages folders (nearest frame first).
    Only distributions in ``snapshots``."""
    from envguard.explain.knowledge import reported

    installed = {d.name for s in snapshots for d in s.packages}
    found = reported(text, snapshots) if text else []
    found += [d for d in (normalize_name(x) for x in facts.dists) if d in installed]
    for module in facts.modules:
        found.extend(_owners(module, snapshots))
    for path in facts.paths:
        m = _SITE.search(path)
        if m:
            found.extend(_owners(m.group("top"), snapshots))
    return tuple(dict.fromkeys(found))


def names_suspect(finding: Finding, names: Iterable[str]) -> int | None:
    """The position in ``names`` of the first suspect the finding is about (a change of
    that package, or the name as a word of its title), else None."""
    keys = {c.key for c in finding.changes if c.section in ("packages", "conda")}
    title = finding.title.lower()
    for i, name in enumerate(names):
        if name in keys or re.search(r"(?<![\w-])" + re.escape(name) + r"(?![\w-])", title):
            return i
    return None


def rank_key(finding: Finding, score: int, place: int | None) -> tuple[int, int, int, int, str]:
    """Findings about a suspect first (among them, the one the symptom's words point at
    most, then by ``place``: the suspect's position), then the rest by severity and, within
    one severity, by the symptom's ``score``; then the rule's weight."""
    if place is not None:
        return (0, -score, place, -finding.weight, finding.rule)
    return (1, finding.severity.rank, -score, -finding.weight, finding.rule)


def ordered(findings: Iterable[Finding], symptom: str | None, snapshots: Sequence[Snapshot],
            score: Callable[[Finding, str], int],
            names: tuple[str, ...] | None = None) -> list[Finding]:
    """``findings`` most likely first, the one order of ``diff`` and ``doctor``: without a
    symptom by severity, then weight; with one, findings about a distribution it names
    (:func:`suspects` in ``snapshots``) or about the one variable a keyed row of the symptom
    table names (:func:`keyed_match`) first, the rest by severity, then ``score``."""
    if names is None:  # ``names``: the suspects, where the caller found them already
        names = suspects(read_error(symptom), snapshots, symptom) if symptom else ()

    def rank(f: Finding) -> tuple[int, int, int, int, str]:
        if not symptom:
            return rank_key(f, 0, None)
        place = names_suspect(f, names)
        if place is None and keyed_match(f, symptom):
            place = len(names)
        return rank_key(f, score(f, symptom), place)

    return sorted(findings, key=rank)
