"""dflash-train's progress: what it is doing before its first step (:class:`StartPhases`,
on stderr), then a rich progress bar with the latest metrics, or one plain line per
logged step when the output is not a terminal (:class:`Display`, on stdout)."""

from __future__ import annotations

import sys
from typing import Any

from dflash.decoding.spread import INTERVAL_LEVEL
from dflash.ticks import Tick
from envguard.render.sanitize import escape_controls

PROG = "dflash-train"


class StartPhases:
    """Each start phase of the trainer (:mod:`dflash.startup`) on stderr: a rich status
    line while it runs and a line with its time when it ends on a terminal; piped, a
    plain line as it begins and one when it ends; with ``quiet``, nothing."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.console: Any = None
        self._status: Any = None
        self._text = ""
        if not quiet and sys.stderr.isatty():
            from rich.console import Console

            self.console = Console(stderr=True, highlight=False)

    def begin(self, phase: str, text: str) -> None:
        if self.quiet:
            return
        self._text = text = escape_controls(text)  # a path in it is shown, never run
        if self.console is not None:
            from rich.text import Text

            self._status = self.console.status(Text(f"{text}\N{HORIZONTAL ELLIPSIS}"))
            self._status.start()
        else:
            sys.stdout.flush()  # what went to stdout before stays before it in one log
            print(f"{PROG}: {text}...", file=sys.stderr, flush=True)

    def end(self, phase: str, text: str, seconds: float) -> None:
        if self.quiet:
            return
        line = f"{PROG}: {escape_controls(text)}: {seconds:.1f} s"
        if self.console is not None:
            if self._status is not None:
                self._status.stop()
                self._status = None
            self.console.print(line, markup=False, soft_wrap=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def tick(self, tick: Tick) -> None:
        """A step of a long start phase (the target's pretraining): on a terminal, its
        count on the phase's status line; piped, nothing (the heartbeat says it)."""
        if self._status is not None:
            from rich.text import Text

            self._status.update(Text(f"{self._text}\N{HORIZONTAL ELLIPSIS} {tick.work} step "
                                     f"{tick.step}/{tick.total}"))

    def close(self) -> None:
        """Stop a status line left running by a phase that raised."""
        if self._status is not None:
            self._status.stop()
            self._status = None


def held_out_line(held: dict[str, Any]) -> str | None:
    """The run's last held-out τ, teacher forced and decoding, with the decoding τ's
    interval over its prompts (:func:`dflash.heldout.report`'s record); None
    before one was measured."""
    if "decode_tau" not in held:
        return None
    lo, hi = held["decode_tau_interval"]
    return (f"held-out τ at step {held['step']}: {held['teacher_forced_tau']:.2f} "
            f"teacher-forced, {held['decode_tau']:.2f} decoding (ratio {held['ratio']:.2f}; "
            f"decoding {lo:.2f}-{hi:.2f} over its {held['decode_prompts']} prompts, "
            f"{round(100 * INTERVAL_LEVEL)} % bootstrap)")


def format_record(r: dict[str, Any], total: int) -> str:
    held = f" held-out τ {r['held_out_tau']:.2f}" if "held_out_tau" in r else ""
    if "held_out_decode_tau" in r:
        held += (f" (decoding {r['held_out_decode_tau']:.2f}, "
                 f"{r['held_out_decode_tau_lo']:.2f}-{r['held_out_decode_tau_hi']:.2f})")
    loss = "nan" if r["loss"] is None else f"{r['loss']:.4f}"
    return (f"step {r['step']:>6}/{total}  loss {loss}  τ_sim {r['tau_sim']:.2f}{held}  "
            f"ctx {r['ctx_tok_s']:,.0f} tok/s  draft {r['draft_tok_s']:,.0f} tok/s  "
            f"MFU {100 * r['mfu']:.1f}%  {r['step_s'] * 1000:.0f} ms/step")


class Display:
    """A rich progress bar with the latest metrics on a terminal; plain lines otherwise."""

    def __init__(self, total: int, start: int, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.total, self.quiet = total, quiet
        self.console = Console(highlight=False)
        self.progress = None
        if not quiet and self.console.is_terminal:
            self.progress = Progress(
                TextColumn("dflash-train"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn(), TextColumn("{task.fields[stats]}", markup=False),
                console=self.console)
            self.task = self.progress.add_task("train", total=total, completed=start,
                                               stats="warming up")

    def __enter__(self) -> Display:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, record: dict[str, Any]) -> None:
        line = format_record(record, self.total)
        if self.progress is not None:
            self.progress.update(self.task, completed=record["step"],
                                 stats=f"loss {record['loss'] or float('nan'):.3f} "
                                       f"τ {record['tau_sim']:.2f} MFU {100 * record['mfu']:.0f}%")
            self.progress.console.print(line, markup=False)
        elif not self.quiet:
            self.console.print(line, markup=False, soft_wrap=True)
