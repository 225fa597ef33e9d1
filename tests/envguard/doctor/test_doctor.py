"""Every doctor rule: a hit and a near miss, built from the real H200 snapshot.

The tables are keyed by rule id and the tests iterate ``ALL_RULES``, so a rule added
without cases fails here. The real snapshot itself (197 distributions, torch
2.11.0+cu130, driver 580.159.04, one H200) is the common near miss: it meets every
requirement, has one CUDA family and a new enough driver. Its own finding, certifi's CA
bundle appended by the image, is kept out by clearing integrity issues in the base.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from envguard.doctor import ALL_RULES, diagnose
from envguard.doctor.interface import LibraryCopy, Scene, Shadow
from envguard.explain.interface import Severity
from envguard.history import CACHE_CREATED, INSTALLED, REINSTALLED, Event, Timeline, group
from envguard.model import (
    CacheDir,
    CondaPackage,
    Distribution,
    Gpu,
    Integrity,
    IntegrityIssue,
    Snapshot,
)
from tests.incident import real_h200

NOW = 1_800_000_000.0


@functools.cache
def base() -> Snapshot:
    s = real_h200()
    return replace(s, integrity=Integrity(mode="size"), caches=[
        CacheDir(kind="inductor", path="/cache/inductor", source="TORCHINDUCTOR_CACHE_DIR",
                 exists=True, files=500, total_bytes=10**8, filesystem="ext4")])


def scene(s: Snapshot | None = None, *, events: tuple[Event, ...] = (),
          libraries: tuple[LibraryCopy, ...] = ()) -> Scene:
    snap = s or base()
    return Scene(snapshot=snap, libraries=libraries, gpus_present=bool(snap.system.gpus),
                 timeline=Timeline(environment="/venv", created_at=None, taken_at=NOW,
                                   events=events, episodes=group(events)))


def with_package(s: Snapshot, name: str, **kw: Any) -> Snapshot:
    assert s.package(name) is not None, name
    return replace(s, packages=[replace(p, **kw) if p.name == name else p for p in s.packages])


def add(s: Snapshot, name: str, version: str, *, requires: tuple[str, ...] = (),
        tags: tuple[str, ...] = ("cp312-cp312-manylinux_2_28_x86_64",)) -> Snapshot:
    dist = Distribution(name=name, version=version, location="/venv/site-packages",
                        metadata_dir=f"{name}-{version}.dist-info", installer="uv",
                        requires=list(requires), wheel_tags=list(tags))
    return replace(s, packages=sorted([*s.packages, dist], key=lambda d: d.name))


def cudart(variable: str, major: int) -> LibraryCopy:
    return LibraryCopy(variable=variable, folder="/usr/local/cuda/lib64",
                       file=f"libcudart.so.{major}", library="cudart", major=major)


Case = Callable[[], Scene]


def web(jinja2: str, markupsafe: str) -> Snapshot:
    return with_package(with_package(base(), "jinja2", version=jinja2), "markupsafe",
                        version=markupsafe)

def shadowed(*shadows: Shadow, s: Snapshot | None = None) -> Scene:
    return replace(scene(s), shadows=shadows)


def torch_at(version: str, *, cuda: str | None) -> Snapshot:
    s = with_package(base(), "torch", version=version)
    return replace(s, torch=replace(s.torch, cuda=cuda))


def jax_pair(jax: str, jaxlib: str, floor: str | None) -> Snapshot:
    """The real snapshot's jax and jaxlib (0.11.2 both) at these versions."""
    stated = {"_minimum_jaxlib_version": floor} if floor else {}
    s = with_package(with_package(base(), "jax", version=jax, stated=stated), "jaxlib",
                     version=jaxlib)
    return s


def yaml_tagged(tag: str) -> Snapshot:
    """The real snapshot less its one locally built wheel (cupy), plus PyYAML so tagged."""
    s = replace(base(), packages=[p for p in base().packages if p.name != "cupy-cuda13x"])
    return add(s, "pyyaml", "6.0.2", tags=(tag,))


def bundle(problem: str, expected: str, actual: str, path: str = "certifi/cacert.pem"
           ) -> Snapshot:
    issue = IntegrityIssue(package="certifi", path=path, problem=problem, expected=expected,
                           actual=actual)
    return replace(base(), integrity=replace(base().integrity, issues=[issue]))


HITS: dict[str, list[Case]] = {
    "ca-bundle-extended": [
        lambda: scene(bundle("size", "240216", "241384")),
        lambda: scene(bundle("modified-after-install", "", "")),
    ],
    "companion-variant-differs": [
        lambda: scene(add(torch_at("2.11.0+cpu", cuda=None), "torchvision", "0.26.0+cu130")),
        # no label (PyPI's default build): torchvision/version.py says cuda = "12.8"
        lambda: scene(replace(add(base(), "torchvision", "0.26.0"), packages=[
            replace(p, stated={"cuda": "12.8"}) if p.name == "torchvision" else p
            for p in add(base(), "torchvision", "0.26.0").packages])),
        lambda: scene(add(base(), "torchaudio", "2.11.0+cu128")),  # cu12 beside cu130
    ],
    "built-here-from-source": [
        lambda: scene(yaml_tagged("cp312-cp312-linux_x86_64")),
    ],
    "jaxlib-older-than-jax-accepts": [
        lambda: scene(jax_pair("0.4.13", "0.4.7", "0.4.11")),
    ],
    "module-shadowed": [
        lambda: shadowed(Shadow(folder="/w", source="working folder", modules=("random",))),
        lambda: shadowed(Shadow(folder="/p", source="PYTHONPATH", modules=("numpy",))),
    ],
    "pythonpath-other-python": [
        lambda: shadowed(Shadow(folder="/o/lib/python3.10/site-packages", source="PYTHONPATH",
                                modules=("numpy",), site_python="3.10")),
    ],
    "known-break": [
        lambda: scene(web("2.11.3", "2.1.1")),
    ],
    "conda-pip-overlap": [
        lambda: scene(replace(base(), conda=[CondaPackage(
            name="pytorch", version="2.1.0", build="py3.11_cuda11.8_0", channel="pytorch",
            pip_also="pip")])),
    ],
    "requirements-unsatisfied": [
        lambda: scene(add(base(), "torchvision", "0.26.0", requires=("torch==2.10.0",))),
        lambda: scene(add(base(), "acme", "1.0", requires=("missing-lib>=1",))),
    ],
    "extension-built-for-other-torch": [
        lambda: scene(add(base(), "torchvision", "0.26.0", requires=("torch==2.10.0",))),
        lambda: scene(add(base(), "flash-attn", "2.7.4+cu12torch2.6cxx11abifalse",
                          requires=("torch",))),
        lambda: scene(add(base(), "torch-scatter", "2.1.2+pt210cu128")),
    ],
    "cuda-wheels-mixed": [
        lambda: scene(replace(base(), torch=replace(
            base().torch, cuda_wheel_family="mixed",
            cuda_wheels=["nvidia-cudnn-cu12==9.1.0", "nvidia-cublas==13.0.0"]))),
        # a conda CUDA 12 runtime beside torch's CUDA 13 wheels
        lambda: scene(replace(base(), conda=[CondaPackage(name="cuda-runtime",
                                                          version="12.4.1")])),
    ],
    "cuda-driver-too-old": [
        lambda: scene(replace(base(), system=replace(base().system,
                                                     driver_version="550.54.14"))),
        lambda: scene(replace(base(), torch=replace(base().torch, cuda="12.8"),
                              system=replace(base().system, driver_version="560.35.03"))),
    ],
    "cuda-library-shadowed": [
        lambda: scene(libraries=(cudart("LD_LIBRARY_PATH", 12),)),
        lambda: scene(libraries=(cudart("LD_PRELOAD", 13),)),
    ],
    "duplicate-distribution": [
        lambda: scene(with_package(base(), "numpy",
                                   shadowed=["/root/.local/lib/python3.12/site-packages"])),
    ],
    "torch-cpu-build-on-gpu-host": [
        lambda: scene(replace(base(), torch=replace(base().torch, cuda=None,
                                                    version="2.11.0+cpu"))),
    ],
    "foreign-stack-installed": [lambda: scene(add(base(), "sglang", "0.5.6", tags=()))],
    "installed-files-modified": [
        lambda: scene(replace(base(), integrity=Integrity(mode="size", issues=[
            IntegrityIssue(package="torch", path="torch/fx/_symbolic_trace.py",
                           problem="size", expected="51874", actual="52233")]))),
        lambda: scene(replace(base(), integrity=Integrity(mode="size", issues=[
            IntegrityIssue(package="torch", path="torch/fx/_symbolic_trace.py",
                           problem="modified-after-install")]))),
    ],
    "compile-cache-cold": [
        lambda: scene(replace(base(), caches=[replace(base().caches[0], exists=False, files=0,
                                                      populated_under=[filled()])])),
        lambda: scene(events=(
            Event(at=NOW - 86400, kind=REINSTALLED, subject="torch", detail="2.11.0+cu130"),
            Event(at=NOW - 600, kind=CACHE_CREATED, subject="inductor /cache/inductor"))),
        lambda: scene(replace(base(), caches=[replace(base().caches[0], populated_under=[
            replace_stamp(base().torch.compat_key or "")])]),
            events=(Event(at=NOW - 600, kind=CACHE_CREATED,
                          subject="inductor /cache/inductor"),)),
    ],
    "compile-cache-stale": [
        lambda: scene(replace(base(), caches=[replace(base().caches[0], populated_under=[
            replace_stamp("sha256:" + "9" * 64)])])),
    ],
    "compile-cache-volatile": [
        lambda: scene(replace(base(), caches=[replace(base().caches[0],
                                                      filesystem="tmpfs")])),
    ],
}

MISSES: dict[str, list[Case]] = {
    "ca-bundle-extended": [
        lambda: scene(bundle("size", "240216", "1000")),  # shrunk: not an append
        lambda: scene(bundle("missing", "240216", "")),
        lambda: scene(bundle("size", "100", "200", path="certifi/core.py")),
    ],
    "companion-variant-differs": [
        lambda: scene(add(base(), "torchvision", "0.26.0+cu130")),
        lambda: scene(add(base(), "torchvision", "0.26.0")),  # no label: nothing to compare
        lambda: scene(add(torch_at("2.11.0+cpu", cuda=None), "torchvision", "0.26.0+cpu")),
    ],
    "jaxlib-older-than-jax-accepts": [
        lambda: scene(jax_pair("0.4.13", "0.4.13", "0.4.11")),
        lambda: scene(jax_pair("0.4.13", "0.4.7", None)),  # jax/version.py unread
        lambda: scene(base()),  # 0.11.2 both, nothing stated
    ],
    "built-here-from-source": [
        lambda: scene(yaml_tagged("cp312-cp312-manylinux_2_17_x86_64")),
        lambda: scene(yaml_tagged("py3-none-any")),
    ],
    "module-shadowed": [
        lambda: shadowed(Shadow(folder="/w", source="working folder",
                                modules=("train", "test", "my_helpers"))),
        lambda: shadowed(),
    ],
    "pythonpath-other-python": [
        lambda: shadowed(Shadow(folder="/o/lib/python3.12/site-packages", source="PYTHONPATH",
                                modules=("numpy",), site_python="3.12")),
        lambda: shadowed(Shadow(folder="/src", source="PYTHONPATH", modules=("mylib",))),
    ],
    "known-break": [
        lambda: scene(web("2.11.3", "2.0.1")),
        lambda: scene(web("3.0.0", "2.1.1")),
        lambda: scene(with_package(base(), "markupsafe", version="2.1.1")),
    ],
    "conda-pip-overlap": [
        lambda: scene(),
        lambda: scene(replace(base(), conda=[CondaPackage(name="pytorch", version="2.1.0")])),
    ],
    "requirements-unsatisfied": [
        lambda: scene(),  # 197 real distributions, every requirement met
        lambda: scene(add(base(), "torchvision", "0.26.0",
                          requires=("torch==2.11.0", "pillow; python_version < '3.0'"))),
    ],
    "extension-built-for-other-torch": [
        lambda: scene(add(base(), "torchvision", "0.26.0", requires=("torch==2.11.0",))),
        lambda: scene(add(base(), "flash-attn", "2.8.0+cu12torch2.11cxx11abitrue")),
        lambda: scene(add(base(), "pure-helper", "1.0+pt210", tags=("py3-none-any",))),
    ],
    "cuda-wheels-mixed": [
        lambda: scene(),
        lambda: scene(replace(base(), conda=[CondaPackage(name="cuda-runtime",
                                                          version="13.0.2"),
                                             CondaPackage(name="mkl", version="2023.1.0")])),
    ],
    "cuda-driver-too-old": [
        lambda: scene(),
        lambda: scene(replace(base(), system=replace(base().system, driver_version=None))),
    ],
    "cuda-library-shadowed": [
        lambda: scene(),
        lambda: scene(replace(base(), torch=replace(base().torch, cuda=None)),
                      libraries=(cudart("LD_LIBRARY_PATH", 12),)),
    ],
    "duplicate-distribution": [lambda: scene()],
    "torch-cpu-build-on-gpu-host": [
        lambda: scene(),
        lambda: scene(replace(base(), torch=replace(base().torch, cuda=None),
                              system=replace(base().system, gpus=[]))),
    ],
    "foreign-stack-installed": [
        lambda: scene(),
        lambda: scene(replace(add(base(), "vllm", "0.9.0", tags=()),
                              packages=[p for p in add(base(), "vllm", "0.9.0").packages
                                        if p.name != "torch"])),
    ],
    "installed-files-modified": [lambda: scene()],
    "compile-cache-cold": [
        lambda: scene(),
        # a machine that never compiled: no cache, no sighting, no history of one
        lambda: scene(replace(base(), caches=[replace(base().caches[0], exists=False,
                                                      files=0)])),
        lambda: scene(events=(
            Event(at=NOW - 600, kind=REINSTALLED, subject="torch", detail="2.11.0+cu130"),
            Event(at=NOW - 590, kind=CACHE_CREATED, subject="inductor /cache/inductor"))),
        # a first install, then the first compile days later: what every machine does
        lambda: scene(events=(
            Event(at=NOW - 5 * 86400, kind=INSTALLED, subject="torch", detail="2.11.0"),
            Event(at=NOW - 600, kind=CACHE_CREATED, subject="inductor /cache/inductor"))),
    ],
    "compile-cache-stale": [
        lambda: scene(),
        lambda: scene(replace(base(), caches=[replace(base().caches[0], populated_under=[
            replace_stamp(base().torch.compat_key or "")])])),
    ],
    "compile-cache-volatile": [lambda: scene()],
}


def filled() -> Any:
    """envguard's sighting of the cache filled under some build: it was used here."""
    return replace_stamp("sm90-old-build")


def replace_stamp(key: str) -> Any:
    from envguard.model import BuildStamp

    return BuildStamp(compat_key=key, torch_version="2.10.0+cu128",
                      torch_git_version="a" * 40, first_seen="2026-11-01T00:00:00Z")


def _fired(rule_id: str, case: Case) -> list[Any]:
    rule = next(r for r in ALL_RULES if r.id == rule_id)
    return list(rule.check(case()))


@pytest.mark.parametrize("rule_id", [r.id for r in ALL_RULES])
def test_every_rule_has_a_hit_and_a_miss(rule_id: str) -> None:
    assert HITS.get(rule_id), f"{rule_id}-NO-CASES"
    assert MISSES.get(rule_id), f"{rule_id}-NO-CASES"
    for i, case in enumerate(HITS[rule_id]):
        found = _fired(rule_id, case)
        assert found, f"{rule_id}: hit {i} did not fire"
        assert all(f.rule == rule_id and f.evidence and f.remedy for f in found)
    for i, case in enumerate(MISSES[rule_id]):
        assert not _fired(rule_id, case), f"{rule_id}: miss {i} fired"


def test_severities_say_how_sure_the_evidence_is() -> None:
    def severity(rule_id: str, case: Case) -> Severity:
        return _fired(rule_id, case)[0].severity

    driver = HITS["cuda-driver-too-old"]
    assert severity("cuda-driver-too-old", driver[0]) is Severity.CRITICAL  # below 13.x floor
    assert severity("cuda-driver-too-old", driver[1]) is Severity.WARNING  # minor-version compat
    lib = HITS["cuda-library-shadowed"]
    assert severity("cuda-library-shadowed", lib[0]) is Severity.WARNING  # other major
    assert severity("cuda-library-shadowed", lib[1]) is Severity.CRITICAL  # torch's soname
    edits = HITS["installed-files-modified"]
    assert severity("installed-files-modified", edits[0]) is Severity.CRITICAL
    soft = _fired("installed-files-modified", edits[1])[0]
    assert soft.severity is Severity.WARNING and "--verify hash" in soft.explanation
    cold = HITS["compile-cache-cold"]
    assert severity("compile-cache-cold", cold[0]) is Severity.INFO  # a fresh machine
    assert severity("compile-cache-cold", cold[1]) is Severity.WARNING  # deleted since


def test_the_real_h200_environment_is_healthy_its_ca_bundle_a_note() -> None:
    """The image's certifi and pip bundles carry the site's appended CA: a note that says
    to keep it, never "reinstall certifi" (which would break TLS there)."""
    report = diagnose(scene(real_h200()))
    assert report.healthy, [f.title for f in report.findings]
    (note,) = [f for f in report.findings if f.rule == "ca-bundle-extended"]
    assert "certifi/cacert.pem" in note.title and note.severity is Severity.INFO
    assert "reinstall" not in " ".join(note.remedy).split("drop")[0]
    assert not [f for f in report.findings if f.rule == "installed-files-modified"]
    assert diagnose(scene()).healthy


def test_a_symptom_lifts_the_rule_it_points_at() -> None:
    s = replace(base(), torch=replace(base().torch, cuda_wheel_family="mixed",
                                      cuda_wheels=["nvidia-cudnn-cu12==9.1.0"]),
                system=replace(base().system, driver_version="550.54.14"))
    plain = diagnose(scene(s))
    assert plain.findings[0].rule == "cuda-driver-too-old"  # the higher weight
    lifted = diagnose(scene(s), symptom="ImportError: libcudnn.so.9: cannot open shared "
                                        "object file: No such file or directory")
    assert lifted.findings[0].rule == "cuda-wheels-mixed"


def test_cuda_explanations_only_where_torch_and_gpus_are() -> None:
    cpu_host = replace(base(), system=replace(base().system, gpus=[]))
    cold = replace(cpu_host, caches=[replace(base().caches[0], exists=False, files=0,
                                             populated_under=[filled()])])
    (finding,) = _fired("compile-cache-cold", lambda: scene(cold))
    assert "H200" not in finding.explanation
    with_gpu = replace(cold, system=replace(cold.system, gpus=[Gpu(index=0,
                                                                  name="NVIDIA H200")]))
    (finding,) = _fired("compile-cache-cold", lambda: scene(with_gpu))
    assert "8.3 s on the H200" in finding.explanation
    no_torch = replace(cold, torch=replace(cold.torch, present=False),
                       packages=[p for p in cold.packages if p.name != "torch"])
    assert not _fired("compile-cache-cold", lambda: scene(no_torch))
