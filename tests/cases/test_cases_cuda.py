"""Corpus cases about CUDA: two families of NVIDIA library wheels, a driver older than
torch's CUDA, CUDA libraries from LD_LIBRARY_PATH (docs/CASES.md, cases 10-17).

No GPU, driver or CUDA library exists on a test machine: ``nvidia-smi`` is a stand-in
script that prints what the reported driver printed, and an ``LD_LIBRARY_PATH`` folder holds
empty files named as the real libraries (the doctor reads names, never the libraries).
"""

from __future__ import annotations

import pytest

from tests.cases.conftest import World

MIXED = "cuda-wheels-mixed"
SHADOWED = "cuda-library-shadowed"
DRIVER = "cuda-driver-too-old"


def test_case_10_nccl_cu12_beside_nccl_cu13(world: World) -> None:
    """pytorch/pytorch#186591: importing a CUDA 13 torch failed; the maintainer pointed at
    nvidia-nccl-cu12 2.29.3 installed beside nvidia-nccl-cu13 2.29.7. (torch's version is
    not in the report; a cu130 build is the one nvidia-nccl-cu13 belongs to.)"""
    s = world.shop
    env = world.venv(s.torch("2.11.0+cu130", "13.0"),
                     s.cuda_wheel("nvidia-nccl-cu13", "2.29.7", "libnccl.so.2"),
                     s.cuda_wheel("nvidia-nccl-cu12", "2.29.3", "libnccl.so.2"))
    doctor = world.doctor(env, "Importing Pytorch results in undefined symbol ncclCommResume")
    assert doctor.rules == [MIXED]
    assert "nvidia-nccl-cu12==2.29.3" in doctor.evidence(MIXED)


def test_case_11_nccl_cu11_overwrote_nccl_cu12(world: World) -> None:
    """rwth-i6/returnn#1802: `import torch` failed in CI with an NCCL symbol missing; both
    nvidia-nccl-cu11 2.14.3 and nvidia-nccl-cu12 2.27.3 were installed. Both wheels write
    nvidia/nccl/lib/libnccl.so.2, and the loaded copy was the older one: the cu11 wheel was
    installed last. (torch's version is not in the report; 2.8.0 is the torch that pins
    nvidia-nccl-cu12 2.27.3.)"""
    s = world.shop
    env = world.venv(s.torch("2.8.0", "12.8"),
                     s.cuda_wheel("nvidia-nccl-cu12", "2.27.3", "libnccl.so.2"))
    world.install(env, s.cuda_wheel("nvidia-nccl-cu11", "2.14.3", "libnccl.so.2"))
    doctor = world.doctor(env, "ImportError: /home/runner/.local/lib/python3.10/site-packages/"
                               "torch/lib/libtorch_cuda.so: undefined symbol: ncclMemFree")
    assert doctor.rules == [MIXED, "installed-files-modified"]
    # The overwritten file is named: nvidia-nccl-cu12's libnccl.so.2 is not its own any more.
    assert "nvidia/nccl/lib/libnccl.so.2" in doctor.evidence("installed-files-modified")
    # WORDING (reported, rule unchanged): the finding's title says "CUDA 12 and CUDA 13
    # wheels are installed side by side" and its evidence lists nvidia-nccl-cu11 under "CUDA
    # 13 wheels": cuda_wheels_mixed splits the wheels by "cu12" in the name or not. The rule
    # id is right; the text should say CUDA 11 and CUDA 12 here.
    assert "nvidia-nccl-cu11==2.14.3" in doctor.evidence(MIXED)


def test_case_12_driver_515_under_a_cuda_12_torch(world: World) -> None:
    """RVC-Boss/GPT-SoVITS#1048: Tesla M40, driver 515.105.01 (CUDA 11.7); torch 2.1.1 from
    PyPI (a CUDA 12.1 build) through the project's install.sh. The failing call in the report
    is faster-whisper's, whose CUDA 12 runtime needs the same newer driver."""
    s = world.shop
    # Stand-in nvidia-smi: the reported GPU and driver.
    world.gpus("0, Tesla M40, [N/A], 515.105.01, 5.2")
    env = world.venv(s.torch("2.1.1", "12.1"))
    doctor = world.doctor(env, "RuntimeError: CUDA failed with error CUDA driver version is "
                               "insufficient for CUDA runtime version")
    assert doctor.rules == [DRIVER]
    assert doctor.document["findings"][0]["severity"] == "critical"  # 515 < 525.60.13


# Found by this corpus and fixed: drivers before 510 reject the compute_cap field, and the
# 4-field answer of the retry was dropped; the probe now reads rows of either query.
def test_case_13_driver_470_rejects_the_compute_cap_query(world: World) -> None:
    """lllyasviel/Fooocus#1313: RTX 3050 Laptop GPU, driver 470.86 (CUDA 11.4); torch failed
    with "driver too old". The report does not give torch's version; the case uses a CUDA
    12.1 build (the driver's CUDA is older than any CUDA 12 torch)."""
    s = world.shop
    world.gpus("0, NVIDIA GeForce RTX 3050 Laptop GPU, 4096, 470.86, 8.6",
               rejects_compute_cap=True)
    env = world.venv(s.torch("2.1.0+cu121", "12.1"))
    doctor = world.doctor(env, "RuntimeError: The NVIDIA driver on your system is too old "
                               "(found version 11040).")
    assert doctor.rules == [DRIVER]


SHADOW_CASES = [
    pytest.param(
        ("1.12.0+cu113", "11.3"),
        {"public/apps/cudnn/v8.0.3.33-cuda.11.0/cuda/lib64": ("libcudnn.so.8",
                                                              "libcudnn.so.8.0.3"),
         "public/apps/cuda/11.0/lib64": ("libcudart.so.11.0", "libcublas.so.11")},
        "RuntimeError: cuDNN version incompatibility: PyTorch was compiled against (8, 3, 2) "
        "but linked against (8, 0, 3)",
        id="14-pytorch-80637-module-cudnn-8.0.3"),
    pytest.param(
        ("2.0.1+cu118", "11.8"),
        {"cudnn-8.2.4/lib64": ("libcudnn.so.8", "libcudnn.so.8.2.4")},
        "ERROR Could not load torch: cuDNN version incompatibility: PyTorch was compiled  "
        "against (8, 7, 0) but found runtime version (8, 2, 4).",
        id="15-kohya-1096-sudo-kept-ld-library-path"),
    pytest.param(
        ("2.5.1", "12.4"),
        {"usr/local/cuda-12.1/lib64": ("libcudart.so.12", "libcublas.so.12",
                                       "libcusparse.so.12", "libnvJitLink.so.12")},
        "ImportError: /home/mit/kxyRAG/ragflow/.venv/lib/python3.12/site-packages/torch/lib/"
        "../../nvidia/cusparse/lib/libcusparse.so.12: undefined symbol: __nvJitLinkAddData_12_1,"
        " version libnvJitLink.so.12",
        id="16-ragflow-4466-cuda-12.1-toolkit"),
]


@pytest.mark.parametrize(("torch", "folders", "symptom"), SHADOW_CASES)
def test_case_14_to_16_ld_library_path_puts_system_cuda_first(
        world: World, torch: tuple[str, str], folders: dict[str, tuple[str, ...]],
        symptom: str) -> None:
    """14 pytorch/pytorch#80637: a cluster module put cuDNN 8.0.3 on LD_LIBRARY_PATH; torch
    1.12.0+cu113 bundles cuDNN 8.3.2. 15 bmaltais/kohya_ss#1096: sudo kept an LD_LIBRARY_PATH
    with cuDNN 8.2.4 for torch 2.0.1+cu118 (cuDNN 8.7.0); the report does not name the folder.
    16 infiniflow/ragflow#4466: LD_LIBRARY_PATH=/usr/local/cuda-12.1/lib64 resolved
    libnvJitLink.so.12 from the toolkit for the wheel's cuSPARSE (torch's version is not in
    the report; the case uses PyPI's 2.5.1, a CUDA 12.4 build)."""
    env = world.venv(world.shop.torch(*torch))
    path = ":".join(str(world.libraries(f, *names)) for f, names in folders.items())
    doctor = world.doctor(env, symptom, {"LD_LIBRARY_PATH": path})
    assert doctor.rules == [SHADOWED]
    # Same soname as torch's own: it is loaded instead of torch's, critical. These are the
    # reports where it broke (the corpus showed the severities the wrong way round).
    assert doctor.document["findings"][0]["severity"] == "critical"


# Found by this corpus and fixed: libnvJitLink (the library of the most common cuSPARSE
# failure) is now among the watched libraries.
def test_case_17_ld_library_path_with_only_nvjitlink(world: World) -> None:
    """pytorch/pytorch#134929 (Kaggle): LD_LIBRARY_PATH=/opt/conda/lib prepended, then
    libcusparse.so.12 failed on an nvJitLink symbol. The folder's other contents are not in
    the report; the case keeps the one library the error names."""
    env = world.venv(world.shop.torch("2.4.0", "12.1"))
    folder = world.libraries("opt/conda/lib", "libnvJitLink.so.12")
    doctor = world.doctor(env, "libcusparse.so.12: undefined symbol: __nvJitLinkComplete_12_4, "
                               "version libnvJitLink.so.12", {"LD_LIBRARY_PATH": str(folder)})
    assert doctor.rules == [SHADOWED]
