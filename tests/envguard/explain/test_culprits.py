"""From an error line to the distribution it names, and the one order of findings.

Error lines are users' own (the reports are cited in docs/CASES.md and
envguard/explain/knowledge/breaks.toml); snapshots are the real H200 one with versions set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from envguard.explain import Severity, explain
from envguard.explain.culprits import suspects
from envguard.explain.error_forms import read_error
from envguard.model import Snapshot
from tests.envguard.explain.test_rules import base, versions
from tests.paths import REPO
from tests.wheelfactory import VenvFactory, build_wheel

SOURCE = str(REPO)


@pytest.mark.parametrize(("line", "modules", "names", "dists", "kinds"), [
    ("ImportError: cannot import name 'soft_unicode' from 'markupsafe' "
     "(/venv/lib/python3.11/site-packages/markupsafe/__init__.py)",
     ("markupsafe",), ("soft_unicode",), (), ()),
    ("ModuleNotFoundError: No module named 'pkg_resources'", ("pkg_resources",), (), (), ()),
    ("AttributeError: module 'numpy' has no attribute 'float'.", ("numpy",), ("float",),
     ("numpy",), ("numpy-removed",)),
    ("AttributeError: partially initialized module 'random' has no attribute 'randint' "
     "(most likely due to a circular import)", ("random",), ("randint",), (),
     ("circular-import",)),
    ("ValueError: numpy.dtype size changed, may indicate binary incompatibility. Expected 96 "
     "from C header, got 88 from PyObject", (), (), ("numpy",), ("numpy-abi",)),
    ("ImportError: tokenizers>=0.14,<0.15 is required for a normal functioning of this "
     "module, but found tokenizers==0.15.0.", (), (), ("tokenizers",), ()),
    ("TypeError: Descriptors cannot be created directly.", (), (), ("protobuf",),
     ("protobuf-descriptors",)),
    ("the training loss went up after the weekend", (), (), (), ()),
])
def test_error_forms(line: str, modules: tuple[str, ...], names: tuple[str, ...],
                     dists: tuple[str, ...], kinds: tuple[str, ...]) -> None:
    facts = read_error(line)
    assert facts.modules == modules
    assert facts.names == names
    assert facts.dists == dists
    assert facts.kinds == kinds


def test_a_traceback_frame_names_its_site_packages_folder() -> None:
    text = ('Traceback (most recent call last):\n  File "/w/train.py", line 3, in <module>\n'
            '  File "/v/lib/python3.11/site-packages/jinja2/filters.py", line 13, in <module>\n'
            "ImportError: cannot import name 'soft_unicode' from 'markupsafe'")
    facts = read_error(text)
    assert facts.paths[0].endswith("jinja2/filters.py")
    s = versions(base(), jinja2="2.11.3", markupsafe="2.1.1")
    assert suspects(facts, (s,), text)[:2] == ("markupsafe", "jinja2")


def with_top_level(s: Snapshot, name: str, modules: list[str]) -> Snapshot:
    return replace(s, packages=[replace(p, top_level=modules) if p.name == name else p
                                for p in s.packages])


def test_a_module_maps_to_the_distribution_whose_record_holds_it() -> None:
    s = base()
    assert suspects(read_error("No module named 'zzz_mod'"), (s,)) == ()
    s = with_top_level(s, "markupsafe", ["zzz_mod"])
    assert suspects(read_error("No module named 'zzz_mod.sub'"), (s,)) == ("markupsafe",)
    # without a top_level, the import names the world uses, then the name itself
    assert suspects(read_error("cannot import name 'x' from 'yaml'"), (base(),)) == ("pyyaml",)
    assert suspects(read_error("module 'jinja2' has no attribute 'x'"), (base(),)) == ("jinja2",)


def test_an_error_a_known_break_reports_names_its_dependency(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from envguard.explain import knowledge

    entry = knowledge.parse_breaks(
        '[[break]]\nid = "demo"\npackage = "jinja2"\nversions = "<3"\n'
        'dependency = "certifi"\ndependency_versions = ">=2000"\n'
        'errors = ["\'EntryPoints\' object has no attribute \'get\'"]\n'
        'fix = ["certifi<2000"]\nreport = "https://example.org/report"\n')
    text = "AttributeError: 'EntryPoints' object has no attribute 'get'"
    s = versions(base(), jinja2="2.11.3")
    assert suspects(read_error(text), (s,), text) == ()
    monkeypatch.setattr(knowledge, "known_breaks", lambda: entry)
    assert suspects(read_error(text), (s,), text) == ("certifi",)


def _upgrades(s: Snapshot) -> Snapshot:
    return versions(s, markupsafe="3.0.4", idna="3.11", certifi="2099.1.1")


def test_the_named_package_leaves_its_group_and_comes_first() -> None:
    old = base()
    new = _upgrades(old)
    symptom = "ImportError: cannot import name 'escape' from 'markupsafe'"
    plain = explain(old, new)
    grouped = [f for f in plain if f.rule == "package-version-changed"]
    assert len(grouped) == 1 and len(grouped[0].changes) == 3
    ranked = explain(old, new, symptom=symptom)
    first = ranked[0]
    assert first.rule == "package-version-changed"
    assert [c.key for c in first.changes] == ["markupsafe"]
    assert "markupsafe==3.0.3" in "\n".join(first.remedy)
    assert "idna" not in "\n".join(first.remedy)
    rest = [f for f in ranked[1:] if f.rule == "package-version-changed"]
    assert [sorted(c.key for c in f.changes) for f in rest] == [["certifi", "idna"]]


def test_a_symptom_never_lifts_an_unrelated_warning_over_a_critical_finding() -> None:
    from tests.envguard.explain.test_rules import incident_pair

    old, new = incident_pair()
    plain = explain(old, new)
    assert plain[0].severity is Severity.CRITICAL
    # "has no attribute" is a keyword of package-version-changed (a warning at most here)
    ranked = explain(old, new, symptom="AttributeError: 'Foo' object has no attribute 'bar'")
    assert ranked[0].severity is Severity.CRITICAL
    severities = [f.severity.rank for f in ranked]
    assert severities == sorted(severities)


def test_record_paths_give_the_modules_a_distribution_installs() -> None:
    from envguard.probe.recordfile import top_level_modules

    assert top_level_modules([
        "google/protobuf/__init__.py", "google/protobuf/x.py", "google/_upb/_m.abi3.so",
        "protobuf-4.25.0.dist-info/RECORD"]) == ["google._upb", "google.protobuf"]
    assert top_level_modules([
        "yaml/__init__.py", "yaml/__pycache__/a.cpython-311.pyc", "_yaml/__init__.py",
        "six.py", "_cffi_backend.cpython-311-x86_64-linux-gnu.so", "../../bin/tool",
        "pkg/data/file.toml", "__editable__.demo-0.pth"]) == [
        "_cffi_backend", "_yaml", "six", "yaml"]


def test_a_real_diff_names_the_distribution_behind_an_import_name(
        venvs: VenvFactory, wheel_dir: Path, tmp_path: Path) -> None:
    """Real uv venvs: ``demo-dist`` installs the module ``zzmod`` (the names differ, and no
    table knows them); its upgrade and four harmless ones. The user's error names only the
    module: the snapshot's RECORD-derived ``top_level`` maps it back, and the diff puts
    demo-dist's change first, alone, with its own remedy."""
    def wheel(name: str, version: str, module: str) -> Path:
        return build_wheel(wheel_dir, name, version, {f"{module}/__init__.py": "x = 1\n"})

    names = ("noise-a", "noise-b", "noise-c", "noise-d")
    good = venvs.create("good")
    venvs.uv_install(good, wheel("demo-dist", "1.0", "zzmod"),
                     *(wheel(n, "1.0", n.replace("-", "_")) for n in names))
    bad = venvs.create("bad")
    venvs.uv_install(bad, wheel("demo-dist", "2.0", "zzmod"),
                     *(wheel(n, "1.1", n.replace("-", "_")) for n in names))
    env = {**os.environ, "PYTHONPATH": SOURCE}
    for venv, out in ((good, "good.json"), (bad, "bad.json")):
        subprocess.run([sys.executable, "-m", "envguard", "snapshot", "-q", "--python",
                        str(venv.python), "-o", str(tmp_path / out)], env=env, check=True,
                       cwd=tmp_path)
    symptom = "ImportError: cannot import name 'helper' from 'zzmod' (unknown location)"
    proc = subprocess.run([sys.executable, "-m", "envguard", "diff", str(tmp_path / "good.json"),
                           str(tmp_path / "bad.json"), "--symptom", symptom, "--format",
                           "json"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    first = json.loads(proc.stdout)["findings"][0]
    assert first["changes"] == ["packages.demo-dist.version"], first
    assert "demo-dist==1.0" in " ".join(first["remedy"])
    assert "noise" not in " ".join(first["remedy"])


SHADOWED = ("AttributeError: partially initialized module 'random' has no attribute "
            "'randint' (most likely due to a circular import)")


def test_a_partially_initialized_module_that_did_not_change_is_a_shadow() -> None:
    old = base()
    new = versions(old, idna="3.11", certifi="2099.1.1")
    first = explain(old, new, symptom=SHADOWED)[0]
    assert first.rule == "shadowed-module-suspected"
    assert "standard library's 'random'" in first.evidence[0]
    # the module's own distribution changed: the change is the story, not a shadow
    jinja = ("AttributeError: partially initialized module 'markupsafe' has no attribute "
             "'x' (most likely due to a circular import)")
    assert explain(old, versions(old, markupsafe="3.0.4"), symptom=jinja)[0].rule == \
        "package-version-changed"
    assert "shadowed-module-suspected" not in {f.rule for f in explain(old, new)}


def test_the_doctor_says_whose_code_failed_when_nothing_else_does() -> None:
    from envguard.doctor import diagnose
    from tests.envguard.doctor.test_doctor import scene

    quiet = replace(base(), packages=[p for p in base().packages if p.name != "cupy-cuda13x"])
    report = diagnose(scene(quiet), symptom="AttributeError: module 'PIL.Image' has no "
                                            "attribute 'ANTIALIAS'")
    first = report.findings[0]
    assert first.rule == "error-points-at" and "pillow" in first.title
    assert "pillow<10" in " ".join(first.remedy)  # the known break's fix
    assert diagnose(scene(quiet)).findings == () or all(
        f.rule != "error-points-at" for f in diagnose(scene(quiet)).findings)
