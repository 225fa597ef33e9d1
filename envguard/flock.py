"""``flock`` with a deadline: the one waiting loop of envguard's locks (the lockfile's
writer lock in :mod:`envguard.gate.bless`, uv's environment lock in
:mod:`envguard.install.transplant`)."""

from __future__ import annotations

import time

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

CAN_FLOCK = fcntl is not None
"""Whether this platform has ``flock`` (:func:`flock_until`)."""


def flock_until(fd: int, deadline: float) -> bool:
    """Take an exclusive ``flock`` on ``fd``, trying every 50 ms until ``deadline`` (a
    :func:`time.monotonic` time): False when another process still holds it then. Only
    where :data:`CAN_FLOCK`."""
    assert fcntl is not None  # noqa: S101 - the callers check CAN_FLOCK
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
