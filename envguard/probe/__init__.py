"""Collect facts about an interpreter's environment, without importing torch.

- :mod:`envguard.probe.options`: :class:`SnapshotOptions`, what a snapshot probes;
- :mod:`envguard.probe.collector`: :func:`collect`, the one entry point, which runs every
  probe once and the slow external commands in parallel;
- one module per section (:mod:`~envguard.probe.interpreter`, ``distributions``,
  ``integrity``, ``torch_identity``, ``caches`` (torch's and triton's compile caches),
  ``files``, ``envvars``, ``system``, ``deep``);
- :mod:`envguard.probe.memo`: envguard's own memo files, which only save time.

``collect`` and ``SnapshotOptions`` are loaded on first use, so that a light module here
(:mod:`~envguard.probe.discovery`, :mod:`~envguard.probe.interpreter`) can be imported
without the whole collector: a command finds its environment and starts probing it
(:func:`~envguard.probe.interpreter.prefetch`) while the rest is still being imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envguard.probe.collector import collect
    from envguard.probe.options import SnapshotOptions

__all__ = ["SnapshotOptions", "collect"]


def __getattr__(name: str) -> Any:
    if name == "collect":
        from envguard.probe.collector import collect

        return collect
    if name == "SnapshotOptions":
        from envguard.probe.options import SnapshotOptions

        return SnapshotOptions
    raise AttributeError(f"module 'envguard.probe' has no attribute {name!r}")
