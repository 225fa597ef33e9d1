"""dflash-eval: real speculative decoding from an exported drafter folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dflash.cli.evaluate import main


def test_eval_reports_tau_and_losslessness(trained_tiny, capsys):
    argv = ["--drafter", str(trained_tiny.result.export), "--target", "tiny",
            "--synthetic", "4", "--prompt-length", "12", "--max-new-tokens", "48",
            "--device", "cpu", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lossless"] and report["prompts"] == 4 and report["tokens"] == 4 * 48
    assert report["tau"] > 1.1  # untrained: 1.0; the trained drafter gets drafts accepted
    assert sum(report["acceptance_histogram"]) > 0

    assert main(argv[:-1]) == 0
    assert "lossless: output equals target-only greedy" in capsys.readouterr().out


def test_eval_refuses_a_drafter_for_another_target(trained_tiny, tmp_path: Path, capsys):
    other = tmp_path / "config.json"
    other.write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8}))
    rc = main(["--drafter", str(trained_tiny.result.export), "--target", str(other),
               "--synthetic", "2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "trained for another target" in err
    assert len(err.strip().splitlines()) == 1


def test_eval_bad_drafter_folder_is_exit_2(trained_tiny, tmp_path: Path, capsys):
    broken = tmp_path / "drafter"
    shutil.copytree(trained_tiny.result.export, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    rc = main(["--drafter", str(broken), "--target", "tiny", "--synthetic", "2",
               "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    (broken / "config.json").write_text("{")
    assert main(["--drafter", str(broken), "--target", "tiny", "--synthetic", "2",
                 "--device", "cpu"]) == 2
