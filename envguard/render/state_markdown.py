"""``--format markdown`` for the reports about state rather than change: ``restore`` (a
venv's plan and proof, a conda prefix's spec and check), ``runs`` and ``cache status``.
For pasting into an issue. Pure functions; every string goes through :func:`md`.
"""

from __future__ import annotations

from collections.abc import Sequence

from envguard.cache.manifest import build_label
from envguard.cache.store import CacheStatus
from envguard.render.diff_markdown import md
from envguard.restore.plan import KEEP
from envguard.restore.report import CondaRestoreReport, RestoreReport
from envguard.runs.store import RunList
from envguard.units import human_bytes


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    return [_row(*header), _row(*("---",) * len(header)), *(_row(*r) for r in rows), ""]


def restore(report: RestoreReport, *, show_all: bool = False) -> str:
    plan = report.plan
    out = [f"## envguard restore: {md(plan.good_name)}", "",
           f"GOOD has Python {md(plan.good_python)}; planned against "
           f"`{md(plan.current_python)}`: {plan.tally()}.", ""]
    rows = [(md(r.action), md(r.name, 80), md(r.current_version or "–", 60),
             md(r.good_version or "–", 60), md(r.reason, 300))
            for r in plan.rows if show_all or r.action != KEEP]
    if rows:
        out += _table(("action", "package", "current", "good", "reason"), rows)
    if plan.index_hints:
        used = "added to the install" if plan.hints_applied else "not used: you chose the indexes"
        out += ["Index hints (" + used + "): " + ", ".join(f"`{md(h)}`" for h in plan.index_hints),
                ""]
    out += [f"- note: {md(n, 600)}" for n in plan.notes] + ([""] if plan.notes else [])
    v = report.verification
    if v is not None:
        verdict = ("the package set is reproduced exactly (versions and builds)" if v.ok else
                   f"{len(v.unreproduced)} package difference(s) could not be reproduced")
        out += [f"### Verified {md(v.good_name)} → {md(v.new_name)}", "", f"**{verdict}**", ""]
        out += [f"- {md(u.problem)}: {md(u.detail, 800)}" for u in v.unreproduced]
        out += [f"- `{md(f.rule)}` {md(f.title, 300)}" for f in v.findings]
        out.append("")
    return "\n".join(out)


def conda_restore(r: CondaRestoreReport) -> str:
    out = [f"## envguard restore: {md(r.good_name)} (conda)", "",
           f"{r.packages} conda package(s), {len(r.pip_requirements)} from pip/uv.", "",
           f"- wrote `{md(r.explicit)}` (@EXPLICIT: exact builds by URL and md5)",
           f"- wrote `{md(r.environment_yml)}`"]
    if r.left_out:
        out.append("- no usable URL recorded, pinned in environment.yml only: "
                   + ", ".join(md(x, 80) for x in r.left_out))
    out.append("")
    if not r.built:
        out += ["Recreate it with one of:", "", "```console"]
        out += [c.replace("```", "'''") for c in r.commands] + ["```", ""]
        if r.then:
            out += ["Then install the pip part:", "", "```console",
                    r.then.replace("```", "'''"), "```", ""]
        return "\n".join(out)
    out.append(f"Built `{md(r.target)}` with {md(r.tool or '?')}: "
               + ("**the conda packages match GOOD** (versions and builds)." if not r.differences
                  else f"**{len(r.differences)} difference(s)**:"))
    out += [""] + [f"- {md(d, 400)}" for d in r.differences]
    return "\n".join(out) + "\n"


def runs(report: RunList) -> str:
    out = ["## envguard runs", ""]
    if not report.runs:
        return "\n".join([*out, "No guarded runs recorded here yet (`envguard run -- CMD`).", ""])
    rows = []
    for n, run in enumerate(report.runs, 1):
        mark = " (last-good)" if run.id == report.last_good else ""
        rows.append((f"`@run:{n}`", md(run.started_at), f"`{md(run.command_line, 200)}`",
                     md(run.exit_status or "–"), md(run.gate), md(run.snapshot_short) + mark))
    out += _table(("#", "started (UTC)", "command", "exit", "gate", "snapshot"), rows)
    good = report.last_good_run
    out += [f"last-good: {md(good.id)} ({md(good.ended_at)})" if good
            else "last-good: none yet (a run that passes the gate and exits 0)", ""]
    return "\n".join(out)


def cache_status(st: CacheStatus) -> str:
    b = st.build
    out = ["## envguard cache status", "",
           f"This environment: {md(build_label(b))}"
           + (f" · triton {md(b.triton_version)}" if b.triton_version else "")
           + f" · compat key `{md((b.compat_key or 'none').removeprefix('sha256:')[:12])}`", ""]
    rows = [(md(c.kind), md(c.state), "–" if c.state == "missing" else f"{c.files:,}",
             "–" if c.state == "missing" else human_bytes(c.total_bytes),
             md(c.filesystem or "?"), f"`{md(c.path, 300)}`") for c in st.caches]
    out += _table(("kind", "state", "files", "size", "fs", "path"), rows)
    if not st.archives:
        return "\n".join([*out, f"No archives in `{md(st.store)}` (`envguard cache save`).", ""])
    archive_rows = [(md(a.name, 130),
                     "unusable" if a.manifest is None else ("yes" if a.matches else "no"),
                     "" if a.manifest is None else f"{a.manifest.files:,}",
                     "" if a.manifest is None else human_bytes(a.manifest.total_bytes))
                    for a in st.archives]
    out += [f"Archives in `{md(st.store)}`:", ""]
    out += _table(("name", "this build", "files", "size"), archive_rows)
    return "\n".join(out)
