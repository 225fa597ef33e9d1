"""``dflash-train --report-to wandb|tensorboard|none``: every metrics record also goes to
the library named, rank 0 only; a library that is not installed is one line and exit 2
before anything is loaded.

Neither wandb nor tensorboard is installed in this project's environment, so the runs
that report use stand-ins placed in ``sys.modules`` that record what they were given;
everything else (the training, the CLI, the lazy import) is real. The missing-library
test runs for real, in a fresh interpreter, and is skipped where the library exists.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from dflash.cli.reporting import TENSORBOARD_DIR, scalars
from tests.dflash import launch


def _module(name: str, **attrs: Any) -> types.ModuleType:
    """A stand-in module with a spec, as an installed one has (find_spec reads it)."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _train(out: Path, report_to: str) -> list[dict[str, Any]]:
    """A real tiny training in this process with ``--report-to``; its metrics records."""
    from dflash.cli.train import main

    argv = ["--preset", "tiny", "--unguarded", "--quiet", "--out", str(out), "--steps", "4",
            "--set=log_every=2", *[a for a in launch.SMALL if "log_every" not in a],
            "--report-to", report_to]
    assert main(argv) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_wandb_gets_every_record_with_its_step(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch):
    calls: list[tuple[Any, ...]] = []
    wandb = _module("wandb", init=lambda **kw: calls.append(("init", kw)),
                    log=lambda data, step=None: calls.append(("log", data, step)),
                    finish=lambda: calls.append(("finish",)))
    monkeypatch.setitem(sys.modules, "wandb", wandb)  # stand-in: wandb is not installed
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    records = _train(tmp_path / "run", "wandb")
    assert [c[0] for c in calls] == ["init", "log", "log", "finish"]
    init = calls[0][1]
    assert init["project"] == "dflash" and init["dir"] == str(tmp_path / "run")
    assert init["config"]["steps"] == 4 and init["config"]["log_every"] == 2
    for (_, data, step), record in zip(calls[1:3], records, strict=True):
        assert step == record["step"] and data == scalars(record)
        assert data["loss"] == record["loss"] and data["tau_sim"] == record["tau_sim"]
        assert data["acc/1"] == record["acc"][0] and "step" not in data


class _Writer:
    """Stand-in for torch.utils.tensorboard.SummaryWriter (tensorboard is not installed)."""

    made: ClassVar[list[_Writer]] = []

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.scalars: list[tuple[str, float, int]] = []
        self.flushes = 0
        self.closed = False
        _Writer.made.append(self)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


def test_tensorboard_gets_every_scalar_of_every_record(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    _Writer.made.clear()
    monkeypatch.setitem(sys.modules, "tensorboard", _module("tensorboard"))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard",
                        _module("torch.utils.tensorboard", SummaryWriter=_Writer))
    records = _train(tmp_path / "run", "tensorboard")
    (writer,) = _Writer.made
    assert writer.log_dir == str(tmp_path / "run" / TENSORBOARD_DIR)
    expected = [(k, v, r["step"]) for r in records for k, v in scalars(r).items()]
    assert writer.scalars == expected and len(records) == 2
    assert ("loss", records[-1]["loss"], 4) in writer.scalars
    assert writer.flushes == 2 and writer.closed


def test_none_reports_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    called: list[str] = []
    monkeypatch.setitem(sys.modules, "wandb", _module(
        "wandb", init=lambda **kw: called.append("init")))  # stand-in, must stay unused
    assert len(_train(tmp_path / "run", "none")) == 2
    assert called == [] and not (tmp_path / "run" / TENSORBOARD_DIR).exists()


def test_scalars_flatten_lists_and_drop_the_rest():
    record = {"step": 3, "loss": 2.0, "acc": [0.5, 0.25], "lr": 1e-3, "held_out_tau": 1,
              "note": "x", "flag": True, "peak_mem_gb": None}
    assert scalars(record) == {"loss": 2.0, "acc/1": 0.5, "acc/2": 0.25, "lr": 1e-3,
                               "held_out_tau": 1.0}


PROBE = """
import sys
from dflash.cli.train import main
rc = main(sys.argv[1:])
print(rc, "torch" in sys.modules)
"""


@pytest.mark.parametrize("choice", ["wandb", "tensorboard"])
def test_a_library_not_installed_is_one_line_and_exit_2_before_anything_loads(
        tmp_path: Path, choice: str):
    if importlib.util.find_spec(choice) is not None:
        pytest.skip(f"{choice} is installed here")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", PROBE, "--preset", "tiny", "--out", str(out),
                           "--report-to", choice], cwd=launch.REPO, env=launch.env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.split() == ["2", "False"], proc.stderr  # exit 2, torch not imported
    assert proc.stderr == (f"dflash-train: --report-to {choice}: {choice} is not installed "
                           f"in this environment (pip install {choice}, or --report-to "
                           "none)\n")
    assert not out.exists()
