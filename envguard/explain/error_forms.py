"""What an error line names: the modules, attributes, paths and distributions in it.

``--symptom`` text, or the last lines a failed ``envguard run`` printed, is read for the
forms Python and the common libraries write (:data:`FORMS`): ``cannot import name 'X'
from 'M'``, ``No module named 'M'``, ``module 'M' has no attribute 'X'``, a traceback's
``File ".../site-packages/pkg/..."``, ``undefined symbol``, a requirement message
(``tokenizers>=0.14,<0.15 is required ... but found tokenizers==0.15.0``) and the messages
with a known meaning (numpy's ABI messages, protobuf's descriptor message: :data:`KINDS`).
:func:`read_error` returns them as :class:`ErrorFacts`; :mod:`envguard.explain.culprits`
maps the modules to the distributions that own them.

Pure: no snapshot, no file; every pattern compiled on first use.
"""

from __future__ import annotations

import functools
import re

from envguard.frozen import frozen

__all__ = ["FORMS", "KINDS", "ErrorFacts", "read_error"]

_MODULE = r"(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
_NAME = r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
_DIST = r"(?P<dist>[A-Za-z0-9][A-Za-z0-9._-]*)"

FORMS: tuple[tuple[str, str], ...] = (
    # (what it says, pattern): ``module`` is a module the error names, ``name`` an
    # attribute of it, ``path`` a file, ``dist`` a distribution (a requirement message).
    ("import-name", r"cannot import name ['\"]?" + _NAME + r"['\"]? from ['\"]?" + _MODULE
     + r"['\"]?(?: \((?P<path>[^)\s]+)\))?"),
    ("no-module", r"No module named ['\"]?" + _MODULE),
    ("partially-initialized", r"partially initialized module ['\"]" + _MODULE
     + r"['\"](?: \(most likely due to a circular import\))?(?: has no attribute ['\"]"
     + _NAME + r"['\"])?"),
    ("no-attribute", r"module ['\"]" + _MODULE + r"['\"] has no attribute ['\"]?" + _NAME),
    ("removed-attribute", r"`?np\.(?P<name>[A-Za-z_]+)`? was removed in the NumPy 2\.0"),
    ("frame", r"File \"(?P<path>[^\"]+)\", line \d+"),
    ("shared-object", r"(?P<path>/[^\s:'\"]+\.so(?:\.[0-9]+)*)"),
    # ``X>=a,<b is required for a normal functioning of this module, but found X==c``
    ("requirement", _DIST + r"(?:\[[^\]]*\])?\s*(?:[<>=!~]=?[^\s,]+,?)+ is required"),
    ("requirement", r"but found " + _DIST + r"=="),
    # pip's resolver: ``x 1.0 requires y>=2, but you have y 1.5 which is incompatible``
    ("requirement", r"but you have " + _DIST + r" [0-9]"),
    ("requirement", r"(?:^|\s)" + _DIST + r" [0-9][^\s]* (?:requires|has requirement) "),
    # pkg_resources: ``The 'x>=2' distribution was not found``, ``VersionConflict: (x 1.0 ..``
    ("requirement", r"The ['\"]" + _DIST + r"(?:[<>=!~][^'\"]*)?['\"] distribution was not"),
    ("requirement", r"VersionConflict: \(" + _DIST + r" [0-9]"),
    # a requirement quoted in prose: ``no longer supported in openai>=1.0.0``
    ("requirement", r"(?<![\w.-])" + _DIST + r"(?:>=|<=|==|~=|<|>)[0-9]"),
    # an exception raised by a module names it: ``pydantic.errors.PydanticImportError``
    ("raised-by", r"(?<![\w.])" + _MODULE + r"\.[A-Z][A-Za-z0-9]*(?:Error|Exception|Warning)\b"),
    # jax: ``jaxlib is version 0.4.1, but this version of jax requires version >= 0.4.7``
    ("requirement", _DIST + r" is version [0-9][^,]*, but this version of"),
    ("requirement", r"requires " + _DIST + r"\s*(?:[<>=!~]=?|version)"),
)
"""Error forms, in no particular order: every match of every form is kept."""

KINDS: tuple[tuple[str, str, str], ...] = (
    # (kind, the distribution it points at, pattern)
    ("numpy-abi", "numpy", r"numpy\.dtype size changed|compiled using NumPy 1\.x cannot be run"
     r"|_ARRAY_API not found|numpy\.core\.multiarray failed to import|module compiled "
     r"against (?:ABI|API) version|numpy\.ndarray size changed|Expected \d+ from C header"),
    ("numpy-removed", "numpy", r"was removed in the NumPy 2\.0|np\.\w+` was a deprecated alias"
     r"|module 'numpy' has no attribute '(?:float|int|bool|object|str|complex|long|unicode"
     r"|NaN|Inf|float_|complex_|string_|unicode_|PINF|NINF|infty|product|cumproduct"
     r"|alltrue|sometrue|round_|asfarray|find_common_type|cast|mat)'"),
    ("protobuf-descriptors", "protobuf", r"Descriptors cannot be created directly"
     r"|generated code is out of date and must be regenerated with protoc"
     r"|cannot import name 'builder' from 'google\.protobuf\.internal'"),
    ("undefined-symbol", "", r"undefined symbol"),
    ("circular-import", "", r"partially initialized module|most likely due to a circular "
     r"import"),
    ("source-tree-import", "", r"from its source directory|you should not try to import "
     r"numpy from"),
)
"""Messages whose meaning is known: (kind, distribution, pattern)."""


@frozen
class ErrorFacts:
    """What one error text names (each tuple in the order the text gives it, once each)."""

    modules: tuple[str, ...] = ()
    """Dotted modules: ``markupsafe``, ``urllib3.util.ssl_``, ``google.protobuf``."""
    names: tuple[str, ...] = ()
    """Attributes and import names: ``soft_unicode``, ``DEFAULT_CIPHERS``."""
    paths: tuple[str, ...] = ()
    """Files: traceback frames, shared objects."""
    dists: tuple[str, ...] = ()
    """Distributions the text names itself (requirement messages, a known message)."""
    kinds: tuple[str, ...] = ()
    """Known messages (:data:`KINDS`): ``numpy-abi``, ``protobuf-descriptors``, ..."""

    @property
    def empty(self) -> bool:
        return not (self.modules or self.names or self.paths or self.dists or self.kinds)


@functools.cache
def _forms() -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((what, re.compile(p)) for what, p in FORMS)


@functools.cache
def _kinds() -> tuple[tuple[str, str, re.Pattern[str]], ...]:
    return tuple((kind, dist, re.compile(p, re.IGNORECASE)) for kind, dist, p in KINDS)


def _once(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(i for i in items if i))


MAX_ERROR = 64 * 1024
"""Only the last 64 KiB of a long error text is read (the error is at its end)."""


def read_error(text: str | None) -> ErrorFacts:
    """The facts in ``text`` (an error line, or a whole traceback)."""
    if not text:
        return ErrorFacts()
    text = text[-MAX_ERROR:]
    modules: list[str] = []
    names: list[str] = []
    paths: list[str] = []
    dists: list[str] = []
    kinds: list[str] = []
    for what, pattern in _forms():
        for m in pattern.finditer(text):
            found = m.groupdict()
            if what == "removed-attribute":
                modules.append("numpy")
            modules.append(found.get("module") or "")
            names.append(found.get("name") or "")
            paths.append(found.get("path") or "")
            dists.append(found.get("dist") or "")
    for kind, dist, pattern in _kinds():
        if pattern.search(text):
            kinds.append(kind)
            dists.append(dist)
    # The last frame of a traceback is nearest the error: listed first.
    frames = _once(paths)
    return ErrorFacts(modules=_once(modules), names=_once(names),
                      paths=tuple(reversed(frames)), dists=_once(dists), kinds=_once(kinds))
