"""A reason or a detail behind a long path keeps its end, which says why: restore's rows,
undo's sources (a kept build's folder is a temporary path plus a 64-digit digest)."""

from __future__ import annotations

from rich.console import Console

from envguard.render import restore as render_restore
from envguard.render import undo as render_undo
from envguard.restore.plan import CHANGE, IndexOptions, PlanRow, RestorePlan
from envguard.revisions.undo import BuildSource, UndoReport

WHY = "is damaged: tool/blob.bin changed since it was kept"
LONG = f"the kept build in /{'deep/' * 80}sha256-{'ab' * 32} {WHY}"


def _plain(renderable: object) -> str:
    console = Console(width=3000, no_color=True, record=True)  # no folds
    console.print(renderable)
    return " ".join(console.export_text().split())


def _plan() -> RestorePlan:
    row = PlanRow(name="tool", action=CHANGE, current_version="2.0", good_version="1.0",
                  reason=LONG)
    return RestorePlan(good_name="revision 0", good_python="3.11.7", current_python="/v/python",
                       current_python_version="3.11.7", current_prefix="/v",
                       current_is_venv=True, rows=(row,), index=IndexOptions(),
                       index_hints=())


def test_a_long_reason_in_restore_keeps_its_end():
    assert len(LONG) > 500
    assert WHY in _plain(render_restore.render_plan(_plan()))


def test_a_long_detail_in_undo_keeps_its_end():
    report = UndoReport(environment="/v", target=0, plan=_plan(), sources=(
        BuildSource(name="tool", version="1.0", source="not found", detail=LONG),))
    shown = _plain(render_undo.text(report))
    assert shown.count(WHY) == 2  # the plan's row and the source's line
