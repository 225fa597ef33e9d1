"""Collect facts about an interpreter's environment, without importing torch.

- :mod:`envguard.probe.options`: :class:`SnapshotOptions`, what a snapshot probes;
- :mod:`envguard.probe.collector`: :func:`collect`, the one entry point, which runs every
  probe once and the slow external commands in parallel;
- one module per section (:mod:`~envguard.probe.interpreter`, ``distributions``,
  ``integrity``, ``torch_identity``, ``caches`` (torch's and triton's compile caches),
  ``files``, ``envvars``, ``system``, ``deep``);
- :mod:`envguard.probe.fastpath`: what only makes a snapshot faster (envguard's memo
  files, the RECORD check's stat work started ahead), and the rules that keep it exact.

``collect`` and ``SnapshotOptions`` are loaded on first use, so that a light module here
(:mod:`~envguard.probe.discovery`, :mod:`~envguard.probe.interpreter`) can be imported
without the whole collector: a command finds its environment and starts probing it
(:func:`prefetch`) while the rest is still being imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envguard.probe.collector import collect
    from envguard.probe.options import SnapshotOptions

__all__ = ["SnapshotOptions", "collect", "prefetch"]


def prefetch(python: str | None, prefix: str, verify: str = "size") -> None:
    """Start, in the background, what a snapshot of the environment at ``prefix`` needs first,
    while the command imports the rest of envguard: the probe of its interpreter ``python``
    (None: envguard's own, nothing to start; :func:`~envguard.probe.interpreter.prefetch`)
    and, for ``verify`` ``size``, the RECORD check's ``stat`` work
    (:func:`~envguard.probe.fastpath.statahead.start`). Never raises."""
    if python is not None:
        from envguard.probe.interpreter import prefetch as probe_ahead

        probe_ahead(python)
    if verify == "size":
        from envguard.paths import memo_dir
        from envguard.probe.fastpath import statahead

        statahead.start(prefix, memo_dir())


def __getattr__(name: str) -> Any:
    if name == "collect":
        from envguard.probe.collector import collect

        return collect
    if name == "SnapshotOptions":
        from envguard.probe.options import SnapshotOptions

        return SnapshotOptions
    raise AttributeError(f"module 'envguard.probe' has no attribute {name!r}")
