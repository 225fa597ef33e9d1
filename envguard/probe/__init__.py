"""Collect facts about an interpreter's environment, without importing torch.

- :mod:`envguard.probe.options`: :class:`SnapshotOptions`, what a snapshot probes;
- :mod:`envguard.probe.collector`: :func:`collect`, the one entry point, which runs every
  probe once and the slow external commands in parallel;
- one module per section (:mod:`~envguard.probe.interpreter`, ``distributions``,
  ``integrity``, ``torch_identity``, ``caches`` (torch's and triton's compile caches),
  ``files``, ``envvars``, ``system``, ``deep``);
- :mod:`envguard.probe.memo`: envguard's own memo files, which only save time.
"""

from __future__ import annotations

from envguard.probe.collector import collect
from envguard.probe.options import SnapshotOptions

__all__ = ["SnapshotOptions", "collect"]
