"""Corpus cases about installed packages: extensions built for another torch, pins nobody
honoured, inference stacks that replaced torch (docs/CASES.md, cases 1-9).

Versions are the ones the reports name; CUDA builds are those of the index the report
installed from (PyPI's torch 2.4.1 is a CUDA 12.1 build, its 2.5.1 a CUDA 12.4 build, ...).
"""

from __future__ import annotations

from pathlib import Path

from tests.cases.conftest import PLATFORM_TAG, World

TORCH_OLDER = "extension-built-for-other-torch"
UNMET = "requirements-unsatisfied"
FOREIGN = "foreign-stack-installed"
STALE = "compile-cache-stale"
"""In a diff where torch changed: the warm compile cache each case starts with was filled
under the old build, and every entry of it now misses."""


def test_case_01_torchvision_pinned_to_the_torch_it_was_built_for(world: World) -> None:
    """2kpr/ComfyUI-PMRF#11: torch went from 2.4.1 to 2.5.1 under torchvision 0.19.1."""
    s = world.shop
    env = world.venv(s.torch("2.4.1", "12.1"),
                     s.wheel("torchvision", "0.19.1", requires=("torch==2.4.1",), compiled=True))
    good = world.snapshot(env, "good")
    world.install(env, s.torch("2.5.1", "12.4"))
    bad = world.snapshot(env, "bad")

    symptom = ("torchvision 0.19.1 requires torch==2.4.1, but you have torch 2.5.1 which is "
               "incompatible.")
    doctor = world.doctor(env, symptom)
    assert set(doctor.rules) == {TORCH_OLDER, UNMET}
    assert doctor.first == UNMET  # pip's own words: "requires"
    assert "torchvision 0.19.1 pins torch==2.4.1" in doctor.evidence(TORCH_OLDER)
    assert set(world.diff(good, bad).rules) == {"torch-version-changed", "cuda-build-changed",
                                               STALE}


def test_case_02_companions_left_at_torch_1_8_1(world: World) -> None:
    """MicrosoftDocs/pytorchfundamentals#23: torchvision 0.9.1 and torchaudio 0.8.1 (both
    pinned to torch 1.8.1) beside torch 1.11.0."""
    s = world.shop
    env = world.venv(
        s.torch("1.11.0", "10.2"),
        s.wheel("torchvision", "0.9.1", requires=("torch==1.8.1",), compiled=True),
        s.wheel("torchaudio", "0.8.1", requires=("torch==1.8.1",), compiled=True))
    doctor = world.doctor(env, "ERROR: torchvision 0.9.1 has requirement torch==1.8.1, but "
                               "you'll have torch 1.11.0 which is incompatible.")
    assert doctor.rules == [TORCH_OLDER, UNMET]
    assert "torchaudio 0.8.1 pins torch==1.8.1" in doctor.evidence(TORCH_OLDER)


def test_case_03_nightly_torchvision_pinned_to_the_previous_nightly(world: World) -> None:
    """pytorch/pytorch#40013: nightlies one day apart (pre-release versions)."""
    s = world.shop
    env = world.venv(
        s.torch("1.6.0.dev20200610", None),
        s.wheel("torchvision", "0.7.0.dev20200610", requires=("torch==1.6.0.dev20200609",),
                compiled=True))
    doctor = world.doctor(env, "ERROR: torchvision 0.7.0.dev20200610 has requirement "
                               "torch==1.6.0.dev20200609, but you'll have torch "
                               "1.6.0.dev20200610 which is incompatible.")
    assert doctor.rules == [TORCH_OLDER, UNMET]


def test_case_04_torch_scatter_wheel_labelled_for_torch_2_0(world: World) -> None:
    """rusty1s/pytorch_scatter#414: torch-scatter 2.1.2+pt20cu118 under torch 2.1.1+cu118."""
    s = world.shop
    env = world.venv(s.torch("2.1.1+cu118", "11.8"),
                     s.wheel("torch-scatter", "2.1.2+pt20cu118", compiled=True))
    doctor = world.doctor(env, "OSError: /home/iplslam/EEG_Classification/.venv/lib/"
                               "python3.10/site-packages/torch_scatter/_scatter_cuda.so: "
                               "undefined symbol: _ZN5torch8autograd13_wrap_outputs")
    assert doctor.rules == [TORCH_OLDER]
    assert "its version label names torch 2.0" in doctor.evidence(TORCH_OLDER)


def test_case_05_xformers_install_replaced_torch(world: World) -> None:
    """facebookresearch/xformers#752: `pip install xformers==0.0.19` uninstalled torch
    2.0.1+cu118 for PyPI's torch 2.0.0 (CUDA 11.7), leaving torchvision/torchaudio pinned to
    2.0.1. The report lists no error line; it shows the install log."""
    s = world.shop
    env = world.venv(
        s.torch("2.0.1+cu118", "11.8"),
        s.wheel("torchvision", "0.15.2+cu118", requires=("torch==2.0.1",), compiled=True),
        s.wheel("torchaudio", "2.0.2+cu118", requires=("torch==2.0.1",), compiled=True))
    good = world.snapshot(env, "good")
    world.install(env, s.torch("2.0.0", "11.7"),
                  s.wheel("xformers", "0.0.19", requires=("torch==2.0.0",), compiled=True))
    bad = world.snapshot(env, "bad")

    assert world.doctor(env).rules == [TORCH_OLDER, UNMET, FOREIGN]
    diff = world.diff(good, bad)
    assert set(diff.rules) == {FOREIGN, "torch-version-changed", "cuda-build-changed", STALE}


def test_case_06_vllm_install_replaced_a_cu130_torch(world: World) -> None:
    """vllm-project/vllm#34224: `pip install vllm==0.15.1` replaced torch 2.10.0+cu130 (and
    its torchvision/torchaudio) with torch 2.9.1, a CUDA 12.8 build. pip removes only what
    it replaces: the CUDA 13 library wheels of the old torch stay beside the CUDA 12 ones the
    new torch brings (the report shows the torch lines of the log; two library wheels per
    family stand for the rest)."""
    s = world.shop
    env = world.venv(
        s.torch("2.10.0+cu130", "13.0"),
        s.wheel("torchvision", "0.25.0+cu130", requires=("torch==2.10.0",), compiled=True),
        s.wheel("torchaudio", "2.10.0+cu130", requires=("torch==2.10.0",), compiled=True),
        s.cuda_wheel("nvidia-cublas", "13.0.0.19", "libcublas.so.13"),
        s.cuda_wheel("nvidia-nccl-cu13", "2.27.7", "libnccl.so.2"))
    good = world.snapshot(env, "good")
    world.install(
        env, s.torch("2.9.1", "12.8"),
        s.wheel("torchvision", "0.24.1", requires=("torch==2.9.1",), compiled=True),
        s.wheel("torchaudio", "2.9.1", requires=("torch==2.9.1",), compiled=True),
        s.wheel("vllm", "0.15.1", requires=("torch==2.9.1",), compiled=True),
        s.cuda_wheel("nvidia-cublas-cu12", "12.8.4.1", "libcublas.so.12"),
        s.cuda_wheel("nvidia-nccl-cu12", "2.27.5", "libnccl.so.2"))
    bad = world.snapshot(env, "bad")

    assert world.doctor(env).rules == ["cuda-wheels-mixed", FOREIGN]
    diff = world.diff(good, bad)
    assert set(diff.rules) == {FOREIGN, "torch-version-changed", "cuda-build-changed", STALE,
                               "package-version-changed", "package-added"}


def _flash_attn_release_wheel(world: World, label: str) -> Path:
    """flash-attn as its GitHub release wheels are built: the file name carries
    ``+cu122torch2.2cxx11abiFALSE``, the metadata only ``2.5.7`` (Dao-AILab/flash-attention
    #1444, and the rename step in its .github/workflows/_build.yml)."""
    return world.shop.wheel(
        "flash-attn", "2.5.7", requires=("torch",), compiled=True,
        filename=f"flash_attn-2.5.7+{label}-{PLATFORM_TAG}.whl")


def test_case_07_vllm_moved_torch_under_flash_attn(world: World) -> None:
    """Dao-AILab/flash-attention#954: installing vLLM 0.4.2 moved torch to 2.3.0; the
    flash-attn built for torch 2.2 then failed to import. The doctor names flash-attn (from
    the wheel file it was installed from, see the next test) and vLLM; the diff's
    torch-version-changed says what moved."""
    s = world.shop
    env = world.venv(s.torch("2.2.2", "12.1"),
                     _flash_attn_release_wheel(world, "cu122torch2.2cxx11abiFALSE"))
    good = world.snapshot(env, "good")
    world.install(env, s.torch("2.3.0", "12.1"),
                  s.wheel("vllm", "0.4.2", requires=("torch==2.3.0",), compiled=True))
    bad = world.snapshot(env, "bad")

    symptom = "undefined symbol: _ZN3c104cuda9SetDeviceEi"
    assert world.doctor(env, symptom).rules == [TORCH_OLDER, FOREIGN]
    diff = world.diff(good, bad, symptom)
    assert set(diff.rules) == {FOREIGN, "torch-version-changed", STALE}
    assert diff.first == "torch-version-changed"


# Found by this corpus and fixed: flash-attn's release wheels carry the torch they were
# built for only in the file name; the installed METADATA says "2.5.7". The rule now also
# reads the wheel file name kept in direct_url.json.
def test_case_07b_flash_attn_release_wheel_for_another_torch_is_named(world: World) -> None:
    s = world.shop
    env = world.venv(s.torch("2.3.0", "12.1"),
                     _flash_attn_release_wheel(world, "cu122torch2.2cxx11abiFALSE"))
    assert TORCH_OLDER in world.doctor(env).rules


def test_case_08_cpu_torch_under_xformers_built_for_cu121(world: World) -> None:
    """invoke-ai/InvokeAI#5065: an update replaced torch 2.1.0+cu121 with 2.1.0+cpu; xformers
    (built for the CUDA build) stopped loading and generation ran on the CPU."""
    s = world.shop
    # Stand-in nvidia-smi: the reporter's machine has an NVIDIA GPU ("GPU: cuda"); its model
    # and driver are not in the report (any driver new enough for CUDA 12.1 will do).
    world.gpus("0, NVIDIA GPU, 24576, 545.29.06, 8.6")
    env = world.venv(s.torch("2.1.0+cu121", "12.1"),
                     s.wheel("xformers", "0.0.22.post7", requires=("torch==2.1.0",),
                             compiled=True))
    good = world.snapshot(env, "good")
    world.install(env, s.torch("2.1.0+cpu", None))
    bad = world.snapshot(env, "bad")

    symptom = ("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built "
               "for: PyTorch 2.1.0+cu121 with CUDA 1201 (you have 2.1.0+cpu)")
    doctor = world.doctor(env, symptom)
    assert doctor.rules == ["torch-cpu-build-on-gpu-host", FOREIGN]
    diff = world.diff(good, bad, symptom)
    assert set(diff.rules) == {"cuda-build-changed", "torch-version-changed", STALE}
    assert diff.first == "cuda-build-changed"


def test_case_09_sdnext_cpu_torch_on_a_gpu_host(world: World) -> None:
    """vladmandic/sdnext#4232: torch 2.8.0 from PyPI on Windows is a CPU build; the GPU sat
    unused until torch was reinstalled from the cu121 index."""
    s = world.shop
    # Stand-in nvidia-smi: the report has a CUDA GPU but names neither it nor the driver.
    world.gpus("0, NVIDIA GPU, 12282, 566.36, 8.9")
    env = world.venv(s.torch("2.8.0", None),
                     s.wheel("torchvision", "0.23.0", requires=("torch==2.8.0",), compiled=True))
    doctor = world.doctor(env, "GPU stats: Torch not compiled with CUDA enabled")
    assert doctor.rules == ["torch-cpu-build-on-gpu-host"]
