"""Restore a conda or pixi environment: GOOD's conda packages as an ``@EXPLICIT`` spec and
an ``environment.yml``, and the command of a tool on this machine that recreates it.

The explicit spec lists each package archive by URL with its md5 (conda's and mamba's
``--file`` format), so the solver is not asked anything: the same builds come back. The
Python packages pip or uv installed on top go into the ``pip:`` section of
``environment.yml`` and a requirements file (:mod:`envguard.restore.export`'s pins).

Pure, except :func:`find_tools` (which looks at PATH) and :func:`create_commands`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence

from envguard.explain.remedies import conda_create, shell_line
from envguard.frozen import frozen
from envguard.model import CondaPackage, Snapshot
from envguard.redact import MASK
from envguard.restore.export import utf8_text
from envguard.restore.plan import requirement_for

TOOLS = ("micromamba", "mamba", "conda")
"""What can recreate a prefix from an explicit spec, in order of preference."""
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=<>,:/~-]*$")
"""A YAML plain scalar: no quotes needed (no ": ", no leading indicator character)."""


@frozen
class CondaSpec:
    """GOOD's conda packages, in the two forms conda tools read."""

    explicit: str
    """The ``@EXPLICIT`` file."""
    environment_yml: str
    pip_requirements: tuple[str, ...]
    """Pins of the Python packages that pip or uv installed, not conda."""
    left_out: tuple[str, ...]
    """Conda packages without a usable URL (not in the explicit file; ``environment.yml``
    still pins them by version and build)."""
    platform: str | None


def _usable_url(pkg: CondaPackage) -> bool:
    url = pkg.url or ""
    return (bool(re.match(r"^(https?|file)://\S+$", url)) and MASK not in url
            and utf8_text(url) == url)


def _platform(packages: Sequence[CondaPackage]) -> str | None:
    subdirs = sorted({p.subdir for p in packages if p.subdir and p.subdir != "noarch"})
    return subdirs[0] if subdirs else None


def explicit_text(packages: Sequence[CondaPackage], platform: str | None) -> str:
    lines = ["# conda packages of an envguard snapshot, exact builds by URL and md5",
             "# create with: micromamba create -p PREFIX -f THIS_FILE",
             "#          or: conda create -p PREFIX --file THIS_FILE"]
    if platform:
        lines.append(f"# platform: {platform}")
    lines.append("@EXPLICIT")
    for pkg in sorted(packages, key=lambda p: p.name):
        if not _usable_url(pkg):
            continue
        digest = f"#{pkg.md5}" if pkg.md5 and re.fullmatch(r"[0-9a-f]{32}", pkg.md5) else ""
        lines.append(f"{pkg.url}{digest}")
    return "\n".join(lines) + "\n"


def _yaml_str(text: str) -> str:
    text = utf8_text(text)
    return text if _SAFE.match(text) else '"' + text.replace("\\", "\\\\").replace(
        '"', '\\"') + '"'


def environment_yml(packages: Sequence[CondaPackage], pip: Sequence[str], name: str) -> str:
    channels = sorted({p.channel for p in packages if p.channel and MASK not in p.channel})
    out = [f"name: {_yaml_str(name)}", "channels:"]
    out += [f"  - {_yaml_str(c)}" for c in channels] or ["  - conda-forge"]
    out.append("dependencies:")
    for pkg in sorted(packages, key=lambda p: p.name):
        spec = "=".join(x for x in (pkg.name, pkg.version, pkg.build) if x)
        if pkg.channel and MASK not in pkg.channel:
            spec = f"{pkg.channel}::{spec}"
        out.append(f"  - {_yaml_str(spec)}")
    if pip:
        out.append("  - pip:")
        out += [f"      - {_yaml_str(line)}" for line in pip]
    return "\n".join(out) + "\n"


def conda_spec(good: Snapshot, *, name: str) -> CondaSpec:
    """GOOD's conda packages and the pip/uv-installed dists beside them."""
    packages = good.conda
    pip = tuple(line for d in sorted(good.packages, key=lambda d: d.name)
                if d.installer not in (None, "conda")
                for line in (requirement_for(d)[0],) if line and not line.startswith("-e "))
    platform = _platform(packages)
    return CondaSpec(
        explicit=explicit_text(packages, platform),
        environment_yml=environment_yml(packages, pip, name),
        pip_requirements=pip,
        left_out=tuple(sorted(p.name for p in packages if not _usable_url(p))),
        platform=platform)


def find_tools(env: Mapping[str, str] = os.environ) -> list[tuple[str, str]]:
    """(name, path) of micromamba, mamba and conda: on PATH, or named by ``MAMBA_EXE`` /
    ``CONDA_EXE`` as their shell hooks set them."""
    found: list[tuple[str, str]] = []
    for tool in TOOLS:
        path = shutil.which(tool, path=env.get("PATH"))
        hinted = env.get("MAMBA_EXE" if tool == "micromamba" else "CONDA_EXE" if
                         tool == "conda" else "")
        if path is None and hinted and os.path.basename(hinted) == tool \
                and os.access(hinted, os.X_OK):
            path = hinted
        if path:
            found.append((tool, path))
    return found


def create_command(path: str, prefix: str, explicit_file: str) -> list[str]:
    """The command that creates ``prefix`` from the explicit spec (the same flags for
    micromamba, mamba and conda); both paths must be absolute (UnsafeValue, exit 2)."""
    return conda_create(path, prefix, explicit_file)


def conda_differences(good: Sequence[CondaPackage], new: Sequence[CondaPackage]) -> list[str]:
    """GOOD's conda packages that the new prefix lacks or holds in another version or
    build, and the ones it has that GOOD has not."""
    want = {p.name: p for p in good}
    have = {p.name: p for p in new}
    out = []
    for name in sorted(want.keys() | have.keys()):
        g, n = want.get(name), have.get(name)
        if n is None and g is not None:
            out.append(f"{name} {g.version} {g.build}: missing")
        elif g is None and n is not None:
            out.append(f"{name} {n.version} {n.build}: not in GOOD")
        elif g is not None and n is not None and (g.version, g.build) != (n.version, n.build):
            out.append(f"{name}: {n.version} {n.build}, GOOD had {g.version} {g.build}")
    return out


def shown_commands(prefix: str, explicit_file: str, yml_file: str) -> tuple[str, ...]:
    """What to run by hand where no tool was found (or to do it elsewhere): the commands
    :func:`create_command` runs, quoted for the shell."""
    return (shell_line(create_command("micromamba", prefix, explicit_file)),
            shell_line(create_command("conda", prefix, explicit_file)),
            shell_line(["pixi", "init", "--import", yml_file]) + "  (then pixi install)")
