"""``envguard restore``: the command-line side ("restore, don't fix").

Part of the CLI layer (it prints); planning lives in :mod:`envguard.restore.plan`,
building in :mod:`envguard.restore.build` and verifying in :mod:`envguard.restore.verify`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envguard.cli.options import (
    REF_HELP,
    add_format_option,
    add_index_options,
    index_options,
    recorded_path,
    select_environment,
)
from envguard.cli.output import StderrProgress, note, show
from envguard.cli.program import sigterm_interrupts
from envguard.errors import InputError
from envguard.exitcodes import ExitCode

if TYPE_CHECKING:
    from envguard.model import ProbeIssue, Snapshot
    from envguard.restore.plan import RestorePlan


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "restore", help="rebuild GOOD.json's package set in a new venv with uv, and prove it",
        description="Plan the packages that turn this environment into GOOD.json's, build "
        "exactly that set into a new venv with uv (the current one is left alone), then "
        "snapshot the result and compare its packages with GOOD.json.",
        epilog="exit status: 0 reproduced (or --dry-run), 1 some packages could not be "
        "reproduced, 2 bad input or usage, 4 uv missing or failed (envguard help restore)")
    p.add_argument("good", metavar="GOOD", help="the snapshot of the state that worked: "
                   + REF_HELP.replace(" or @now (a fresh one)", ""))
    where = p.add_mutually_exclusive_group()
    where.add_argument("--into", metavar="PATH",
                       help="the new venv (default: <current venv>.restored-<UTC time>)")
    where.add_argument("--in-place", action="store_true",
                       help="sync the current environment itself instead of a new venv")
    p.add_argument("--dry-run", action="store_true", help="show the plan, build nothing")
    p.add_argument("--python", metavar="PY",
                   help="the current environment: an interpreter or venv folder "
                   "(default: envguard's own)")
    p.add_argument("--requirements-out", metavar="FILE",
                   help="also write GOOD's package set as a pinned requirements.txt")
    p.add_argument("--pylock-out", metavar="FILE",
                   help="also write GOOD's package set as a PEP 751 pylock.toml")
    add_index_options(p, find_links_help="a folder or page of wheels, passed to uv "
                      "(repeatable)")
    p.add_argument("--conda-spec-out", metavar="FILE",
                   help="conda snapshots: the @EXPLICIT spec file (default: "
                   "GOOD's name + .conda-explicit.txt, here)")
    p.add_argument("--environment-yml-out", metavar="FILE",
                   help="conda snapshots: the environment.yml (default: GOOD's name + "
                   ".environment.yml, here)")
    add_format_option(p, help="text (default), json (the envguard.restore/1 document) or markdown")
    p.add_argument("--all", action="store_true", help="also list packages that stay as they are")
    p.set_defaults(handler=cmd_restore)


def _check_target(path: Path) -> None:
    """A new venv goes into a folder that does not exist or is empty."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise InputError(f"{path}: exists and is not a folder; choose another --into")
    if path.is_dir() and any(path.iterdir()):
        raise InputError(f"{path}: exists and is not empty; choose another --into")


def _default_target(plan: RestorePlan) -> Path:
    if not plan.current_is_venv or not plan.current_prefix:
        raise InputError(f"{plan.current_python} is not in a venv, so there is no default "
                         "place for the new one: pass --into PATH")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    prefix = Path(plan.current_prefix)
    return prefix.with_name(f"{prefix.name}.restored-{stamp}")


def _snapshot(python: str | None) -> Snapshot:
    from envguard.probe import collect
    from envguard.probe.options import locations_only

    return collect(locations_only(python))


def _write_outputs(args: argparse.Namespace, plan: RestorePlan, good: Snapshot) -> None:
    from envguard.atomic import write_text_atomic
    from envguard.restore.export import pylock_text, requirements_text

    if args.requirements_out:
        write_text_atomic(args.requirements_out, requirements_text(plan))
        note(f"wrote {args.requirements_out} ({len(plan.requirements)} requirements)")
    if args.pylock_out:
        write_text_atomic(args.pylock_out, pylock_text(plan, good))
        note(f"wrote {args.pylock_out}")


def cmd_restore(args: argparse.Namespace) -> int:
    from envguard.explain.remedies import python_minor
    from envguard.probe.interpreter import is_current_interpreter
    from envguard.restore.build import build_venv, find_uv, sync_in_place
    from envguard.restore.plan import plan_restore
    from envguard.restore.report import RestoreReport
    from envguard.restore.verify import proof_snapshot, verify_restore
    from envguard.snapshot_file import read_snapshot

    good_path, good_name = recorded_path(args.good)
    good = read_snapshot(good_path, follow=good_path == args.good)
    args.good_file, args.good_label = good_path, good_name
    into = Path(args.into).expanduser().absolute() if args.into else None
    if into is not None:
        _check_target(into)
    if good.conda:
        return _restore_conda(args, good, into)
    current = _snapshot(select_environment(args.python).python)
    plan = plan_restore(good, current, good_name=good_name, index=index_options(args))
    report = RestoreReport(plan=plan, in_place=args.in_place)
    # Text shows the plan before uv runs, and the proof after; JSON and Markdown are one
    # document at the end (plan and proof together).
    one_document = args.format != "text"
    if not one_document:
        show(report, args.format, show_all=args.all)
    _write_outputs(args, plan, good)
    if args.dry_run:
        if one_document:
            show(report, args.format, show_all=args.all)
        return ExitCode.OK

    uv = find_uv()
    started = time.perf_counter()
    from envguard.runs.store import now_iso

    started_at = now_iso()

    def echo(line: str) -> None:
        note(f"uv: {line}")

    if args.in_place:
        if is_current_interpreter(plan.current_python):
            raise InputError("--in-place would sync the environment envguard itself runs in; "
                             "pass --python PY for the environment to restore")
        note(f"warning: --in-place: changing {plan.current_python} itself; what GOOD does "
             "not list is uninstalled")
        with sigterm_interrupts(), StderrProgress(note_after=0) as progress:
            sync_in_place(plan, uv=uv, echo=echo, step=progress.step)
        target, new_python = Path(plan.current_prefix), plan.current_python
    else:
        target = into or _default_target(plan)
        _check_target(target)
        # this environment's own interpreter (the user chose it), or GOOD's X.Y (checked)
        same = plan.same_python_minor
        python = (plan.current_python if same
                  else python_minor(plan.good_python, "interpreter.version"))
        with sigterm_interrupts(), StderrProgress(note_after=0) as progress:
            new_python = str(build_venv(plan, target, uv=uv, python=python, echo=echo,
                                        step=progress.step, python_is_path=same))
    note(f"restored into {target} in {time.perf_counter() - started:.1f} s; verifying")
    proof = proof_snapshot(new_python)
    verification = verify_restore(good, proof, good_name=args.good_label, new_name=str(target))
    if args.in_place:
        _record_revision(current, new_python, verification.ok, started_at)
    show(dataclasses.replace(report, target=str(target), verification=verification),
         args.format, show_all=args.all)
    if not args.in_place and args.format == "text":
        _say_how_to_switch(target)
    return ExitCode.OK if verification.ok else ExitCode.DRIFT


def _say_how_to_switch(target: Path) -> None:
    """The new venv is not the one the shell has activated: say how to use it."""
    import shlex

    activate = shlex.join(["source", str(target / "bin" / "activate")])
    note(f"to use it: {activate} (envguard commands take it as --python "
         f"{shlex.quote(str(target))})")


def _record_revision(before: Snapshot, python: str, ok: bool, started_at: str) -> None:
    """``--in-place`` changed the environment: one revision (docs/INSTALL.md)."""
    import sys

    from envguard.install.predict import snapshot_options
    from envguard.probe import collect
    from envguard.revisions.store import record_revision

    after = collect(snapshot_options(python))
    revision = record_revision(before.interpreter.prefix, before, after, kind="restore",
                               argv=["envguard", *sys.argv[1:]], exit_code=0 if ok else 1,
                               started_at=started_at)
    note(f"recorded as revision {revision.number} (envguard revisions)")


def _restore_conda(args: argparse.Namespace, good: Snapshot, into: Path | None) -> int:
    """A conda or pixi snapshot: write the explicit spec and environment.yml, then recreate
    the prefix with micromamba, mamba or conda when one is here (and uv for pip's part)."""
    from envguard.atomic import write_text_atomic
    from envguard.errors import RestoreError
    from envguard.explain.remedies import check_path, remedy, uv_pip_install
    from envguard.probe.discovery import prefix_of
    from envguard.restore.build import find_uv, run_process, run_uv
    from envguard.restore.conda import (
        conda_differences,
        conda_spec,
        create_command,
        find_tools,
        shown_commands,
    )
    from envguard.restore.report import CondaRestoreReport

    if args.in_place:
        raise InputError("--in-place is for venvs; a conda snapshot is restored into a new "
                         "prefix (--into PATH)")
    stem = Path(args.good_file).name.removesuffix(".json")
    if into is None:  # next to GOOD's prefix: a path read from the snapshot, so checked
        good_prefix = Path(check_path(good.interpreter.prefix, "interpreter.prefix")
                           if good.interpreter.prefix else
                           prefix_of(check_path(good.interpreter.executable,
                                                "interpreter.executable")))
    target = into or good_prefix.with_name(
        f"{good_prefix.name}.restored-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
    spec = conda_spec(good, name=target.name)
    explicit = Path(args.conda_spec_out or f"{stem}.conda-explicit.txt").absolute()
    yml = Path(args.environment_yml_out or f"{stem}.environment.yml").absolute()
    write_text_atomic(explicit, spec.explicit)
    write_text_atomic(yml, spec.environment_yml)
    if args.requirements_out and spec.pip_requirements:
        write_text_atomic(args.requirements_out, "".join(f"{x}\n" for x in spec.pip_requirements))
    tools = find_tools()
    new_python = str(target / "bin" / "python")

    def pip_argv(uv: str = "uv", shown: int | None = None) -> list[str]:
        return uv_pip_install(spec.pip_requirements[:shown], uv=uv, python=new_python,
                              options=["--color", "never"] if shown is None else ())

    more = " ..." if len(spec.pip_requirements) > 5 else ""
    report = CondaRestoreReport(
        then=remedy(lambda: pip_argv(shown=5), suffix=more) if spec.pip_requirements else "",
        good_name=args.good_label, packages=len(good.conda),
        pip_requirements=tuple(spec.pip_requirements), explicit=str(explicit),
        environment_yml=str(yml), left_out=tuple(spec.left_out), platform=spec.platform,
        target=str(target), tools=tuple(t for t, _ in tools),
        commands=tuple(shown_commands(str(target), str(explicit), str(yml))))
    if args.dry_run or not tools:
        show(report, args.format)
        if args.dry_run:
            return ExitCode.OK
        raise RestoreError("no micromamba, mamba or conda on PATH (nor MAMBA_EXE/CONDA_EXE): "
                           "the environment was not built; the spec files are written")
    _check_target(target)
    tool, path = tools[0]
    with sigterm_interrupts(), StderrProgress(note_after=0) as progress:
        progress.step(f"creating {target} with {tool}")
        result = run_process(create_command(path, str(target), str(explicit)), timeout=3600,
                             echo=lambda line: note(f"{tool}: {line}"))
        if not result.ok:
            raise RestoreError(f"{tool} create failed with exit status {result.returncode}: "
                               f"{result.lines[-1] if result.lines else 'no output'}")
        if spec.pip_requirements:
            progress.step(f"installing {len(spec.pip_requirements)} pip package(s) with uv")
            done = run_uv(pip_argv(find_uv()), timeout=3600,
                          echo=lambda line: note(f"uv: {line}"))
            if not done.ok:
                raise RestoreError(f"uv pip install failed with exit status {done.returncode}")
    from envguard.probe.conda import read_records

    problems: list[ProbeIssue] = []
    differences = conda_differences(good.conda, [p for p, _ in read_records(target, problems)])
    differences += [f"{p.path}: {p.message}" for p in problems]
    show(dataclasses.replace(report, built=True, tool=tool, differences=tuple(differences)),
         args.format)
    return ExitCode.DRIFT if differences else ExitCode.OK
