"""``envguard runs``: one row per recorded run, newest first, as text, Markdown or JSON.
Pure, no I/O.

Commands and names come from run records anyone may have written: every one goes
through :func:`clean` and into ``Text``, never markup.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from envguard.render.markdown import md, md_table
from envguard.render.sanitize import clean
from envguard.runs.store import RunList

_GATE_STYLE = {"passed": "green", "forced": "bold yellow", "refused": "bold red"}


def text(report: RunList, show_all: bool = False) -> RenderableType:
    if not report.runs:
        return Text("no guarded runs recorded here yet (envguard run -- CMD)")
    # The command gets what is left of the width: the other columns are short and fixed
    # (the last-good run is named below the table, not in a column of its own).
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("#", "started (UTC)", "exit", "gate", "snapshot", "command"):
        table.add_column(column, no_wrap=column != "command", ratio=1 if column == "command"
                         else None)
    number = {}
    for n, run in enumerate(report.runs, 1):
        number[run.id] = n
        table.add_row(
            Text(f"@run:{n}" + ("*" if run.id == report.last_good else "")),
            Text(clean(run.started_at[:19].replace("T", " "))),
            Text(clean(run.exit_status or "-"), style="" if run.exit_code == 0 else "yellow"),
            Text(run.gate, style=_GATE_STYLE.get(run.gate, "")),
            Text(clean(run.snapshot_short)),
            Text(clean(run.command_line, 200), overflow="fold"))
    good = report.last_good_run
    footer = Text(f"* last-good: @run:{number[good.id]}, run {clean(good.id)} (ended "
                  f"{clean(good.ended_at)})" if good
                  else "last-good: none yet (a run that passes the gate and exits 0)",
                  style="dim")
    return Group(table, footer)


def markdown(report: RunList, show_all: bool = False) -> str:
    out = ["## envguard runs", ""]
    if not report.runs:
        return "\n".join([*out, "No guarded runs recorded here yet (`envguard run -- CMD`).", ""])
    rows = []
    for n, run in enumerate(report.runs, 1):
        mark = " (last-good)" if run.id == report.last_good else ""
        rows.append((f"`@run:{n}`", md(run.started_at), f"`{md(run.command_line, 200)}`",
                     md(run.exit_status or "–"), md(run.gate), md(run.snapshot_short) + mark))
    out += md_table(("#", "started (UTC)", "command", "exit", "gate", "snapshot"), rows)
    good = report.last_good_run
    out += [f"last-good: {md(good.id)} ({md(good.ended_at)})" if good
            else "last-good: none yet (a run that passes the gate and exits 0)", ""]
    return "\n".join(out)


def json(report: RunList, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(report.to_dict())
