"""What ``envguard bisect`` reports: plain data, and its ``envguard.bisect/1`` JSON form."""

from __future__ import annotations

from dataclasses import asdict

from envguard.bisection.builds import Build
from envguard.bisection.changeset import ENV, Step
from envguard.bisection.trial import Trial
from envguard.frozen import frozen
from envguard.redact import redact_argv, redact_text

SCHEMA = "envguard.bisect/1"
FOUND, INCONCLUSIVE, REFUSED, PLANNED = "found", "inconclusive", "refused", "planned"
VERDICTS = (FOUND, INCONCLUSIVE, REFUSED, PLANNED)


@frozen
class Link:
    """A finding of ``envguard diff GOOD BAD`` that explains a culprit."""

    rule: str
    title: str
    remedy: tuple[str, ...] = ()


@frozen
class Culprit:
    step: Step
    links: tuple[Link, ...] = ()


@frozen
class BisectReport:
    good_name: str
    bad_name: str
    command: tuple[str, ...]
    python: str
    """The interpreter every trial venv was made with."""
    steps: tuple[Step, ...]
    verdict: str
    """``found``: a minimal failing set; ``inconclusive``: a set, not proven minimal or
    found with a flaky command; ``refused``: GOOD fails or BAD passes; ``planned``:
    ``--dry-run``, the changes listed and the exact builds found, nothing built."""
    reason: str = ""
    culprits: tuple[Culprit, ...] = ()
    trials: tuple[Trial, ...] = ()
    builds: tuple[Build, ...] = ()
    """Where the exact build of each same-version rebuild came from."""
    notes: tuple[str, ...] = ()
    runs: int = 1
    jobs: int = 1
    timeout: float | None = None
    seconds: float = 0.0
    workdir: str | None = None
    """The trial venvs' folder, kept with ``--keep``."""

    @property
    def summary(self) -> str:
        """One sentence: ``torch 2.11.0+cu130 rebuilt (…): alone, it makes the command fail``."""
        if self.verdict == REFUSED:
            return self.reason
        if self.verdict == PLANNED:
            rebuilt = sum(1 for s in self.steps if s.kind == "rebuild")
            return (f"{len(self.steps)} change(s) to search; both builds of {rebuilt} "
                    "same-version rebuild(s) found" if rebuilt else
                    f"{len(self.steps)} change(s) to search")
        labels = "; ".join(c.step.label for c in self.culprits)
        if len(self.culprits) == 1:
            return f"{labels}: alone, it makes the command fail"
        return (f"{labels}: together they make the command fail; without any one of them "
                "it passes")

    @property
    def mixed(self) -> tuple[Trial, ...]:
        return tuple(t for t in self.trials if t.mixed)

    def to_dict(self) -> dict[str, object]:
        """The ``envguard.bisect/1`` document (docs/BISECT.md)."""
        def step(s: Step) -> dict[str, object]:
            return {**asdict(s), "label": redact_text(s.label)} if s.kind == ENV else {
                **asdict(s), "label": s.label}

        return {
            "schema": SCHEMA, "good": self.good_name, "bad": self.bad_name,
            "command": redact_argv(list(self.command)), "python": self.python,
            "verdict": self.verdict, "reason": redact_text(self.reason),
            "summary": redact_text(self.summary),
            "changes": [step(s) for s in self.steps],
            "culprits": [{**step(c.step), "rules": [asdict(link) for link in c.links]}
                         for c in self.culprits],
            "trials": [{**asdict(t), "tail": [redact_text(x) for x in t.tail],
                        "reason": redact_text(t.reason), "mixed": t.mixed}
                       for t in self.trials],
            "builds": [asdict(b) for b in self.builds],
            "notes": list(self.notes), "runs": self.runs, "jobs": self.jobs,
            "timeout_s": self.timeout, "seconds": round(self.seconds, 3),
            "workdir": self.workdir,
        }
