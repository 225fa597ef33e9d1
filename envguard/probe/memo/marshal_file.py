"""The old name of :mod:`envguard.probe.fastpath.marshal_file` (see :mod:`envguard.probe.memo`)."""

from envguard.probe.fastpath.marshal_file import MEMO_BYTES

__all__ = ["MEMO_BYTES"]
