"""Doctor rules about CUDA: wheel families, the driver, libraries loaded from elsewhere,
and a CPU torch on a GPU host."""

from __future__ import annotations

from collections.abc import Iterator

from envguard.doctor.interface import DoctorRule, Scene
from envguard.explain.queries import conda_cuda_families
from envguard.explain.remedies import index_url_for, remedy, uv_pip_install
from envguard.findings import Finding, Severity

MIN_DRIVER: dict[tuple[int, int], str] = {
    (11, 8): "520.61.05", (12, 0): "525.60.13", (12, 1): "530.30.02",
    (12, 2): "535.54.03", (12, 3): "545.23.06", (12, 4): "550.54.14",
    (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
    (12, 9): "575.51.03", (13, 0): "580.65.06",
}
"""The Linux driver each CUDA toolkit release needs for all its features (NVIDIA's CUDA
Toolkit release notes, table 3 "CUDA Toolkit and Corresponding Driver Versions", GA
releases). Kept as data: add a row when a toolkit ships."""
MIN_DRIVER_MAJOR: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
"""The oldest driver that runs anything of a CUDA major at all, through minor version
compatibility (same table, "minimum required driver version")."""


def _driver(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _cuda(scene: Scene) -> tuple[int, int] | None:
    cuda = scene.snapshot.torch.cuda
    if not cuda:
        return None
    parts = [p for p in cuda.split(".") if p.isdigit()]
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else None


def _family(wheel: str) -> str:
    """``cu12`` for nvidia-cublas-cu12, ``cu11``, ..., ``cu13`` for the unsuffixed
    CUDA 13 wheels (nvidia-cublas, cuda-toolkit)."""
    name = wheel.split("==")[0]
    suffix = name.rsplit("-", 1)[-1]
    return suffix if suffix.startswith("cu") and suffix[2:].isdigit() else "cu13"


def cuda_wheels_mixed(scene: Scene) -> Iterator[Finding]:
    torch = scene.snapshot.torch
    families: dict[str, list[str]] = {}
    for wheel in torch.cuda_wheels:
        families.setdefault(_family(wheel), []).append(wheel)
    for family, found in conda_cuda_families(scene.snapshot).items():
        families.setdefault(family, []).extend(found)
    if torch.cuda_wheel_family != "mixed" and len(families) < 2:
        return
    names = sorted(families)
    yield Finding(
        rule="cuda-wheels-mixed", severity=Severity.CRITICAL,
        title=f"CUDA wheel families {' and '.join(names)} are installed side by side",
        explanation="NVIDIA's CUDA libraries come as pip wheels, suffixed -cu11 and -cu12 "
                    "for CUDA 11 and 12 and unsuffixed (or cuda-toolkit) for CUDA 13, and as "
                    "conda packages (cudatoolkit, cuda-runtime, libcublas, ...). An "
                    "environment that holds two majors loads whichever its packages find "
                    "first: "
                    "libraries of two majors in one process fail with `cannot open shared "
                    "object file`, symbol errors or CUBLAS_STATUS errors.",
        evidence=(*(f"{family} wheels: {', '.join(families[family][:6])}"
                    for family in names),
                  f"torch {torch.version} is built for CUDA {torch.cuda or '?'}"),
        remedy=("uninstall the families torch does not use (e.g. the -cu12 wheels for a "
                "CUDA 13 torch)",
                "or rebuild the venv from one index: " + (index_url_for(torch.version) or
                                                        "https://download.pytorch.org/whl/")),
        weight=88, keywords=("libcudnn", "libcublas", "cannot open shared object",
                             "CUBLAS_STATUS", "undefined symbol"))


def cuda_driver_too_old(scene: Scene) -> Iterator[Finding]:
    cuda = _cuda(scene)
    driver = scene.snapshot.system.driver_version
    if cuda is None or not driver:
        return
    have = _driver(driver)
    floor = MIN_DRIVER_MAJOR.get(cuda[0])
    full = MIN_DRIVER.get(cuda) or max(
        (v for k, v in MIN_DRIVER.items() if k[0] == cuda[0] and k <= cuda),
        key=_driver, default=None)
    torch = scene.snapshot.torch
    if floor is not None and have < _driver(floor):
        severity, need = Severity.CRITICAL, floor
        why = (f"CUDA {cuda[0]}.x needs driver {floor} or newer even with minor version "
               "compatibility: torch.cuda.is_available() is False and the first CUDA call "
               "fails ('driver version is insufficient')")
    elif full is not None and have < _driver(full):
        severity, need = Severity.WARNING, full
        why = (f"CUDA {cuda[0]}.{cuda[1]} wants driver {full}; older {cuda[0]}.x drivers run "
               "it through minor version compatibility, but PTX JIT (triton and "
               "torch.compile kernels for GPUs the wheel has no code for) and newer APIs fail")
    else:
        return
    yield Finding(
        rule="cuda-driver-too-old", severity=severity,
        title=f"the NVIDIA driver {driver} is older than torch's CUDA {torch.cuda} needs "
              f"({need})",
        explanation=why + ".",
        evidence=(f"torch {torch.version}: CUDA {torch.cuda}", f"nvidia-smi: driver {driver}",
                  f"needed: {need} (NVIDIA's CUDA toolkit/driver table, kept in "
                  "envguard/doctor/cuda.py)"),
        remedy=(f"upgrade the driver to {need} or newer",
                f"or install a torch built for an older CUDA (e.g. "
                f"{index_url_for((torch.version or '').split('+')[0] + '+cu126') or ''})"),
        weight=95, keywords=("driver version is insufficient", "CUDA driver",
                             "cudaGetDeviceCount", "is_available"))


def _torch_cudnn_major(scene: Scene) -> int | None:
    for name in ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn"):
        dist = scene.snapshot.package(name)
        if dist is not None and dist.version and dist.version.split(".")[0].isdigit():
            return int(dist.version.split(".")[0])
    return None


def cuda_library_shadowed(scene: Scene) -> Iterator[Finding]:
    cuda = _cuda(scene)
    if cuda is None or not scene.libraries:
        return
    own = {"cudart": cuda[0], "cublas": cuda[0], "cublasLt": cuda[0], "cusparse": cuda[0],
           "cusolver": cuda[0], "nvrtc": cuda[0], "nvJitLink": cuda[0], "cupti": cuda[0],
           "nccl": 2, "cudnn": _torch_cudnn_major(scene)}
    # A copy with torch's own soname (same major, or no major to tell) is what the loader
    # takes instead of torch's: critical. Another major has another soname and replaces
    # nothing of torch's, but an extension asking for that major gets it: a warning.
    other = [c for c in scene.libraries if c.major is not None
             and own.get(c.library) is not None and c.major != own[c.library]]
    same = [c for c in scene.libraries if c not in other]
    if not other and not same:
        return
    severity = Severity.CRITICAL if same else Severity.WARNING
    shown = [*same, *other][:6]
    title = (f"{shown[0].variable} puts {shown[0].file} ahead of torch's own copy: it is "
             "loaded instead" if same else
             f"{shown[0].variable} puts CUDA libraries of another major ({shown[0].file}) "
             f"ahead of torch's own CUDA {cuda[0]}")
    yield Finding(
        rule="cuda-library-shadowed", severity=severity, title=title,
        explanation="torch's wheels find their CUDA libraries in the nvidia-* wheels through "
                    "their RUNPATH, which the dynamic loader searches after LD_LIBRARY_PATH "
                    "(and LD_PRELOAD loads before everything). A library there with the same "
                    "soname as torch's own (libcudnn.so.9, libcublas.so.12) is loaded "
                    "instead of it: an older minor version fails with undefined symbols or "
                    "CUBLAS/CUDNN_STATUS errors, a newer one silently replaces what torch was "
                    "tested with. One of another major replaces nothing of torch's, but "
                    "extensions built for that major load it.",
        evidence=tuple(f"{c.variable}: {c.folder}/{c.file}" + (
            f" (torch's is {c.library} {own.get(c.library)})" if c in other else "")
            for c in shown),
        remedy=("unset LD_PRELOAD, or remove those folders from LD_LIBRARY_PATH for the "
                "training job (a module load or an activation script often adds them)",),
        weight=85, keywords=("libcudnn", "libcublas", "libcudart", "libnccl", "CUDNN_STATUS",
                             "cannot open shared object", "undefined symbol"))


def torch_cpu_build_on_gpu_host(scene: Scene) -> Iterator[Finding]:
    torch = scene.snapshot.torch
    gpus = scene.snapshot.system.gpus
    if not torch.present or torch.cuda or torch.hip or not gpus:
        return
    yield Finding(
        rule="torch-cpu-build-on-gpu-host", severity=Severity.CRITICAL,
        title=f"torch {torch.version} is a CPU build, and this host has "
              f"{len(gpus)} NVIDIA GPU(s)",
        explanation="A CPU wheel of torch (PyPI's default on some platforms, or the +cpu "
                    "index) has no CUDA: torch.cuda.is_available() is False and training runs "
                    "on the CPU, or stops at the first .cuda().",
        evidence=(f"torch {torch.version}: version.cuda is None", "GPUs: "
                  + ", ".join(sorted({g.name for g in gpus}))),
        remedy=(remedy(lambda: uv_pip_install(["torch"], reinstall=True,
                                              index_url="https://download.pytorch.org/whl/cu128"),
                       suffix="  (pick the CUDA your driver supports)"),),
        weight=96, keywords=("Torch not compiled with CUDA enabled", "is_available",
                             "no CUDA GPUs", "cuda"))


RULES = (
    DoctorRule(id="cuda-wheels-mixed", title="cu12 and cu13 wheels at once",
               check=cuda_wheels_mixed),
    DoctorRule(id="cuda-driver-too-old", title="driver older than torch's CUDA needs",
               check=cuda_driver_too_old),
    DoctorRule(id="cuda-library-shadowed", title="CUDA libraries loaded from elsewhere",
               check=cuda_library_shadowed),
    DoctorRule(id="torch-cpu-build-on-gpu-host", title="CPU torch on a GPU host",
               check=torch_cpu_build_on_gpu_host),
)
