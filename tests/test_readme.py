"""README's two set-up commands are the ones CI runs, and the main job stays light.

CI (`.ci/run`) must call README's test command verbatim, so that a green CI means a
new user's command works; the main-job command must not need the trainer's extra.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - envguard depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _first_command_after(text: str, heading: str) -> str:
    match = re.search(re.escape(heading) + r"\s*```console\n(.+?)\n```", text, re.S)
    assert match, f"README has no console block after {heading!r}"
    lines = [ln for ln in match.group(1).splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one command after {heading!r}, got {lines}"
    return lines[0].strip()


def readme_commands() -> tuple[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return (_first_command_after(text, "Run the main job:"),
            _first_command_after(text, "Run the tests:"))


def test_ci_runs_readmes_test_command_verbatim() -> None:
    _, tests = readme_commands()
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci_lines


def test_main_job_does_not_ask_for_the_trainer_extra() -> None:
    main, tests = readme_commands()
    assert main.startswith("uv run ") and "--extra" not in main
    assert "--extra dflash" in tests
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    heavy = {"torch", "transformers", "numpy", "safetensors"}
    core = {re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].lower()
            for d in project["project"]["dependencies"]}
    dev = {re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].lower()
           for d in project["dependency-groups"]["dev"]}
    assert not (core | dev) & heavy
    assert not any(d.startswith("envguard") for d in dev), "dev must not pull envguard[dflash]"
    assert heavy <= {re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].lower()
                     for d in project["project"]["optional-dependencies"]["dflash"]}


def test_the_suite_still_runs_without_xdist() -> None:
    # nox's integrations session installs pytest alone; the conftest's xdist hook must not
    # stop it (an unknown hook is an error unless it is optional).
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p",
                           "no:cacheprovider", "-q", "--collect-only", "tests/test_readme.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
