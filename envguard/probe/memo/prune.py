"""The old name of :mod:`envguard.probe.fastpath.prune` (see :mod:`envguard.probe.memo`)."""

from envguard.probe.fastpath.prune import prune

__all__ = ["prune"]
