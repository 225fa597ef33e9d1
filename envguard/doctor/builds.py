"""Doctor rules about how installed distributions were built and what they state about
themselves, one environment alone: a torch companion built for another CUDA variant than
torch's (its version label, or its own ``version.py``), a binary package built here from
its source where the index ships a ready-made (manylinux) wheel, and a jaxlib older than
the installed jax says it accepts (``jax/version.py``)."""

from __future__ import annotations

from collections.abc import Iterator

from envguard.doctor.interface import DoctorRule, Scene
from envguard.explain.interface import Finding, Severity
from envguard.explain.queries import built_here
from envguard.explain.remedies import build_label, pytorch_index, remedy, uv_pip_install
from envguard.explain.tables import TORCH_COMPANIONS
from envguard.model import Distribution


def _cuda_label(cuda: str) -> str:
    """``12.8`` (a ``version.cuda``) as the variant label ``cu128``."""
    return "cu" + cuda.replace(".", "")


def _family(v: str) -> str:
    """``cu12`` for ``cu128``, ``cu13`` for ``cu130``: the CUDA major, or ``cpu``."""
    return v[:4] if v.startswith("cu") and len(v) == 5 else v[:3] if v.startswith("cu") else v


def companion_variant_differs(scene: Scene) -> Iterator[Finding]:
    snap = scene.snapshot
    torch = snap.package("torch")
    if torch is None:
        return
    mine = build_label(torch.version)
    if mine is None and snap.torch.present and not snap.torch.hip:
        mine = _cuda_label(snap.torch.cuda) if snap.torch.cuda else "cpu"
    if mine is None:
        return
    odd: list[tuple[Distribution, str]] = []
    for dist in snap.packages:
        stated = dist.stated.get("cuda")  # torchvision/version.py's cuda = "12.8"
        theirs = build_label(dist.version) or (_cuda_label(stated) if stated else None)
        if dist.name in TORCH_COMPANIONS and theirs and _family(theirs) != _family(mine):
            odd.append((dist, theirs))
    if not odd:
        return
    names = [d.name for d, _ in odd]
    yield Finding(
        rule="companion-variant-differs", severity=Severity.CRITICAL,
        title=f"{', '.join(f'{d.name} {d.version}' for d, _ in odd)} built for "
              f"{odd[0][1]}, torch {torch.version} is {mine}",
        explanation="torch's companions link its libraries: one built for another CUDA "
                    "variant (a CUDA torchvision beside a CPU torch, cu12 beside cu13) fails "
                    "to load its operators (`operator torchvision::nms does not exist`, "
                    "`undefined symbol`), although every version requirement is met.",
        evidence=(*(f"{d.name} {d.version}: {v}" for d, v in odd),
                  f"torch {torch.version}: {mine}"),
        remedy=(remedy(lambda: uv_pip_install(names, reinstall=True,
                                              index_url=pytorch_index(mine)),
            f"reinstall them from the index that serves torch's {mine} build: "),),
        weight=92, keywords=("operator torchvision::nms does not exist", "undefined symbol",
                             *names))


def built_here_from_source(scene: Scene) -> Iterator[Finding]:
    built = [d for d in scene.snapshot.packages if built_here(d) and not d.editable]
    if not built:
        return
    names = [d.name for d in built]
    yield Finding(
        rule="built-here-from-source", severity=Severity.INFO,
        title=f"built here from source, not the index's wheel: {', '.join(names[:5])}"
              + (" …" if len(names) > 5 else ""),
        explanation="A binary package built on this machine from its sdist (its wheel tag "
                    "is the bare linux_*, which no index serves) may lack the optional "
                    "compiled parts the published wheel has: PyYAML without libyaml has no "
                    "CLoader, others fall back to slow pure-Python code or miss a feature.",
        evidence=tuple(f"{d.name} {d.version}: wheel tag {', '.join(d.wheel_tags)}"
                       + (f" (built by {d.wheel_generator})" if d.wheel_generator else "")
                       for d in built[:10]),
        remedy=(remedy(lambda: uv_pip_install([f"{d.name}=={d.version}" for d in built[:10]
                                               if d.version], reinstall=True,
                                              options=("--only-binary", ":all:")),
                       "install the index's wheels instead: "),),
        weight=70, keywords=("cannot import name 'CLoader'", "CSafeLoader", *names))


def jaxlib_older_than_jax_accepts(scene: Scene) -> Iterator[Finding]:
    from packaging.version import InvalidVersion, Version

    jax, jaxlib = scene.snapshot.package("jax"), scene.snapshot.package("jaxlib")
    floor = jax.stated.get("_minimum_jaxlib_version") if jax else None
    if jax is None or jaxlib is None or not floor or not jaxlib.version:
        return
    try:
        if Version(jaxlib.version) >= Version(floor):
            return
    except InvalidVersion:
        return
    yield Finding(
        rule="jaxlib-older-than-jax-accepts", severity=Severity.CRITICAL,
        title=f"jaxlib {jaxlib.version} is older than jax {jax.version} accepts ({floor})",
        explanation="jax states the oldest jaxlib it works with in jax/version.py "
                    "(_minimum_jaxlib_version) and refuses an older one at import; pip's "
                    "metadata does not always say so.",
        evidence=(f"jax {jax.version}: _minimum_jaxlib_version = {floor!r}",
                  f"installed: jaxlib {jaxlib.version}"),
        remedy=(remedy(lambda: uv_pip_install([f"jaxlib>={floor}"]), "upgrade jaxlib: "),
                remedy(lambda: uv_pip_install([f"jax=={jax.version}", f"jaxlib>={floor}"]),
                       "or both together: ")),
        weight=93, keywords=("jaxlib", "is version", "but this version of jax requires"))


RULES = (
    DoctorRule(id="jaxlib-older-than-jax-accepts",
               title="a jaxlib older than the installed jax accepts",
               check=jaxlib_older_than_jax_accepts),
    DoctorRule(id="companion-variant-differs",
               title="a torch companion built for another CUDA variant",
               check=companion_variant_differs),
    DoctorRule(id="built-here-from-source", title="a binary package built from source here",
               check=built_here_from_source),
)
