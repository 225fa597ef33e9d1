"""Doctor rules about the installed distributions, one environment alone."""

from __future__ import annotations

import re
from collections.abc import Iterator

from envguard.doctor.interface import DoctorRule, Scene, ago
from envguard.explain.interface import Finding, Severity
from envguard.explain.queries import (
    clean_then_reinstall,
    conda_reinstall,
    edit_in_uv_cache,
    overlap_finding,
    shared_note,
    shared_story,
)
from envguard.explain.remedies import (
    UnsafeValue,
    check_requirement,
    field_key,
    reinstall_command,
    remedy,
    uv_pip_install,
    uv_pip_uninstall,
)
from envguard.explain.tables import (
    CA_BUNDLES,
    TORCH_OWNED,
    VERIFY_HASH_HINT,
    is_serving_stack,
)
from envguard.model import Distribution, IntegrityIssue, Snapshot

_TORCH_OWNED_AND_NUMPY = TORCH_OWNED | {"numpy"}
_LABEL_TORCH = (re.compile(r"(?:^|[^a-z])pt(\d)(\d{1,2})(?![0-9])"),
                re.compile(r"torch-?(\d+)\.?(\d+)"))
"""Local version labels that name the torch an extension was built for: ``+pt210cu128``
(torch 2.10), ``+cu12torch2.6cxx11abiFALSE`` (flash-attn's release wheels)."""
_CHANGED = ("size", "hash", "missing", "not-a-regular-file", "outside-install-tree")


def marker_environment(snapshot: Snapshot) -> dict[str, str]:
    """PEP 508 marker values for the snapshot's interpreter (``extra`` empty: only what is
    required without extras)."""
    from packaging.markers import default_environment

    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    version = snapshot.interpreter.version
    impl = snapshot.interpreter.implementation
    env.update({
        "python_version": ".".join(version.split(".")[:2]), "python_full_version": version,
        "implementation_name": impl,
        "platform_python_implementation": {"cpython": "CPython", "pypy": "PyPy"}.get(
            impl, impl.capitalize()),
        "platform_machine": snapshot.system.machine or env["platform_machine"],
        "extra": ""})
    plat = snapshot.interpreter.platform
    if plat.startswith("linux"):
        env.update({"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"})
    elif plat.startswith("macosx") or plat.startswith("darwin"):
        env.update({"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix"})
    elif plat.startswith("win"):
        env.update({"sys_platform": "win32", "platform_system": "Windows", "os_name": "nt"})
    return env


def _unsatisfied(snapshot: Snapshot) -> Iterator[tuple[Distribution, str, str]]:
    """(requiring distribution, requirement, what is wrong)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    env = marker_environment(snapshot)
    for dist in snapshot.packages:
        for text in dist.requires:
            try:
                req = Requirement(text)
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
            except (InvalidRequirement, ValueError, KeyError):
                continue
            name = canonicalize_name(req.name)
            if name == dist.name:
                continue
            installed = snapshot.package(name)
            if installed is None:
                yield dist, text.split(";")[0].strip(), "not installed"
                continue
            if not req.specifier or installed.version is None:
                continue
            try:
                ok = req.specifier.contains(Version(installed.version), prereleases=True)
            except InvalidVersion:
                continue
            if not ok:
                yield dist, text.split(";")[0].strip(), f"{installed.version} is installed"


def requirements_unsatisfied(scene: Scene) -> Iterator[Finding]:
    found = list(_unsatisfied(scene.snapshot))
    if not found:
        return
    core = any(req.split("=")[0].split("<")[0].split(">")[0].split("~")[0].strip().lower()
               in _TORCH_OWNED_AND_NUMPY or why == "not installed" for _, req, why in found)
    requirers = sorted({d.name for d, _, _ in found})
    yield Finding(
        rule="requirements-unsatisfied",
        severity=Severity.CRITICAL if core else Severity.WARNING,
        title=f"{len(found)} requirement(s) of installed packages are not met "
              f"({', '.join(requirers[:4])}{' ...' if len(requirers) > 4 else ''})",
        explanation="An installed package needs a version of another that is not the one "
                    "installed, or one that is missing: what `pip check` reports. A package "
                    "pinned to another torch usually fails at import with undefined symbols "
                    "or runs against an API it was not built for.",
        evidence=tuple(f"{d.name} {d.version} requires {req}: {why}" for d, req, why in found),
        remedy=(remedy(lambda: uv_pip_install([
                    check_requirement(r, f"packages.{field_key(d.name)}.requires")
                    for d, r, _ in found[:6]]),
                suffix="  (or reinstall the requiring packages at versions made for what is "
                "installed)"),
                "pip check lists the same conflicts"),
        weight=80, keywords=("ImportError", "undefined symbol", "requires", "No module named"))


def _labelled_torch(version: str) -> tuple[int, int] | None:
    local = version.partition("+")[2].lower()
    for pattern in _LABEL_TORCH:
        found = pattern.search(local)
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


def _wheel_version(url: str) -> str:
    """The version part of a wheel file name in a URL (``2.5.7+cu122torch2.2...``)."""
    from urllib.parse import unquote

    name = unquote(url.rsplit("/", 1)[-1])
    parts = name.split("-")
    return parts[1] if name.endswith(".whl") and len(parts) >= 5 else ""


def _compiled(dist: Distribution) -> bool:
    return any(not tag.endswith("-none-any") for tag in dist.wheel_tags) or not dist.wheel_tags


def extension_built_for_other_torch(scene: Scene) -> Iterator[Finding]:
    torch = scene.snapshot.package("torch")
    if torch is None or torch.version is None:
        return
    public = torch.version.partition("+")[0]
    major_minor = tuple(int(x) for x in public.split(".")[:2] if x.isdigit())
    evidence: list[str] = []
    names: list[Distribution] = []
    for dist in scene.snapshot.packages:
        if dist.name in TORCH_OWNED or not dist.version:
            continue
        pins = [r for r in dist.requires if re.match(r"^\s*torch\s*===?\s*[0-9]", r)]
        pinned = [p for p in pins if p.split("=")[-1].split(";")[0].strip()
                  .partition("+")[0] != public]
        label = _labelled_torch(dist.version)
        where = "its version label"
        if label is None and dist.direct_url is not None:
            # flash-attn's release wheels keep the torch they were built for only in the
            # file name (flash_attn-2.5.7+cu122torch2.2cxx11abiFALSE-...whl)
            label = _labelled_torch(_wheel_version(dist.direct_url.url))
            where = "the wheel file it was installed from"
        wrong_label = label is not None and label != major_minor
        if not _compiled(dist) or not (pinned or wrong_label):
            continue
        names.append(dist)
        if pinned:
            evidence.append(f"{dist.name} {dist.version} pins {pinned[0].split(';')[0]}")
        if wrong_label and label is not None:
            evidence.append(f"{dist.name} {dist.version}: {where} names torch "
                            f"{label[0]}.{label[1]}")
    if not names:
        return
    evidence.append(f"installed: torch {torch.version}")
    yield Finding(
        rule="extension-built-for-other-torch", severity=Severity.CRITICAL,
        title=f"compiled extensions built for another torch: "
              f"{', '.join(d.name for d in names)} (torch {torch.version} is installed)",
        explanation="Packages with compiled code that links libtorch (flash-attn, "
                    "torchvision, torchaudio, xformers, apex, custom ops) only load against "
                    "the torch they were built for; against another one they fail with "
                    "`undefined symbol` at import, or crash later.",
        evidence=tuple(evidence),
        remedy=(remedy(lambda: uv_pip_install([d.name for d in names], reinstall=True),
                       f"reinstall them built for torch {public}: ",
                       " (from the index that serves torch's build)"),
                "or put back the torch they were built for"),
        weight=90, keywords=("undefined symbol", "ImportError", "_C.so", "libc10", "libtorch"))


def duplicate_distribution(scene: Scene) -> Iterator[Finding]:
    dupes = [d for d in scene.snapshot.packages if d.shadowed]
    if not dupes:
        return
    core = any(d.name in _TORCH_OWNED_AND_NUMPY for d in dupes)
    yield Finding(
        rule="duplicate-distribution", severity=Severity.CRITICAL if core else Severity.WARNING,
        title=f"{len(dupes)} distribution(s) installed twice on sys.path: "
              f"{', '.join(d.name for d in dupes[:5])}",
        explanation="Two copies of one distribution sit in different sys.path folders (a "
                    "user-site copy from `pip install --user`, a PYTHONPATH folder, a second "
                    "site-packages). Python imports the first; tools that inspect the "
                    "environment may report the other.",
        evidence=tuple(f"{d.name}: {d.version} in {d.location}/{d.metadata_dir}; also "
                       f"metadata in {', '.join(d.shadowed)} (in one folder, the files on "
                       "disk are those of the install that ran last)" for d in dupes),
        remedy=(remedy(lambda: ["python", "-m", "pip", "uninstall", "--user", "--",
                                *(d.name for d in dupes[:5])],
                       "remove the copy you do not want, e.g. for a user-site copy: ",
                       ", or unset PYTHONPATH"),),
        weight=70, keywords=("version mismatch", "AttributeError", "has no attribute"))


def foreign_stack_installed(scene: Scene) -> Iterator[Finding]:
    snap = scene.snapshot
    foreign = sorted(d.name for d in snap.packages if is_serving_stack(d.name))
    if not foreign or snap.package("torch") is None:
        return
    evidence = [f"installed: {', '.join(foreign)}"]
    episode = scene.timeline.episode_of(foreign[0])
    if episode is not None:
        others = len(episode.events) - 1
        evidence.append(f"{foreign[0]} was installed at {_clock(episode.start)}, "
                        f"{ago(scene, episode.start)}, in one install with {others} other "
                        "event(s) (envguard history shows it)")
    yield Finding(
        rule="foreign-stack-installed", severity=Severity.WARNING,
        title=f"inference packages share this training environment: {', '.join(foreign)}",
        explanation="Serving stacks pin their own torch, CUDA wheels and triton and "
                    "JIT-compile kernels against them; installed into a training venv they "
                    "replace or mix what the trainer was built and tested with.",
        evidence=tuple(evidence),
        remedy=("keep serving and training in separate venvs",
                remedy(lambda: uv_pip_uninstall(foreign), "remove them here: ",
                       ", then run envguard doctor again")),
        weight=75, keywords=("sglang", "vllm", "flashinfer"))


def _clock(at: float) -> str:
    from envguard.history import utc

    return utc(at)


def _extended_bundle(issue: IntegrityIssue) -> bool:
    """A CA bundle of :data:`CA_BUNDLES` that grew (certificates appended), or was written
    after install (seen by time only)."""
    if issue.path not in CA_BUNDLES:
        return False
    if issue.problem == "modified-after-install":
        return True
    grew = (issue.expected or "").isdigit() and (issue.actual or "").isdigit() \
        and int(issue.actual or 0) > int(issue.expected or 0)
    return issue.problem == "size" and grew


def ca_bundle_extended(scene: Scene) -> Iterator[Finding]:
    grown = [i for i in scene.snapshot.integrity.issues if _extended_bundle(i)]
    if not grown:
        return
    yield Finding(
        rule="ca-bundle-extended", severity=Severity.INFO,
        title=f"CA bundle extended with local certificates: {', '.join(i.path for i in grown)}",
        explanation="The bundle is larger than the package installed it: certificates were "
                    "appended (a site's own root CA, added in an image build). That is an "
                    "intended edit; reinstalling the package would drop them and break TLS "
                    "to the site's servers.",
        evidence=tuple(f"{i.package}: {i.path} ({i.expected} → {i.actual} bytes)"
                       for i in grown),
        remedy=("keep it; to make it survive upgrades, point REQUESTS_CA_BUNDLE and "
                "SSL_CERT_FILE at a bundle outside site-packages instead",),
        weight=10, keywords=("CERTIFICATE_VERIFY_FAILED", "SSLError", "certificate"))


def installed_files_modified(scene: Scene) -> Iterator[Finding]:
    issues = [i for i in scene.snapshot.integrity.issues if not _extended_bundle(i)]
    changed = [i for i in issues if i.problem in _CHANGED]
    newer = [i for i in issues if i.problem == "modified-after-install"]
    if not changed and not newer:
        return
    packages = sorted({i.package for i in (*changed, *newer)})
    mode = scene.snapshot.integrity.mode
    confirmed = bool(changed)
    evidence = [f"{i.package}: {i.path} ({i.problem}{shared_note(i)})"
                for i in (*changed, *newer)][:12]
    yield Finding(
        rule="installed-files-modified",
        severity=Severity.CRITICAL if confirmed else Severity.WARNING,
        title=(f"installed files differ from their RECORD in {', '.join(packages)}" if confirmed
               else f"installed files were written after install in {', '.join(packages)}"),
        explanation="Files inside site-packages were edited, replaced or deleted after the "
                    "package was installed (a monkey-patch while debugging, a half-finished "
                    "install). pip and uv still report the package as installed. An edit "
                    "to a torch .py file also changes torch's source hash, so every "
                    "compile-cache entry misses."
                    + shared_story(scene.snapshot, packages)
                    + ("" if confirmed else f" Seen by modification time only ({mode} "
                       "check): " + VERIFY_HASH_HINT + "."),
        evidence=tuple(evidence),
        remedy=(*(_reinstall(scene, n) for n in packages[:4]),
                VERIFY_HASH_HINT),
        weight=92, keywords=("symbolically trace", "_symbolic_trace", "AttributeError"))


def _reinstall(scene: Scene, name: str) -> str:
    """``uv pip install --reinstall --no-deps "torch==2.11.0+cu128" --index-url ...``, or
    ``conda install --force-reinstall`` for a conda package (``conda:NAME``)."""
    if name.startswith("conda:"):
        return conda_reinstall(scene.snapshot, name)
    dist = scene.snapshot.package(name)
    if dist is None or not dist.version:
        return f"reinstall {name} (no version is recorded for it)"
    try:
        argv = reinstall_command(dist)
    except UnsafeValue as exc:
        return f"(no command: {exc})"
    if argv is None:
        return f"reinstall {name} from the folder or checkout it was installed from"
    if edit_in_uv_cache(scene.snapshot, name):
        return clean_then_reinstall(name, lambda: argv, "  (envguard doctor --fix does it)")
    return remedy(lambda: argv, suffix="  (envguard doctor --fix does it)")


def conda_pip_overlap(scene: Scene) -> Iterator[Finding]:
    overlap = [p for p in scene.snapshot.conda if p.pip_also]
    if overlap:
        yield overlap_finding([f"{p.name} {p.version} ({p.channel}): a {p.pip_also} install "
                               "of it sits on conda's record" for p in overlap],
                              [p.name for p in overlap])


def known_break(scene: Scene) -> Iterator[Finding]:
    """Every pair of the knowledge base (:mod:`envguard.explain.knowledge`) this
    environment meets: a break its metadata allows, so no resolver reports it."""
    from envguard.explain.knowledge import broken_pairs, pair_finding

    for pair in broken_pairs(scene.snapshot):
        yield pair_finding(pair)


RULES = (
    DoctorRule(id="ca-bundle-extended", title="a CA bundle with local certificates appended",
               check=ca_bundle_extended),
    DoctorRule(id="known-break", title="a known break between two installed versions",
               check=known_break),
    DoctorRule(id="conda-pip-overlap", title="pip installed over a conda package",
               check=conda_pip_overlap),
    DoctorRule(id="requirements-unsatisfied", title="an installed requirement is not met",
               check=requirements_unsatisfied),
    DoctorRule(id="extension-built-for-other-torch",
               title="compiled extension built for another torch",
               check=extension_built_for_other_torch),
    DoctorRule(id="duplicate-distribution", title="two copies of one distribution",
               check=duplicate_distribution),
    DoctorRule(id="foreign-stack-installed", title="inference stack in a training env",
               check=foreign_stack_installed),
    DoctorRule(id="installed-files-modified", title="site-packages files differ from RECORD",
               check=installed_files_modified),
)
