"""The console scripts before they load anything (issue 15): bad input is one line and
exit 2 without importing torch, and an install without the trainer's extra says so in one
line instead of a ModuleNotFoundError traceback.

Both run the commands' ``main`` in a fresh interpreter (this one imported torch long ago).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from dflash.checkpoint.layout import published_config
from dflash.presets import tiny_drafter

REPO = Path(__file__).resolve().parents[2]
EXTRA = ("torch", "numpy", "transformers", "safetensors")
HEAVY = (*EXTRA, "rich")

# Runs each (module, argv) through that module's main(argv) in one process; reports the
# exit code, stderr, seconds, and which heavy modules were imported by then.
PROBE = r"""
import contextlib, io, json, sys, time
heavy = json.loads(sys.argv[2])
import dflash.cli.evaluate, dflash.cli.generate, dflash.cli.train
results = [{"imported": sorted(m for m in heavy if m in sys.modules)}]
for module, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err):
        rc = sys.modules[module].main(argv)
    results.append({"argv": argv, "rc": rc, "stderr": err.getvalue(),
                    "seconds": time.perf_counter() - t0,
                    "imported": sorted(m for m in heavy if m in sys.modules)})
print(json.dumps(results))
"""


def _probe(cases: list[tuple[str, list[str]]], *, python: list[str] | None = None,
           env: dict[str, str] | None = None, cwd: Path = REPO) -> list[dict]:
    proc = subprocess.run([*(python or [sys.executable]), "-c", PROBE, json.dumps(cases),
                           json.dumps(HEAVY)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _one_line_exit_2(result: dict, expected: str) -> None:
    lines = result["stderr"].strip().splitlines()
    assert result["rc"] == 2, result
    assert len(lines) == 1 and expected in lines[0], result
    assert "Traceback" not in result["stderr"]
    assert "\x1b" not in result["stderr"]  # a name's terminal escape is shown, never sent


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    """Paths for the bad-input cases: a file where a folder belongs and the other way
    round, a drafter export whose config is fine (its weights are never read), one whose
    config is not JSON, and a run whose ``latest`` names nothing."""
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "a-folder").mkdir()
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(published_config(tiny_drafter(), "float32")))
    (drafter / "model.safetensors").write_bytes(b"")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step-00000099\n")
    done = tmp_path / "done"  # an earlier run: its checkpoint, its metrics, its export
    (done / "checkpoints" / "step-00000004").mkdir(parents=True)
    (done / "checkpoints" / "step-00000004" / "trainer.pt").write_bytes(b"")
    (done / "checkpoints" / "latest").write_text("step-00000004\n")
    (done / "metrics.jsonl").write_text('{"step": 4}\n')
    (done / "drafter").mkdir()
    (done / "drafter" / "config.json").write_text("{}")
    logged = tmp_path / "logged"  # a run killed before its first checkpoint
    logged.mkdir()
    (logged / "metrics.jsonl").write_text('{"step": 1}\n')
    os.mkfifo(tmp_path / "fifo.jsonl")  # a data or prompts file that would block a reader
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    fifo_drafter = tmp_path / "fifo-drafter"
    fifo_drafter.mkdir()
    os.mkfifo(fifo_drafter / "config.json")
    piped = tmp_path / "piped"  # a planted FIFO where ``latest`` belongs
    (piped / "checkpoints").mkdir(parents=True)
    os.mkfifo(piped / "checkpoints" / "latest")
    return {"file": str(tmp_path / "a-file"), "folder": str(tmp_path / "a-folder"),
            "missing": str(tmp_path / "missing.jsonl"), "drafter": str(drafter),
            "broken": str(broken), "run": str(run), "out": str(tmp_path / "out"),
            "done": str(done), "logged": str(logged), "piped": str(piped),
            "fifo": str(tmp_path / "fifo.jsonl"), "loop": str(tmp_path / "loop.jsonl"),
            "fifo_drafter": str(fifo_drafter)}


TRAIN, GENERATE, EVAL = "dflash.cli.train", "dflash.cli.generate", "dflash.cli.evaluate"


def _bad_inputs(p: dict[str, str]) -> list[tuple[str, list[str], str]]:
    """(command, argv, what its one line must say)."""
    train = ["--preset", "tiny", "--quiet", "--out", p["out"]]
    gen = ["--target", "tiny", "--out", p["out"] + ".jsonl"]
    ev = ["--drafter", p["drafter"], "--target", "tiny"]
    return [
        (TRAIN, [*train, "--set", "steps=many"], "cannot read 'many'"),
        (TRAIN, [*train, "--set", "no_such_key=1"], "unknown key 'no_such_key'"),
        (TRAIN, [*train, "--set", "buckets=2"], "buckets must be"),
        (TRAIN, [*train, "--set", "optimizer_kernel=triton"], "optimizer_kernel must be auto|off"),
        (TRAIN, [*train, "--set", "device=gpu"], "device must be auto, cpu, cuda or cuda:N"),
        (TRAIN, [*train, "--set", "device=cpu", "--attention", "flex"], "no backward on CPU"),
        (TRAIN, [*train, "--data", p["missing"]], "No such file or directory"),
        (TRAIN, [*train, "--data", p["folder"]], "a-folder: is a folder, not a file"),
        (TRAIN, [*train, "--target", "nope"], "neither a named shape"),
        (TRAIN, [*train, "--data", p["fifo"]], "fifo.jsonl: is a FIFO, not a regular file"),
        (TRAIN, [*train, "--data", "/dev/zero"], "/dev/zero: is a character device"),
        (TRAIN, [*train, "--data", p["loop"]], "loop.jsonl: is a symlink loop"),
        (TRAIN, [*train, "--data", p["missing"] + "\x1b[2J"],
         "missing.jsonl\\x1b[2J: No such file or directory"),
        (TRAIN, [*train, "--out", p["file"]], "is a file, not a folder"),
        (TRAIN, [*train, "--out", p["file"] + "/run"], "is a file, not a folder"),
        (TRAIN, [*train, "--out", p["run"], "--resume"], "which is not a checkpoint"),
        (TRAIN, [*train, "--out", p["done"]], "holds an earlier run: a checkpoint "
         "(step-00000004), metrics.jsonl, an exported drafter (drafter/); continue it with "
         "--resume, or name a new folder"),
        (TRAIN, [*train, "--out", p["logged"]], "holds an earlier run: metrics.jsonl;"),
        (TRAIN, [*train, "--out", p["piped"]], "(its latest pointer is broken)"),
        (TRAIN, [*train, "--out", p["piped"], "--resume"], "latest: is a FIFO"),
        (TRAIN, [*train, "--target-ranks", "1"], "--target-ranks needs torchrun"),
        (GENERATE, [*gen, "--prompts", p["missing"]], "No such file or directory"),
        (GENERATE, [*gen, "--prompts", p["fifo"]], "fifo.jsonl: is a FIFO"),
        (GENERATE, [*gen, "--synthetic", "0"], "--synthetic must be >= 1"),
        (GENERATE, [*gen, "--synthetic", "2", "--max-new-tokens", "0"], "--max-new-tokens"),
        (GENERATE, [*gen, "--synthetic", "2", "--batch-size", "0"], "--batch-size"),
        (GENERATE, [*gen, "--synthetic", "2", "--temperature", "-1"], "--temperature"),
        (GENERATE, [*gen, "--synthetic", "2", "--temperature", "nan"],
         "--temperature must be a finite number, got nan"),
        (GENERATE, [*gen, "--synthetic", "2", "--device", "cuda0"], "--device must be"),
        (GENERATE, [*gen, "--synthetic", "2", "--target", "nope"], "neither a named shape"),
        (GENERATE, ["--target", "tiny", "--synthetic", "2", "--out", p["folder"]],
         "is a folder, not a file"),
        (EVAL, [*ev, "--prompts", p["missing"]], "No such file or directory"),
        (EVAL, [*ev, "--prompts", "/dev/zero"], "/dev/zero: is a character device"),
        (EVAL, ["--drafter", p["fifo_drafter"], "--target", "tiny", "--synthetic", "2"],
         "config.json: is a FIFO, not a regular file"),
        (EVAL, ["--check-config", "--drafter", p["fifo_drafter"], "--target", "tiny"],
         "config.json: is a FIFO, not a regular file"),
        (EVAL, [*ev, "--synthetic", "2", "--limit", "-1"], "--limit must be >= 0"),
        (EVAL, [*ev, "--synthetic", "2", "--max-new-tokens", "0"], "--max-new-tokens"),
        (EVAL, ["--drafter", p["folder"], "--target", "tiny", "--synthetic", "2"],
         "cannot read"),
        (EVAL, ["--drafter", p["broken"], "--target", "tiny", "--synthetic", "2"],
         "is not JSON"),
    ]


def test_bad_input_is_one_line_exit_2_before_torch_is_imported(inputs: dict[str, str]):
    cases = _bad_inputs(inputs)
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    imported_first, *results = _probe([(m, argv) for m, argv, _ in cases], env=env)
    # Importing the console-script modules imports nothing heavy.
    assert imported_first["imported"] == [], imported_first
    for (_, _, expected), result in zip(cases, results, strict=True):
        _one_line_exit_2(result, expected)
        assert result["imported"] == [], result  # answered without importing torch
        assert result["seconds"] < 5, result
    assert not Path(inputs["out"]).exists() and not Path(inputs["out"] + ".jsonl").exists()


def _site_without(tmp_path: Path, hidden: tuple[str, ...]) -> Path:
    """This environment's site-packages minus ``hidden`` (and their dist-info): what an
    install without the ``dflash`` extra (``uv tool install .``) has."""
    shadow = tmp_path / "site-packages"
    shadow.mkdir()
    sites = {Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    for site in sites:
        for entry in site.iterdir():
            name = entry.name.lower()
            if name.endswith(".pth") or name.startswith(hidden) or (shadow / entry.name).exists():
                continue
            (shadow / entry.name).symlink_to(entry)
    return shadow


@pytest.mark.parametrize("hidden", [EXTRA, ("transformers",)], ids=["no-extra", "no-transformers"])
def test_without_the_extra_each_command_says_what_to_install(tmp_path: Path, hidden):
    # -S: no site-packages and no .pth files; PYTHONPATH gives the checkout and a copy of
    # site-packages without the hidden distributions, as an install without the extra has.
    shadow = _site_without(tmp_path, hidden)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(shadow)])}
    cases = [(TRAIN, ["--out", str(tmp_path / "run")]),
             (GENERATE, ["--target", "tiny", "--synthetic", "2", "--out",
                         str(tmp_path / "d.jsonl")]),
             (EVAL, ["--drafter", str(tmp_path), "--target", "tiny", "--synthetic", "2"])]
    _, *results = _probe(cases, python=[sys.executable, "-S"], env=env, cwd=tmp_path)
    missing = hidden[0]
    for (module, _), result in zip(cases, results, strict=True):
        prog = {TRAIN: "dflash-train", GENERATE: "dflash-generate", EVAL: "dflash-eval"}[module]
        spec = f"{REPO}[dflash]"  # this checkout, as its direct_url.json names it
        assert result["stderr"] == (
            f"{prog}: {missing} is not installed; install the trainer's extra: uv tool "
            f"install --reinstall '{spec}' (a tool) or pip install '{spec}' (this "
            "environment)\n"), result
        assert result["rc"] == 2
    assert not (tmp_path / "run").exists()


def test_one_place_maps_errors_to_exit_codes(capsys):
    from dflash.cli.command import Command
    from dflash.errors import CheckpointError, CompileStateError, RefusedError
    from envguard.errors import OutputError

    def raising(exc: BaseException):
        def body() -> int:
            raise exc
        return body

    cmd = Command("dflash-x")
    cases = [(CheckpointError("bad folder"), 2, "dflash-x: bad folder"),
             (ValueError("bad value"), 2, "dflash-x: bad value"),
             (OutputError("cannot write out"), 2, "dflash-x: cannot write out"),
             (RefusedError("[rule] one\nrefusing to start"), 3,
              "dflash-x: [rule] one\ndflash-x: refusing to start"),
             (RuntimeError("CUDA out of memory\ndetails"), 4,
              "dflash-x: failed: CUDA out of memory"),
             (KeyboardInterrupt(), 130, "dflash-x: interrupted")]
    for exc, code, message in cases:
        assert cmd.run(raising(exc)) == code
        assert capsys.readouterr().err == message + "\n"
    cmd.failing = lambda: "training failed at step 7"  # the run has started
    for exc in (CheckpointError("cannot write x"), CompileStateError("recompiled")):
        assert cmd.run(raising(exc)) == 4
        assert capsys.readouterr().err == f"dflash-x: training failed at step 7: {exc}\n"
    with pytest.raises(TypeError):  # a bug stays a traceback
        cmd.run(raising(TypeError("bug")))


@pytest.mark.parametrize(("direct_url", "expected"), [
    ({"url": "file:///opt/src/envguard", "dir_info": {}}, "/opt/src/envguard"),
    ({"url": "https://user:pw@git.example.com:8443/ml/envguard.git",
      "vcs_info": {"vcs": "git", "commit_id": "abc"}},
     "envguard @ git+https://git.example.com:8443/ml/envguard.git"),
    (None, "/path/to/envguard"),
], ids=["folder", "git-with-userinfo", "unknown"])
def test_the_install_hint_names_where_envguard_came_from(monkeypatch, direct_url, expected):
    # The installed metadata is replaced: these install kinds cannot all exist in one venv.
    import json
    from importlib import metadata

    from dflash.cli.command import install_source

    class _Dist:
        def read_text(self, name: str) -> str | None:
            assert name == "direct_url.json"
            return None if direct_url is None else json.dumps(direct_url)

    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist())
    assert install_source() == expected
