"""The optional W&B and MLflow integrations.

envguard depends on neither library, and CI does not install them (about 60 packages).
So the default suite checks two things:

- without the library, each helper raises one IntegrationError naming the install
  command;
- with a file-backed stand-in for the library's few calls (Artifact, add_file,
  log_artifact, config.update; log_text, log_params), the right file and facts are logged.

The tests marked ``real_library`` run against the real libraries: W&B in offline mode, and
MLflow with a file store. They are skipped where the library is missing. Run them with
`uv run nox -s integrations`, which installs both.
"""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import envguard
from envguard.errors import IntegrationError
from envguard.integrations import mlflow as eg_mlflow
from envguard.integrations import summary
from envguard.integrations import wandb as eg_wandb


@pytest.fixture(scope="module")
def snap() -> envguard.Snapshot:
    return envguard.snapshot(verify="none")


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_summary_names_the_build_and_the_digest(snap: envguard.Snapshot) -> None:
    facts = summary(snap)
    assert facts["python"] == snap.interpreter.version
    assert facts["packages"] == str(len(snap.packages))
    assert facts["sha256"] == snap.sha256
    assert facts.get("torch") == (snap.torch.version or "not installed")
    assert all(isinstance(v, str) and v for v in facts.values())


@pytest.mark.parametrize(("call", "library"), [
    (lambda s: eg_wandb.log_snapshot(SimpleNamespace(), s), "wandb"),
    (lambda s: eg_mlflow.log_snapshot(s), "mlflow")])
def test_a_missing_library_is_one_line_naming_the_install(
        call: Any, library: str, snap: envguard.Snapshot,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, library, None)  # `import library` raises ImportError
    with pytest.raises(IntegrationError, match=f"pip install {library}") as info:
        call(snap)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------- stand-ins (file-backed)

STAND_IN_WANDB = '''
import json, os, shutil
STORE = os.environ["STAND_IN_STORE"]
run = None
class Artifact:
    def __init__(self, name, type, metadata=None):
        self.name, self.type, self.metadata, self.files = name, type, metadata, {}
    def add_file(self, local_path, name=None):
        # W&B copies the file into its staging area at this call
        dest = os.path.join(STORE, "staged-" + (name or os.path.basename(local_path)))
        shutil.copyfile(local_path, dest)
        self.files[name] = dest
class Config(dict):
    def update(self, values, allow_val_change=False):
        dict.update(self, values)
class Run:
    def __init__(self):
        self.config, self.logged = Config(), []
    def log_artifact(self, artifact):
        self.logged.append(artifact)
'''

STAND_IN_MLFLOW = '''
import json, os
STORE = os.environ["STAND_IN_STORE"]
def log_text(text, artifact_file):
    path = os.path.join(STORE, artifact_file)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
def log_params(params):
    with open(os.path.join(STORE, "params.json"), "w") as fh:
        json.dump(params, fh)
'''


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "wandb.py").write_text(textwrap.dedent(STAND_IN_WANDB))
    (lib / "mlflow.py").write_text(textwrap.dedent(STAND_IN_MLFLOW))
    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.setenv("STAND_IN_STORE", str(store))
    monkeypatch.syspath_prepend(str(lib))
    saved = {name: sys.modules.pop(name, None) for name in ("wandb", "mlflow")}
    yield store
    for name, module in saved.items():  # the real library, if it was imported, comes back
        sys.modules.pop(name, None)
        if module is not None:
            sys.modules[name] = module


def test_wandb_logs_the_file_and_the_summary(stand_ins: Path, snap: envguard.Snapshot) -> None:
    import wandb  # the stand-in

    with pytest.raises(IntegrationError, match=r"wandb\.init"):
        eg_wandb.log_snapshot(None, snap)  # no active run
    run = wandb.Run()
    assert eg_wandb.log_snapshot(run, snap) is snap
    (artifact,) = run.logged
    assert artifact.type == "environment" and artifact.metadata == summary(snap)
    staged = Path(artifact.files["env.json"]).read_bytes()
    assert _sha(staged) == snap.sha256  # byte for byte what `envguard snapshot` writes
    assert envguard.read_snapshot(artifact.files["env.json"]) == snap
    assert run.config["envguard"]["sha256"] == snap.sha256


def test_mlflow_logs_the_file_and_params(stand_ins: Path, snap: envguard.Snapshot) -> None:
    assert eg_mlflow.log_snapshot(snap, artifact_path="env") is snap
    assert _sha((stand_ins / "env" / "env.json").read_bytes()) == snap.sha256
    params = json.loads((stand_ins / "params.json").read_text())
    assert params == {f"envguard.{k}": v for k, v in summary(snap).items()}


# --------------------------------------------------------------- the real libraries

@pytest.mark.real_library
def test_real_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            snap: envguard.Snapshot) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"),
                     ("WANDB_CONFIG_DIR", "config"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(tmp_path / sub))  # the staged copy lands in tmp_path
    run = wandb.init(project="envguard-test", dir=str(tmp_path))
    try:
        eg_wandb.log_snapshot(run, snap)
        assert run.config["envguard"]["sha256"] == snap.sha256
    finally:
        run.finish()
    # the staged copy (W&B names it by content) is the snapshot file, byte for byte, and
    # the offline run's record names it env.json in an artifact of type environment
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(_sha(p.read_bytes()) == snap.sha256 for p in files), files
    (record,) = [p for p in files if p.suffix == ".wandb"]
    assert b"env.json" in record.read_bytes() and b"environment" in record.read_bytes()


@pytest.mark.real_library
def test_real_mlflow_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                snap: envguard.Snapshot) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny has no SQL store
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    with mlflow.start_run() as active:
        eg_mlflow.log_snapshot(snap)
    run = mlflow.get_run(active.info.run_id)
    assert run.data.params["envguard.sha256"] == snap.sha256
    local = mlflow.artifacts.download_artifacts(run_id=active.info.run_id,
                                                artifact_path="envguard/env.json",
                                                dst_path=str(tmp_path / "down"))
    assert envguard.read_snapshot(local) == snap
