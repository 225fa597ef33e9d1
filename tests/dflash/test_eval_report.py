"""dflash-eval's three report forms (:mod:`dflash.cli.eval_report`): pure functions of a
report, tested on reports built here, and the CLI's ``--format`` on a real decode."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dflash.cli.eval_report import Run, document, render_markdown, render_text
from dflash.cli.evaluate import main
from dflash.decoding.evaluate import EvalReport, Mismatch

RUN = Run(drafter={"kind": "hybrid", "source": "hybrid:runs/a|b`c", "cycle_path": "static"},
          target="tiny", device="cpu", dtype="float32", max_new_tokens=8)


def _report(**changes) -> EvalReport:
    base = dict(prompts=2, tokens=16, tau=2.5, target_seconds=2.0, speculative_seconds=1.0,
                lossless=True, acceptance_histogram=(1, 1, 2), target_tokens=16, drafted=12,
                max_draft=2, tau_interval=(2.0, 3.0), lookups=1, both_verified=3,
                captured_target_seconds=1.5, captured_equal=True)
    return EvalReport(**{**base, **changes})


def _cells(line: str) -> list[str]:
    """A table row's cells, split at the pipes that are not escaped."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_markdown_is_one_table_whose_cells_a_hostile_name_cannot_break():
    text = render_markdown(_report(), RUN)
    heading, blank, *table = text.splitlines()
    assert heading == "### dflash-eval: hybrid on tiny" and blank == ""
    assert all(len(_cells(row)) == 2 for row in table), text
    rows = dict(_cells(row) for row in table[2:])
    assert rows["drafter"] == "hybrid: hybrid:runs/a\\|b\\`c"
    assert rows["τ (tokens per target forward)"].startswith("**2.50**, 2.00-3.00 (95 %")
    assert rows["target-only"].endswith("speedup **2.00×**")
    assert rows["target-only, captured"].startswith("1.50 s, speedup 1.50x over it")
    assert rows["hybrid"] == "prompt lookup's draft kept in 1 of 4 cycles; both verified in 3"
    assert rows["lossless"] == "yes, every prompt"


def test_a_report_that_lost_tokens_says_so_in_every_form():
    lost = _report(lossless=False, mismatches=(Mismatch(1, 5, 7, 9),), lookups=0,
                   both_verified=0, captured_equal=None, captured_target_seconds=0.0)
    rows = dict(_cells(r) for r in render_markdown(lost, RUN).splitlines()[4:])
    assert rows["lossless"] == "**no**: 1 prompt(s) differ, first at prompt 1, token 5"
    assert "hybrid" not in rows and "target-only, captured" not in rows
    assert render_text(lost).endswith("NOT LOSSLESS: 1 prompt(s) differ, first at prompt 1, "
                                      "token 5")
    doc = document(lost, RUN)
    assert doc["lossless"] is False and doc["mismatches"][0]["position"] == 5
    assert doc["drafter"] == dict(RUN.drafter) and doc["max_new_tokens"] == 8


def test_one_prompt_has_no_interval_in_any_form():
    one = _report(prompts=1, tau_interval=(2.5, 2.5))
    assert "one prompt: no interval" in render_text(one)
    assert "one prompt: no interval" in render_markdown(one, RUN)


def test_the_cli_prints_each_form_of_one_decode(trained_tiny, tmp_path: Path, capsys):
    folder = tmp_path / "drafter|v1"  # a real folder name that a table must escape
    shutil.copytree(trained_tiny.result.export, folder)
    argv = ["--drafter", str(folder), "--target", "tiny", "--synthetic", "2",
            "--prompt-length", "12", "--max-new-tokens", "16", "--device", "cpu", "--quiet"]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main([*argv, "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    rows = dict(_cells(r) for r in markdown.splitlines()[4:])
    assert rows["drafter"] == f"dflash: {str(folder).replace('|', chr(92) + '|')}"
    assert rows["τ (tokens per target forward)"].startswith(f"**{doc['tau']:.2f}**")
    assert rows["prompts, tokens"] == "2, 32 (16 new tokens a prompt)"
    assert rows["lossless"] == "yes, every prompt"


def test_json_and_another_format_together_are_one_line_exit_2(capsys):
    rc = main(["--drafter", "ngram", "--target", "tiny", "--synthetic", "2", "--json",
               "--format", "markdown"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["dflash-eval: --json and --format markdown ask for two "
                               "reports: give one"]


@pytest.mark.parametrize("form", ["json", None])
def test_json_the_flag_and_json_the_format_agree(form, capsys):
    from dflash.cli.evaluate import build_parser, report_format

    args = build_parser().parse_args(["--drafter", "ngram", "--target", "tiny", "--json",
                                      *(["--format", form] if form else [])])
    assert report_format(args) == "json"
