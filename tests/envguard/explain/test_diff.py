"""envguard diff: the incident end to end, goldens for JSON and Markdown, the CLI contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envguard.changes import diff
from envguard.exitcodes import ExitCode
from envguard.explain import explain
from envguard.explain.report import DiffReport
from envguard.render import diff as diff_view
from tests.incident import incident_pair, real_h200
from tests.paths import GOLDEN

UPDATE = os.environ.get("ENVGUARD_UPDATE_GOLDEN") == "1"
INCIDENT_RULES = {"torch-build-changed", "compile-cache-cold", "installed-files-modified",
                  "cuda-build-changed", "foreign-stack-installed", "file-changed"}


def _report(symptom: str | None = None) -> DiffReport:
    good, now = incident_pair()
    changes = diff(good, now)
    return DiffReport(old_name="good.json", new_name="now.json", diff=changes,
                      findings=tuple(explain(good, now, changes, symptom)), symptom=symptom)


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.read_text() == text, f"{name} changed; ENVGUARD_UPDATE_GOLDEN=1 rewrites it"


def test_incident_findings() -> None:
    report = _report()
    rules = [f.rule for f in report.findings]
    assert set(rules) >= INCIDENT_RULES
    assert rules[0] == "torch-build-changed"
    assert "2.11.0+cu128" in report.findings[0].title
    cold = next(f for f in report.findings if f.rule == "compile-cache-cold")
    assert "353.0 MB in 1,234 files → missing" in cold.evidence[0]
    assert cold.remedy[0].startswith("warm the cache single-threaded first")
    assert not report.equivalent
    assert report.verdict.startswith("most likely cause: torch was reinstalled")


def test_symptom_reranks_to_the_compile_cache() -> None:
    report = _report(symptom="hang at step 0 in flex_attention, watchdog timeout")
    assert report.findings[0].rule == "compile-cache-cold"


def test_json_golden() -> None:
    text = diff_view.json(_report())
    doc = json.loads(text)
    assert doc["schema"] == "envguard.diff/1"
    assert set(doc["findings"][0]) == {"rule", "severity", "title", "explanation", "evidence",
                                       "remedy", "changes"}
    _check_golden("incident.json", text)


def test_markdown_golden() -> None:
    _check_golden("incident.md", diff_view.markdown(_report()))


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "envguard", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120, check=False)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    good, now = incident_pair()
    a, b = tmp_path / "good.json", tmp_path / "now.json"
    a.write_text(good.to_json())
    b.write_text(now.to_json())
    return a, b


def test_cli_exit_codes_and_formats(pair: tuple[Path, Path]) -> None:
    a, b = pair
    same = _run("diff", str(a), str(a))
    assert same.returncode == ExitCode.OK, same.stderr
    assert "equivalent" in same.stdout
    different = _run("diff", str(a), str(b))
    assert different.returncode == ExitCode.DRIFT
    assert "CRITICAL" in different.stdout and "torch-build-changed" in different.stdout
    as_json = _run("diff", str(a), str(b), "--format", "json")
    assert as_json.returncode == ExitCode.DRIFT
    assert json.loads(as_json.stdout)["equivalent"] is False
    as_md = _run("diff", str(a), str(b), "--format", "markdown", "--symptom",
                 "undefined symbol: cublasLtGetVersion")
    assert as_md.returncode == ExitCode.DRIFT
    assert as_md.stdout.startswith("## envguard diff")
    assert "(`cuda-build-changed`)" in as_md.stdout.split("###")[1]


def test_hostile_strings_render_literally(tmp_path: Path) -> None:
    base = real_h200()
    import dataclasses

    from envguard.model import EnvValue

    hostile = "\x1b[31mred\x1b[0m [bold]x[/bold] | `code` <b>"
    env = dict(base.environment.variables)
    env["TORCH_HOSTILE"] = EnvValue(value=hostile)
    now = dataclasses.replace(base, environment=dataclasses.replace(base.environment,
                                                                    variables=env))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(base.to_json())
    b.write_text(now.to_json())
    text = _run("diff", str(a), str(b))
    assert "\x1b[31m" not in text.stdout
    assert "\\x1b[31mred\\x1b[0m [bold]x[/bold]" in text.stdout
    md = _run("diff", str(a), str(b), "--format", "markdown").stdout
    assert "\x1b" not in md and "\\[bold\\]x\\[/bold\\] \\| \\`code\\` \\<b\\>" in md
    doc = json.loads(_run("diff", str(a), str(b), "--format", "json").stdout)
    assert any(c["new"] == hostile for c in doc["changes"])


def test_undefined_cuda_symbol_points_at_the_cuda_build() -> None:
    report = _report(symptom="ImportError: undefined symbol: cudaGetDriverEntryPointByVersion")
    assert report.findings[0].rule == "cuda-build-changed"


def test_a_stale_cache_is_not_news_in_a_self_diff() -> None:
    import dataclasses

    from envguard.model import BuildStamp

    good, _ = incident_pair()
    other = BuildStamp(compat_key="sha256:" + "9" * 64, torch_version="2.10.0+cu128")
    caches = [dataclasses.replace(c, populated_under=[other], marker="added")
              if c.kind == "inductor" else c for c in good.caches]
    stale = dataclasses.replace(good, caches=caches)
    assert explain(stale, stale) == []
    assert "compile-cache-stale" in {f.rule for f in explain(good, stale)}
