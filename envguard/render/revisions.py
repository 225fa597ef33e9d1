"""``envguard revisions``: an environment's recorded changes, like ``conda list
--revisions``: each revision's time, kind, command and package changes. Text, Markdown and
JSON; pure. Commands and names come from records on disk: each goes through
:func:`clean` into ``Text``, never into markup."""

from __future__ import annotations

import shlex

from rich.console import Group, RenderableType
from rich.text import Text

from envguard.render.markdown import md
from envguard.render.sanitize import clean
from envguard.revisions.store import Revision, RevisionList


def _command(rev: Revision) -> str:
    return shlex.join(rev.argv) if rev.argv else rev.kind


def _status(rev: Revision) -> str:
    return "" if rev.exit_code in (0, None) else f" (exit {rev.exit_code})"


def text(report: RevisionList, show_all: bool = False) -> RenderableType:
    head = Text(f"revisions of {clean(report.environment, 200)}", style="bold")
    if not report.revisions:
        return Group(head, Text("none recorded yet (envguard install -- ... records one)",
                                style="dim"))
    lines: list[RenderableType] = [head, Text(
        f"rev 0  {clean(report.revisions[0].started_at, 40)}  (before the first recorded "
        "change)", style="dim")]
    for rev in report.revisions:
        row = Text(f"rev {rev.number}  {clean(rev.ended_at, 40)}  ", style="bold")
        row.append(f"{rev.kind}: {clean(_command(rev), 300)}{_status(rev)}", style="")
        lines.append(row)
        lines += [Text(f"    {clean(c, 200)}") for c in rev.changes]
        if rev.note:
            lines.append(Text(f"    note: {clean(rev.note, 400)}", style="yellow"))
    return Group(*lines)


def markdown(report: RevisionList, show_all: bool = False) -> str:
    out = [f"## revisions of `{md(report.environment)}`", ""]
    if not report.revisions:
        return "\n".join([*out, "None recorded yet.", ""])
    out.append(f"- **rev 0** {md(report.revisions[0].started_at)}: before the first change")
    for rev in report.revisions:
        out.append(f"- **rev {rev.number}** {md(rev.ended_at)} {md(rev.kind)}: "
                   f"`{md(_command(rev))}`{md(_status(rev))}")
        out += [f"  - {md(c)}" for c in rev.changes]
        if rev.note:
            out.append(f"  - note: {md(rev.note)}")
    return "\n".join([*out, ""])


def json(report: RevisionList, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(report.to_dict())
