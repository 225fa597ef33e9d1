"""What a doctor rule sees and what it is: :class:`Scene`, :class:`DoctorRule`.

A rule is a pure function of one environment's facts: the snapshot (what
``envguard snapshot`` records), the :class:`~envguard.history.Timeline` read from the
disk, and the CUDA libraries the dynamic loader would find first
(:class:`LibraryCopy`). It returns the same :class:`~envguard.explain.interface.Finding`
s as the diff rules, so the renderers and the symptom table serve both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import field

from envguard.findings import Finding
from envguard.frozen import frozen
from envguard.history import Timeline
from envguard.model import Snapshot


@frozen
class LibraryCopy:
    """A CUDA library file in a folder of ``LD_LIBRARY_PATH``, or named by ``LD_PRELOAD``."""

    variable: str
    """``LD_LIBRARY_PATH`` or ``LD_PRELOAD``."""
    folder: str
    file: str
    """``libcudart.so.12``."""
    library: str
    """``cudart``, ``cublas``, ``cudnn``, ``nccl``."""
    major: int | None
    """The soname's major (``12`` for ``libcudart.so.12``); None when it has none."""


@frozen
class Shadow:
    """A folder searched for imports before site-packages (the working folder, a
    ``PYTHONPATH`` entry) and the modules it provides there."""

    folder: str
    source: str
    """``working folder`` or ``PYTHONPATH``."""
    modules: tuple[str, ...]
    """Top-level names importable from it: ``random`` for ``random.py``, a package folder."""
    site_python: str | None = None
    """For a ``.../pythonX.Y/site-packages`` folder: ``X.Y`` (another environment's)."""


@frozen
class Scene:
    snapshot: Snapshot
    timeline: Timeline
    libraries: tuple[LibraryCopy, ...] = ()
    gpus_present: bool = field(default=False)
    """NVIDIA GPUs were seen (nvidia-smi listed some)."""
    shadows: tuple[Shadow, ...] = ()
    """Folders searched before site-packages, with what they provide."""


Check = Callable[[Scene], Iterable[Finding]]


@frozen
class DoctorRule:
    id: str
    title: str
    check: Check


def ago(scene: Scene, at: float) -> str:
    """``38 min before this check`` / ``3 days before this check``."""
    from envguard.history import ago_text

    seconds = scene.timeline.taken_at - at
    return "just before this check" if seconds < 60 else f"{ago_text(seconds)} before this check"
