"""From an error line to the distribution it names, and the one order of findings.

Error lines are users' own (the reports are cited in docs/CASES.md and
envguard/explain/knowledge/breaks.toml); snapshots are the real H200 one with versions set.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from envguard.explain import Severity, explain
from envguard.explain.culprits import suspects
from envguard.explain.error_forms import read_error
from envguard.model import Snapshot
from tests.test_rules import base, versions


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
    from tests.test_rules import incident_pair

    old, new = incident_pair()
    plain = explain(old, new)
    assert plain[0].severity is Severity.CRITICAL
    # "has no attribute" is a keyword of package-version-changed (a warning at most here)
    ranked = explain(old, new, symptom="AttributeError: 'Foo' object has no attribute 'bar'")
    assert ranked[0].severity is Severity.CRITICAL
    severities = [f.severity.rank for f in ranked]
    assert severities == sorted(severities)
