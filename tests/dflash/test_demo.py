"""The CPU demo means something: the ``demo`` preset's target (``tiny-stdlib``) is a language
model of this Python's standard library, and a drafter trained on it accepts tokens.

A short version of the README's demo: the target pretrained for 150 steps instead of 600
(``DFLASH_STDLIB_STEPS``, part of its cache key; 120 left its held-out loss at 4.51), the
drafter trained for 80 steps (τ 1.66 against the untrained drafter's 1.01 on this VM; 150
steps cost 10 s more), then real speculative decoding against the untrained drafter. The
full demo's figures (and the n-gram baseline's) are in docs/DFLASH.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash import stdlib_target
from tests.dflash.launch import REPO, env


def _eval(drafter: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """dflash-eval's report, run in this process (no second torch start)."""
    from dflash.cli.evaluate import main

    capsys.readouterr()
    code = main(["--drafter", *drafter, "--target", "tiny-stdlib", "--synthetic", "8",
                 "--prompt-length", "12", "--max-new-tokens", "48", "--json", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    report: dict[str, object] = json.loads(out.out)
    return report


@pytest.mark.slow
def test_demo_target_is_a_code_model_and_its_drafter_beats_the_untrained_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DFLASH_STDLIB_STEPS", "150")
    child_env = {**env(), "DFLASH_CACHE_DIR": str(tmp_path / "cache"),
                 "DFLASH_STDLIB_STEPS": "150"}
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dflash.cli.train", "--preset", "demo", "--unguarded",
         "--quiet", "--out", str(out), "--steps", "80", "--set=eval_every=0",
         "--set=save_every=0"], cwd=REPO, env=child_env, capture_output=True, text=True,
        timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = (p.parent for p in (tmp_path / "cache" / "targets").glob("stdlib-*/corpus.json"))
    corpus = json.loads((folder / "corpus.json").read_text())
    assert corpus["recipe"]["steps"] == 150
    assert corpus["train_files"] and corpus["held_out_files"]
    assert not set(corpus["train_files"]) & set(corpus["held_out_files"])
    assert all(stdlib_target.held_out(f, 20) for f in corpus["held_out_files"])
    # a model of code: far below the 6.2 nats/token of a uniform guess over 512 tokens
    assert corpus["held_out_loss"] < 4.5, corpus["held_out_loss"]
    trained = _eval([str(out / "drafter")], capsys)
    untrained = _eval([str(out / "drafter"), "--untrained"], capsys)
    assert trained["lossless"] and untrained["lossless"]
    assert float(trained["tau"]) > float(untrained["tau"]) + 0.3, (trained, untrained)  # type: ignore[arg-type]
