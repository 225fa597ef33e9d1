"""``dflash-eval``'s report in its three forms: text (the default), JSON and Markdown.

Each is a pure function of the :class:`~dflash.decoding.evaluate.EvalReport` and of what
was run (:class:`Run`: the drafter as ``--drafter`` named it, the target, the device, the
dtype, the tokens a prompt), so the same figures read alike in all three; the JSON
document is the one ``--json`` printed before ``--format`` existed. Markdown is a table to
paste into a pull request or a benchmark page: user-given names (a drafter's path) are
escaped, so a ``|`` or a backtick in one cannot break the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash.decoding.spread import INTERVAL_LEVEL

if TYPE_CHECKING:
    from dflash.decoding.evaluate import EvalReport

FORMATS = ("text", "json", "markdown")


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """What an evaluation ran: ``drafter`` as the JSON report's ``drafter`` object (kind,
    source, max_draft, cycle, cycle_path and the kind's own fields)."""

    drafter: Mapping[str, Any]
    target: str
    device: str
    dtype: str
    max_new_tokens: int


def document(report: EvalReport, run: Run) -> dict[str, Any]:
    """The JSON report: what ran, then every figure of the report."""
    return {"drafter": dict(run.drafter), "target": run.target, "device": run.device,
            "dtype": run.dtype, "max_new_tokens": run.max_new_tokens, **report.to_dict()}


def _interval(report: EvalReport) -> str:
    """The τ's bootstrap interval over prompts, in words."""
    lo, hi = report.tau_interval
    if report.prompts < 2:
        return "one prompt: no interval (evaluate more prompts to see how τ varies)"
    return (f"{lo:.2f}-{hi:.2f} ({round(100 * INTERVAL_LEVEL)} % bootstrap interval over the "
            f"{report.prompts} prompts; a τ outside it differs by more than the prompts drawn)")


def _histogram(report: EvalReport) -> str:
    return ", ".join(f"{i + 1}:{n}" for i, n in enumerate(report.acceptance_histogram) if n)


def _lossless(report: EvalReport) -> str:
    if report.lossless:
        return "lossless: output equals target-only greedy, token for token"
    first = report.mismatches[0]
    return (f"NOT LOSSLESS: {len(report.mismatches)} prompt(s) differ, first at prompt "
            f"{first.prompt}, token {first.position}")


def _captured(report: EvalReport) -> str:
    line = (f"target-only captured {report.captured_target_seconds:.2f} s, speedup "
            f"{report.speedup_captured:.2f}x over it; a cycle costs "
            f"{report.cycle_cost_captured:.2f} captured target forwards")
    if not report.captured_equal:
        line += " (its tokens differed from the eager reference's: timing only)"
    return line


def render_text(report: EvalReport) -> str:
    d = report.to_dict()
    lines = [
        f"prompts {report.prompts}, tokens {report.tokens}",
        f"tau {report.tau:.2f} tokens per target forward (per cycle: {_histogram(report)})",
        f"tau over these prompts: {_interval(report)}",
        f"target-only {report.target_seconds:.2f} s, speculative "
        f"{report.speculative_seconds:.2f} s, speedup {report.speedup:.2f}x",
        *([_captured(report)] if report.captured_equal is not None else []),
        f"tokens/s: target-only {d['target_tokens_per_s']:.1f}, speculative "
        f"{d['speculative_tokens_per_s']:.1f}; drafts accepted "
        f"{100 * report.draft_acceptance:.1f} % of {report.drafted}; a cycle costs "
        f"{report.cycle_cost:.2f} target forwards"
        + (f"; prompt lookup's draft kept in {report.lookups} of {report.cycles} cycles"
           if report.lookups else "")
        + (f"; both drafts verified in {report.both_verified}" if report.both_verified else ""),
        _lossless(report),
    ]
    return "\n".join(lines)


def _cell(text: object) -> str:
    """A table cell: a user-given name cannot end the cell or open code."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
            .replace("\n", " ").replace("\r", " "))


def render_markdown(report: EvalReport, run: Run) -> str:
    """A heading naming the drafter and target, and one table of the figures."""
    d = report.to_dict()
    drafter = run.drafter
    lo, hi = report.tau_interval
    interval = (f"{lo:.2f}-{hi:.2f} ({round(100 * INTERVAL_LEVEL)} % bootstrap over prompts)"
                if report.prompts >= 2 else "one prompt: no interval")
    rows: list[tuple[str, str]] = [
        ("drafter", f"{_cell(drafter.get('kind', ''))}: {_cell(drafter.get('source', ''))}"),
        ("target", f"{_cell(run.target)} on {_cell(run.device)}, {_cell(run.dtype)}"),
        ("cycle", f"{_cell(drafter.get('cycle_path', ''))} (max draft {report.max_draft})"),
        ("prompts, tokens", f"{report.prompts}, {report.tokens} "
                            f"({run.max_new_tokens} new tokens a prompt)"),
        ("τ (tokens per target forward)", f"**{report.tau:.2f}**, {interval}"),
        ("tokens per cycle", _histogram(report) or "none"),
        ("speculative", f"{report.speculative_seconds:.2f} s, "
                        f"{d['speculative_tokens_per_s']:.1f} tokens/s"),
        ("target-only", f"{report.target_seconds:.2f} s, {d['target_tokens_per_s']:.1f} "
                        f"tokens/s; speedup **{report.speedup:.2f}×**"),
    ]
    if report.captured_equal is not None:
        rows.append(("target-only, captured", _captured(report).removeprefix(
            "target-only captured ")))
    rows += [
        ("drafts accepted", f"{100 * report.draft_acceptance:.1f} % of {report.drafted}"),
        ("a cycle costs", f"{report.cycle_cost:.2f} target forwards"),
    ]
    if report.lookups or report.both_verified:
        rows.append(("hybrid", f"prompt lookup's draft kept in {report.lookups} of "
                               f"{report.cycles} cycles; both verified in "
                               f"{report.both_verified}"))
    rows.append(("lossless", "yes, every prompt" if report.lossless
                 else f"**no**: {_lossless(report).removeprefix('NOT LOSSLESS: ')}"))
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return (f"### dflash-eval: {_cell(drafter.get('kind', ''))} on {_cell(run.target)}\n\n"
            f"| | |\n| --- | --- |\n{table}\n")
