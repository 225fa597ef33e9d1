"""dflash-eval: real speculative decoding from an exported drafter folder, an untrained
drafter of its config, or the n-gram baseline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash.checkpoint.layout import published_config
from dflash.cli.evaluate import main
from dflash.decoding.spread import pooled_tau, tau_interval
from dflash.errors import ConfigError
from dflash.presets import tiny_drafter

REPO = Path(__file__).resolve().parents[2]


def _error_line(err: str) -> str:
    """The one line that says what is wrong; every line before it is progress."""
    *progress, error = err.strip().splitlines()
    assert all(line.endswith(" s]") for line in progress), err
    assert not error.endswith(" s]") and "Traceback" not in err, err
    return error


def test_eval_reports_tau_and_losslessness(trained_tiny, capsys):
    argv = ["--drafter", str(trained_tiny.result.export), "--target", "tiny",
            "--synthetic", "4", "--prompt-length", "12", "--max-new-tokens", "48",
            "--device", "cpu", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lossless"] and report["prompts"] == 4 and report["tokens"] == 4 * 48
    assert report["tau"] > 1.1  # untrained: 1.0; the trained drafter gets drafts accepted
    assert sum(report["acceptance_histogram"]) > 0
    lo, hi = report["tau_interval"]
    assert lo <= report["tau"] <= hi and report["tau_interval_level"] == 0.95
    pairs = [(p["accepted"], p["cycles"]) for p in report["per_prompt"]]
    assert pooled_tau(pairs) == pytest.approx(report["tau"])
    assert (lo, hi) == tau_interval(pairs)  # the report's is the function's, seeded
    assert report["drafter"]["cycle_path"] == "eager"  # no captured clock beside it then
    assert report["captured_equal"] is None and report["speedup_captured"] == 0.0

    assert main(argv[:-1]) == 0
    text = capsys.readouterr().out
    assert "lossless: output equals target-only greedy" in text
    assert f"tau over these prompts: {lo:.2f}-{hi:.2f} (95 % bootstrap interval over the 4" in text


def test_eval_refuses_prompts_tokenized_for_another_model(tmp_path: Path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt_ids": [1, 99999]}) + "\n")
    rc = main(["--drafter", "ngram", "--target", "tiny", "--prompts", str(prompts),
               "--device", "cpu"])
    assert rc == 2 and _error_line(capsys.readouterr().err) == (
        f"dflash-eval: {prompts}:1: token id 99999 is outside the target's vocabulary "
        "(512 ids): tokenized for another model?")


def test_decoding_past_the_targets_positions_is_refused(capsys):
    """The tiny target has 40,960 positions: a prompt, the new tokens and the last verify's
    drafts must fit, or one line before any decoding (it decoded for as long as it took)."""
    from dflash.decoding.generate import check_context
    from dflash.target import load_target

    argv = ["--drafter", "ngram", "--target", "tiny", "--synthetic", "2", "--device", "cpu",
            "--prompt-length", "16"]
    assert main([*argv, "--max-new-tokens", "99999999999"]) == 2
    assert _error_line(capsys.readouterr().err) == (
        "dflash-eval: --max-new-tokens 99999999999: the longest prompt (16 tokens) and "
        "99999999999 new tokens and 15 drafts pass the target's 40960 positions")
    target = load_target("tiny", seed=0)
    check_context(target, [[1] * 16], 40960 - 16)  # exactly full: fine
    with pytest.raises(ConfigError, match="and 1 drafts pass the target's 40960"):
        check_context(target, [[1] * 16], 40960 - 16, max_draft=1)


def test_eval_refuses_a_drafter_for_another_target(trained_tiny, tmp_path: Path, capsys):
    other = tmp_path / "config.json"
    other.write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8}))
    rc = main(["--drafter", str(trained_tiny.result.export), "--target", str(other),
               "--synthetic", "2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "trained for another target" in _error_line(err)


def test_eval_bad_drafter_folder_is_exit_2(trained_tiny, tmp_path: Path, capsys):
    broken = tmp_path / "drafter"
    shutil.copytree(trained_tiny.result.export, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    rc = main(["--drafter", str(broken), "--target", "tiny", "--synthetic", "2",
               "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "model.safetensors" in _error_line(err)
    (broken / "config.json").write_text("{")
    assert main(["--drafter", str(broken), "--target", "tiny", "--synthetic", "2",
                 "--device", "cpu"]) == 2


def _ngram_argv(*extra: str) -> list[str]:
    return ["--drafter", "ngram", "--target", "tiny", "--synthetic", "3", "--prompt-length",
            "12", "--max-new-tokens", "40", "--device", "cpu", "--json", *extra]


def test_ngram_eval_through_the_cli_is_lossless(capsys):
    assert main(_ngram_argv()) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["lossless"] and report["mismatches"] == []
    assert report["prompts"] == 3 and report["tokens"] == 3 * 40
    assert report["tau"] >= 1.0 and report["max_draft"] == 15
    assert len(report["acceptance_histogram"]) == 16
    assert report["drafter"] == {"kind": "ngram", "source": "ngram", "max_draft": 15,
                                 "n_max": 4, "n_min": 1, "cycle": "auto",
                                 "cycle_path": "eager"}  # auto on a CPU: eager
    assert report["speedup"] > 0 and report["speculative_tokens_per_s"] > 0
    assert len(report["per_prompt"]) == 3
    # Progress on stderr, never in the JSON on stdout.
    for phase in ("loading the target tiny", "warming up", "decoding 3 prompt(s)",
                  "prompt 3/3 (100 %)", "done: tau"):
        assert phase in captured.err, captured.err

    assert main(["--drafter", "ngram:2:2", *_ngram_argv("--max-draft", "3")[2:]]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["lossless"] and len(small["acceptance_histogram"]) == 4
    assert small["drafter"]["n_max"] == small["drafter"]["n_min"] == 2
    assert all(n == 0 for n in small["acceptance_histogram"][4:])


def test_untrained_drafter_of_the_trained_config(trained_tiny, capsys):
    argv = ["--drafter", str(trained_tiny.result.export), "--untrained", "--target", "tiny",
            "--synthetic", "2", "--prompt-length", "12", "--max-new-tokens", "24",
            "--device", "cpu", "--json", "--quiet"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert captured.err == ""  # --quiet
    assert report["lossless"] and report["tau"] < 1.2  # the trained one gets > 1.1
    assert report["drafter"]["untrained"] is True and report["drafter"]["block_size"] == 4
    assert len(report["acceptance_histogram"]) == 4


def test_max_draft_caps_the_dflash_drafts(trained_tiny, capsys):
    argv = ["--drafter", str(trained_tiny.result.export), "--target", "tiny", "--synthetic",
            "2", "--prompt-length", "12", "--max-new-tokens", "32", "--device", "cpu",
            "--json", "--max-draft", "1"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lossless"] and report["acceptance_histogram"][2:] == []
    assert len(report["acceptance_histogram"]) == 2 and report["tau"] <= 2.0


# Runs main(argv) for each case in a fresh interpreter; reports rc, stderr and whether
# torch was imported by then.
PROBE = r"""
import contextlib, io, json, sys
from dflash.cli.evaluate import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    out.append({"rc": rc, "stderr": err.getvalue(), "torch": "torch" in sys.modules})
print(json.dumps(out))
"""


def test_bad_drafter_specs_are_exit_2_before_torch_is_imported(tmp_path: Path):
    config_only = tmp_path / "drafter"
    config_only.mkdir()
    (config_only / "config.json").write_text(json.dumps(published_config(tiny_drafter(),
                                                                         "float32")))
    base = ["--target", "tiny", "--synthetic", "2"]
    cases = [
        (["--drafter", "ngram:x", *base], "bad n-gram drafter 'ngram:x'"),
        (["--drafter", "ngram:2:3", *base], "n_max must be >= n_min"),
        (["--drafter", "ngram:0", *base], "n_min must be >= 1"),
        (["--drafter", "ngram:1:2:3", *base], "expected ngram[:N_MAX[:N_MIN]]"),
        (["--drafter", "ngram", "--untrained", *base], "--untrained needs a drafter folder"),
        (["--drafter", "ngram", "--max-draft", "-1", *base], "--max-draft must be >= 0"),
        (["--drafter", str(config_only), "--untrained", "--max-draft", "4", *base],
         "block size 4 drafts at most 3 tokens"),
        (["--drafter", str(config_only), *base], "model.safetensors"),  # weights needed
        (["--drafter", f"hybrid:{config_only}", *base], "model.safetensors"),
        (["--drafter", f"hybrid:{tmp_path / 'none'}", *base], "none"),
        (["--drafter", "ngram", "--min-match", "0", *base], "--min-match must be >= 1"),
    ]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps([c for c, _ in cases])],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    for (_, expected), result in zip(cases, results, strict=True):
        lines = result["stderr"].strip().splitlines()
        assert result["rc"] == 2 and len(lines) == 1 and expected in lines[0], result
        assert not result["torch"], result


def test_hybrid_through_the_cli_on_the_static_cycle(trained_tiny, tmp_path: Path, capsys):
    """Prompts that repeat a stretch, so prompt lookup drafts some cycles and the drafter
    the others; the static cycle runs uncaptured on the CPU."""
    prompts = tmp_path / "prompts.jsonl"
    rows = [[7, 8, 9, 10, 11, 12, 3, 4, 7, 8, 9, 10, 11, 12, 3, 4, 7, 8, 9], [5, 1, 2, 3] * 5]
    prompts.write_text("".join(json.dumps({"prompt_ids": r}) + "\n" for r in rows))
    argv = ["--drafter", f"hybrid:{trained_tiny.result.export}", "--min-match", "2",
            "--cycle", "static", "--target", "tiny", "--prompts", str(prompts),
            "--max-new-tokens", "32", "--device", "cpu", "--json", "--quiet"]
    reports = {}
    for mode in ("useful", "always"):
        assert main([*argv, "--lookup-branch", mode]) == 0
        reports[mode] = report = json.loads(capsys.readouterr().out)
        assert report["lossless"] and report["drafter"]["kind"] == "hybrid"
        assert report["drafter"]["cycle_path"] == "static" and report["drafter"]["min_match"] == 2
        assert report["drafter"]["lookup_branch"] == mode
        assert 0 < report["lookups"] < report["cycles"]
        assert report["lookups"] <= report["both_verified"] <= report["cycles"]
        assert report["cycle_in_target_forwards"] > 0
        # the static path is also timed against target-only decoding on the same fixed
        # shapes (uncaptured on a CPU), whose tokens are the eager reference's
        assert report["captured_equal"] is True and report["captured_target_seconds"] > 0
        assert report["speedup_captured"] == pytest.approx(
            report["captured_target_seconds"] / report["speculative_seconds"])
        assert report["cycle_in_captured_target_forwards"] > 0
    assert reports["useful"]["acceptance_histogram"] == reports["always"]["acceptance_histogram"]
    assert main([*argv[:-2], "--quiet"]) == 0  # the text report says so in a line
    assert "target-only captured " in capsys.readouterr().out
    assert reports["useful"]["both_verified"] <= reports["always"]["both_verified"]


def test_static_cycle_on_a_transformers_target_is_exit_2(monkeypatch, capsys):
    argv = _ngram_argv("--cycle", "static", "--max-new-tokens", "8")
    assert main(argv) == 0  # dflash's own Qwen3: runs
    capsys.readouterr()
    monkeypatch.setenv("DFLASH_TARGET_BACKEND", "transformers")
    assert main(argv) == 2
    assert "--cycle static: the static cycle runs dflash's own Qwen3 targets only" in (
        _error_line(capsys.readouterr().err))


def test_the_tau_interval_is_the_pooled_tau_over_prompts_redrawn():
    # The twelfth real-target run's DFlash eval: eleven prompts at 8-14 tokens a cycle and
    # one at 1.7 (192 tokens each; docs/BENCHMARKS.md, issue 36).
    taus = [13.64, 13.64, 11.24, 8.3, 12.73, 12.73, 11.24, 10.61, 13.64, 12.73, 10.61, 1.71]
    pairs = [(192, round(192 / t)) for t in taus]
    point = pooled_tau(pairs)
    assert 7.5 < point < 8.2  # the one slow prompt's 112 cycles weigh most
    lo, hi = tau_interval(pairs)
    assert lo < 5.5 and hi > 11.5  # ... so twelve prompts leave τ this uncertain
    assert tau_interval(pairs) == (lo, hi)  # seeded: a report reads the same twice
    alike = [(192, 16)] * 12
    assert tau_interval(alike) == (12.0, 12.0)  # prompts alike: no spread
    assert tau_interval(pairs[:1]) == (pooled_tau(pairs[:1]),) * 2  # one prompt: the point
    assert tau_interval([]) == (0.0, 0.0) and pooled_tau([]) == 0.0
    narrow = tau_interval(pairs * 8)  # eight times the prompts: a narrower interval
    assert lo < narrow[0] <= point <= narrow[1] < hi
