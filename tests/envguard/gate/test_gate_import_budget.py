"""The gate's import budget: what a passing ``envguard run --lock L -- CMD`` imports before
it starts the child.

Every module the gate imports is paid on every launch, so the envguard modules it loads
are pinned here as a sorted list: a new import shows up as a diff a reviewer must accept
(docs/ARCHITECTURE.md: "a passing gate imports no rule and no renderer"). The envguard
process runs under ``-X importtime`` (a flag, not ``PYTHONPROFILEIMPORTTIME``, so the child
and the interpreter probe, separate processes, do not report their imports); its stderr
names every module it imported. Real uv venv from tiny wheels, real lock, real run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.envguard.test_hostile_state import SRC
from tests.envguard.test_hostile_state import good as good  # the module's fixture: a passing venv
from tests.test_architecture import ROOT, explain_rule_modules
from tests.wheelfactory import Venv

GATE_MODULES = [
    "envguard",
    "envguard.atomic",
    "envguard.bytecode",
    "envguard.changes",
    "envguard.cli",
    "envguard.cli.options",
    "envguard.cli.output",
    "envguard.cli.program",
    "envguard.errors",
    "envguard.exitcodes",
    "envguard.explain",
    "envguard.explain.tables",
    "envguard.findings",
    "envguard.frozen",
    "envguard.gate",
    "envguard.gate.check",
    "envguard.gate.closure",
    "envguard.gate.command",
    "envguard.gate.launch",
    "envguard.gate.lockfile",
    "envguard.gate.lookup",
    "envguard.globs",
    "envguard.input_file",
    "envguard.model",
    "envguard.names",
    "envguard.paths",
    "envguard.probe",
    "envguard.probe._deep_probe",
    "envguard.probe._inprocess",
    "envguard.probe.background",
    "envguard.probe.caches",
    "envguard.probe.collector",
    "envguard.probe.commands",
    "envguard.probe.conda",
    "envguard.probe.deep",
    "envguard.probe.discovery",
    "envguard.probe.distributions",
    "envguard.probe.envvars",
    "envguard.probe.fastpath",
    "envguard.probe.fastpath.facts",
    "envguard.probe.fastpath.gpu",
    "envguard.probe.fastpath.hashes",
    "envguard.probe.fastpath.marshal_file",
    "envguard.probe.fastpath.records",
    "envguard.probe.fastpath.rows",
    "envguard.probe.fastpath.statahead",
    "envguard.probe.files",
    "envguard.probe.integrity",
    "envguard.probe.interpreter",
    "envguard.probe.options",
    "envguard.probe.progress",
    "envguard.probe.recordcheck",
    "envguard.probe.recordfile",
    "envguard.probe.sightings",
    "envguard.probe.stated",
    "envguard.probe.system",
    "envguard.probe.torch_identity",
    "envguard.redact",
    "envguard.redact_forms",
    "envguard.redact_names",
    "envguard.redact_shapes",
    "envguard.render",
    "envguard.render.formats",
    "envguard.render.sanitize",
    "envguard.runs",
    "envguard.runs.store",
    "envguard.toml_write",
    "envguard.validation",
    "envguard.version",
]
"""The envguard modules a passing gate imports (warm memo), sorted."""

NEVER = ("envguard.doctor", "envguard.restore", "envguard.bisection", "envguard.history",
         "envguard.explain.engine", "envguard.explain.queries", "envguard.explain.remedies",
         "rich", "torch", "packaging", "email")
"""Packages a passing gate never imports (a module of theirs, or the package itself):
no rule engine, doctor, restore, bisection or history; not rich (the renderers' library),
not torch; not packaging (the dependency closure is memoised) nor email (metadata is
parsed by hand)."""
RENDER_HELPERS = ("envguard.render", "envguard.render.formats", "envguard.render.sanitize")
"""What the command line takes from ``envguard.render`` on the way to the child: the
``--format`` choices and the cleaning of a line it shows. Any renderer proper is banned."""


def envguard(*args: str | Path, cwd: Path, flags: tuple[str, ...] = ()
             ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ENVGUARD_VERIFIED", "PYTHONPROFILEIMPORTTIME")}
    env.update({"PYTHONPATH": str(SRC), "COLUMNS": "200"})
    return subprocess.run([sys.executable, *flags, "-m", "envguard", *map(str, args)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def imported(stderr: str) -> set[str]:
    """The modules ``-X importtime`` reported (``import time: self | cumulative | name``)."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.add(name)
    return names


@pytest.fixture(scope="module")
def gate_imports(good: Venv, tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    project = tmp_path_factory.mktemp("budget-project")
    (project / "pyproject.toml").write_text('[project]\nname = "demo-project"\nversion = "0"\n')
    locked = envguard("lock", "demo-train", "--python", good.python, cwd=project)
    assert locked.returncode == 0, locked.stderr
    command = ("run", "--lock", "lockfiles/demo-train.toml", "--",
               good.path / "bin" / "demo-train", "0")
    warm = envguard(*command, cwd=project)  # fills the memo files, as any earlier launch
    assert warm.returncode == 0, warm.stderr
    proc = envguard(*command, cwd=project, flags=("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr
    names = imported(proc.stderr)
    assert "envguard.cli" in names, proc.stderr[-2000:]
    return names


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_a_passing_gate_imports_exactly_the_pinned_envguard_modules(
        gate_imports: set[str]) -> None:
    assert sorted(set(GATE_MODULES)) == GATE_MODULES  # pinned sorted, once each
    ours = sorted(n for n in gate_imports if under(n, "envguard"))
    assert ours == GATE_MODULES, "\n".join(ours)


def test_a_passing_gate_imports_no_rule_renderer_or_heavy_module(
        gate_imports: set[str]) -> None:
    rules = explain_rule_modules(ROOT)
    assert "envguard.explain.torch" in rules  # the rule modules are found
    banned = sorted(n for n in gate_imports for p in (*NEVER, *rules) if under(n, p))
    renderers = sorted(n for n in gate_imports
                       if under(n, "envguard.render") and n not in RENDER_HELPERS)
    assert banned == [] and renderers == []


def test_the_importtime_parse_sees_the_child_separately(good: Venv, tmp_path: Path) -> None:
    """The flag reaches the envguard process only: a child that would import torch (here
    the fake one) does so in its own process, absent from the list."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import subprocess, sys; subprocess.run([sys.argv[1], '-c', "
                           "'import torch'], check=True)", good.python],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    names = imported(proc.stderr)
    assert "subprocess" in names and "torch" not in names
