"""``envguard bisect``: build the environments between GOOD and BAD until one change is left.

1. The steps from GOOD to BAD (:mod:`.changeset`); the exact wheel of each same-version
   rebuild, on both sides (:mod:`.builds`), or a one-line error naming what is missing.
2. GOOD's set must pass and BAD's must fail (:mod:`.trial`); otherwise the search is
   refused, with both trials in the report.
3. ddmin over the steps (:mod:`.search`), each configuration built and run once (answers
   are cached), ``jobs`` at a time.
4. The culprits, linked to the diff rules that explain them (:mod:`envguard.explain`).

Nothing of the user's environment changes: every venv is made in a work folder that is
removed at the end (unless ``keep``), also when interrupted. No printing: progress goes to
``step``.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import field, replace
from pathlib import Path
from typing import TypeVar

from envguard.bisection.builds import Build, locate, uv_cache_dir
from envguard.bisection.changeset import ENV, ChangeSet, short
from envguard.bisection.changeset import Step as ChangeStep
from envguard.bisection.elsewhere import not_in_any_set, shared_by_every_trial
from envguard.bisection.report import (
    FOUND,
    INCONCLUSIVE,
    PLANNED,
    REFUSED,
    BisectReport,
    Culprit,
    Link,
)
from envguard.bisection.search import FAIL, PASS, SKIP, Config, ddmin
from envguard.bisection.trial import (
    Built,
    Trial,
    TrialSettings,
    build,
    describe_failure,
    overall,
    remove,
    run_command,
)
from envguard.errors import InputError, RestoreError
from envguard.explain.remedies import python_minor, user_python
from envguard.frozen import frozen
from envguard.model import Snapshot
from envguard.paths import user_dir
from envguard.restore.build import find_uv, kill_running
from envguard.restore.plan import IndexOptions

T = TypeVar("T")

Step = Callable[[str], None]
FLAKY_MISS = 0.05
"""A search is inconclusive when a run set as long as ``runs`` would miss BAD's failure
more often than this (BAD failed in only some of its runs)."""


@frozen
class BisectOptions:
    command: tuple[str, ...]
    python: str | None = None
    index: IndexOptions = field(default_factory=IndexOptions)
    """Where uv finds the wheels; ``find_links`` are also searched for exact builds."""
    timeout: float | None = None
    runs: int = 1
    jobs: int = 1
    keep: bool = False
    dry_run: bool = False
    """List the changes and find the exact builds; build and run nothing."""
    workdir: Path | None = None
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: str | None = None


def default_python(good: Snapshot, bad: Snapshot) -> str:
    """BAD's ``X.Y`` for uv to find. Never an interpreter path read from a snapshot: a
    document naming a script there would have uv run it (a version that is not ``X.Y...``
    is refused, UnsafeValue, exit 2)."""
    return python_minor(bad.interpreter.version, "interpreter.version")


def exact_builds(changes: ChangeSet, options: BisectOptions, out_dir: Path,
                 step: Step | None = None) -> tuple[ChangeSet, tuple[Build, ...]]:
    """``changes`` with the requirement line of both builds of every rebuild."""
    cache = uv_cache_dir(options.env)
    found: dict[tuple[str, str | None], str] = {}
    builds: list[Build] = []
    missing: list[str] = []
    sides = ((changes.good, "GOOD"), (changes.bad, "BAD"))
    for rebuilt in changes.rebuilds:
        if step:
            step(f"looking for both builds of {rebuilt.id} {rebuilt.good}")
        for snap, side in sides:
            dist = snap.package(rebuilt.id)
            if dist is None:  # pragma: no cover - a rebuild is in both
                continue
            where = locate(dist, find_links=options.index.find_links, uv_cache=cache,
                           out_dir=out_dir)
            if where is None:
                missing.append(f"{rebuilt.id} {dist.version} ({side}'s build "
                               f"{short(dist.fingerprint)})")
            else:
                found[(dist.name, dist.fingerprint)] = where.requirement
                builds.append(where)
    if missing:
        raise InputError(
            "cannot find the exact build of " + ", ".join(missing) + " in --find-links, the "
            "snapshot's direct URL, uv's cache or the environment it was installed in; an "
            "index would serve another build of the same version: pass --find-links FOLDER "
            "holding that wheel")
    return ChangeSet(good=changes.good, bad=changes.bad, steps=changes.steps,
                     notes=changes.notes, exact=found), tuple(builds)


class _Trials:
    """Builds and runs configurations, numbering them and caching each answer."""

    def __init__(self, changes: ChangeSet, settings: TrialSettings, workdir: Path,
                 env: dict[str, str], step: Step | None) -> None:
        self.changes, self.settings, self.workdir, self.env = changes, settings, workdir, env
        self.step = step
        self.trials: list[Trial] = []
        self.answers: dict[Config, Trial] = {}
        self.baseline_check: frozenset[str] = frozenset()
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def run(self, config: Config, endpoint: str | None = None) -> Trial:
        """The trial of ``config``. ``endpoint`` (``GOOD``, ``BAD``): a set uv cannot build
        is uv's failure (RestoreError), and its ``uv pip check`` complaints are no reason to
        skip later trials."""
        if config in self.answers:
            return self.answers[config]
        asked, config = config, self.changes.with_needs(config)  # a step with what it needs
        if config in self.answers:
            with self._lock:
                self.answers[asked] = self.answers[config]
            return self.answers[config]
        with self._lock:
            number = next(self._numbers)
        applied = tuple(self.changes.steps[i].id for i in sorted(config))
        if self.step:
            self.step(f"trial {number}: {endpoint + ' ' if endpoint else ''}"
                      f"{len(applied)} of {len(self.changes.steps)} change(s) applied")
        folder = self.workdir / f"trial-{number:03d}"
        lines, missing = self.changes.requirements(config)
        try:
            built = build(self.settings, folder, lines)
            if endpoint is not None:
                if built.python is None:
                    raise RestoreError(f"building {endpoint}'s set: {built.problem}")
                with self._lock:
                    self.baseline_check |= built.check
            trial = self._judge(number, applied, built, config, missing)
        finally:
            if not self.settings.keep:
                remove(folder)
        with self._lock:
            self.answers[config] = self.answers[asked] = trial
            self.trials.append(trial)
        return trial

    def _judge(self, number: int, applied: tuple[str, ...], built: Built, config: Config,
               missing: list[str]) -> Trial:
        base = Trial(number=number, applied=applied, outcome=SKIP,
                     build_seconds=built.seconds,
                     venv=str(built.folder / "venv") if self.settings.keep else None)
        if built.python is None:
            return replace(base, reason=f"uv could not build this set: {built.problem}")
        new = sorted(built.check - self.baseline_check)
        if new and config and len(config) < len(self.changes.steps):
            return replace(base, reason=f"its dependencies do not fit together: {new[0]}")
        runs, tail, seconds = run_command(self.settings, built.python.parent.parent,
                                          self.changes.environment(config, self.env))
        outcome = overall(runs)
        reason = describe_failure(runs) if outcome == FAIL else (
            "the command exited 125 (cannot test)" if outcome == SKIP else "")
        if missing:
            reason = "; ".join(x for x in (reason, "not pinnable, left out: "
                                           + ", ".join(missing)) if x)
        return replace(base, outcome=outcome, runs=runs, reason=reason, tail=tail,
                       run_seconds=seconds)

    def batch(self, configs: Sequence[Config], jobs: int) -> list[str]:
        todo = [c for c in dict.fromkeys(configs) if c not in self.answers]
        if jobs > 1 and len(todo) > 1:
            together([functools.partial(self.run, c) for c in todo], jobs)
        else:
            for config in todo:
                self.run(config)
        return [self.answers[c].outcome for c in configs]


def _flaky(bad: Trial, runs: int) -> str | None:
    if runs < 2 or not bad.mixed:
        return None
    rate = bad.failed_runs / len(bad.runs)
    miss = (1 - rate) ** runs
    if miss <= FLAKY_MISS:
        return None
    return (f"BAD's set failed in {bad.failed_runs} of {len(bad.runs)} runs: a trial that "
            f"passed {runs} runs may still hold the failure (chance {miss:.0%}); use more "
            "--runs")


def bisect(good: Snapshot, bad: Snapshot, options: BisectOptions, *, good_name: str,
           bad_name: str, step: Step | None = None) -> BisectReport:
    """Search the changes from ``good`` to ``bad`` for the ones that make the command fail."""
    if not options.command and not options.dry_run:
        raise InputError("no command: put it after --, as in envguard bisect GOOD BAD -- CMD")
    changes = ChangeSet.between(good, bad)
    if not changes.steps:
        raise InputError(f"{good_name} and {bad_name} hold the same packages and variables: "
                         "nothing to bisect")
    uv = find_uv()
    started = time.perf_counter()
    parent = options.workdir or user_dir() / "bisect"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
    except OSError as exc:
        raise InputError(f"cannot make a work folder in {parent}: {exc.strerror or exc}; "
                         "choose another --workdir") from None
    try:
        return _search(changes, options, uv, workdir, good_name, bad_name, started, step)
    except BaseException:
        kill_running()
        raise
    finally:
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _search(changes: ChangeSet, options: BisectOptions, uv: str, workdir: Path,
            good_name: str, bad_name: str, started: float, step: Step | None) -> BisectReport:
    changes, builds = exact_builds(changes, options, workdir / "wheels", step)
    python, is_path = (user_python(options.python) if options.python
                       else (default_python(changes.good, changes.bad), False))
    settings = TrialSettings(
        uv=uv, python=python, python_is_path=is_path,
        command=options.command, venv_args=("--offline",) if options.index.offline else (),
        sync_args=tuple(options.index.uv_args()), timeout=options.timeout,
        runs=max(1, options.runs), cwd=options.cwd, keep=options.keep)
    trials = _Trials(changes, settings, workdir, options.env, step)

    def report(verdict: str, culprits: tuple[Culprit, ...] = (), reason: str = ""
               ) -> BisectReport:
        return BisectReport(
            good_name=good_name, bad_name=bad_name, command=options.command,
            python=settings.python, steps=changes.steps, verdict=verdict, reason=reason,
            culprits=culprits, trials=tuple(trials.trials), builds=builds,
            notes=changes.notes, runs=settings.runs, jobs=options.jobs,
            timeout=options.timeout, seconds=time.perf_counter() - started,
            workdir=str(workdir) if options.keep else None)

    if options.dry_run:
        return report(PLANNED)
    everything = frozenset(range(len(changes.steps)))
    good_trial, bad_trial = _endpoints(trials, everything, options.jobs)
    if good_trial.outcome != PASS or any(r.outcome != PASS for r in good_trial.runs):
        why = good_trial.reason or good_trial.outcome
        hints = shared_by_every_trial(changes.bad, Path(settings.cwd or Path.cwd()), options.env)
        return report(REFUSED, reason=f"the command does not pass in {good_name}'s set ({why}): "
                      "bisect needs a GOOD that passes" + _where(hints))
    if bad_trial.outcome != FAIL:
        why = bad_trial.reason or "it passes"
        hints = not_in_any_set(changes.bad, bad_name) + shared_by_every_trial(
            changes.bad, Path(settings.cwd or Path.cwd()), options.env)
        return report(REFUSED, reason=f"the command does not fail in {bad_name}'s set ({why}): "
                      "no package or variable change explains the break" + _where(hints))
    result = ddmin(len(changes.steps), lambda configs: trials.batch(configs, options.jobs),
                   jobs=options.jobs)
    culprits = link(changes, [changes.steps[i] for i in sorted(result.culprits)])
    problems = []
    if result.unproven:
        ids = ", ".join(changes.steps[i].id for i in result.unproven)
        problems.append(f"the set may not be minimal: without {ids} it could not be tested "
                        "(skipped)")
    flaky = _flaky(bad_trial, settings.runs)
    if flaky:
        problems.append(flaky)
    return report(INCONCLUSIVE if problems else FOUND, culprits, "; ".join(problems))


def _where(hints: tuple[str, ...]) -> str:
    """The refusal's tail: where the cause lies instead, when something shows it."""
    return ("; look here instead: " + "; ".join(hints)) if hints else ""


_BUILD_KEYS = {
    "torch": ("version", "git_version", "dist_version", "debug", "hip"),
    "triton": ("triton_version", "triton_fingerprint"),
    "pytorch-triton": ("triton_version", "triton_fingerprint"),
}
"""The fields of the snapshot's torch section that a change of this package explains."""


def link(changes: ChangeSet, steps: Sequence[ChangeStep]) -> tuple[Culprit, ...]:
    """Each culprit with the findings of ``envguard diff GOOD BAD`` about it."""
    from envguard.explain import explain

    findings = explain(changes.good, changes.bad)
    out = []
    for one in steps:
        name = one.id.removeprefix("env:")
        section = "environment" if one.kind == ENV else "packages"
        # torch's and triton's builds are also compared in the snapshot's torch section
        build_keys = _BUILD_KEYS.get(one.id, ())
        links = tuple(
            Link(rule=f.rule, title=f.title, remedy=f.remedy) for f in findings
            if any((c.section == section and c.key == name)
                   or (c.section == "torch" and c.key in build_keys) for c in f.changes))
        out.append(Culprit(step=one, links=links))
    return tuple(out)


def _endpoints(trials: _Trials, everything: Config, jobs: int) -> tuple[Trial, Trial]:
    """GOOD's and BAD's trials (together with ``jobs`` > 1)."""
    good: Config = frozenset()
    if jobs > 1:
        first, second = together([functools.partial(trials.run, good, "GOOD"),
                                  functools.partial(trials.run, everything, "BAD")], 2)
        return first, second
    return trials.run(good, "GOOD"), trials.run(everything, "BAD")


def together(calls: Sequence[Callable[[], T]], jobs: int) -> list[T]:
    """The results of ``calls``, ``jobs`` at a time in threads, in order.

    An interruption (Ctrl-C) here does not wait for the trials running in the other
    threads: their processes, and any they start before they see it, are killed until
    every call has returned; then the interruption goes on."""
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures: list[Future[T]] = [pool.submit(call) for call in calls]
    try:
        return [f.result() for f in futures]
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        while not all(f.done() for f in futures):
            kill_running()
            time.sleep(0.05)
        raise
    finally:
        pool.shutdown(wait=True)
