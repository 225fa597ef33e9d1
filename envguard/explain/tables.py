"""What envguard knows about the ML Python world, as data: one copy of each table.

The diff rules, the doctor, the gate's lockfile, the probe and the command line all import
their tables from here; ``tests/envguard/explain/test_tables.py`` checks that no other
module keeps a copy (a name of this module assigned again, or a literal with the same members).

Importing this module is cheap (``re`` and ``os``; ``envguard.explain``
loads its rules only on first use): the gate in front of every launch reads
:data:`DEFAULT_FORBIDDEN` and :data:`CACHE_POLICIES` from it, and building the command
line's parser reads :data:`CACHE_POLICIES`. Regular expressions are compiled on first use
for the same reason.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "CACHE_POLICIES",
    "CA_BUNDLES",
    "COLD_REMEDY",
    "CONDA_CUDA",
    "CORE_PACKAGES",
    "CUDA_SUFFIX",
    "CUDA_WHEEL_PREFIXES",
    "DEFAULT_FORBIDDEN",
    "SERVING_STACKS",
    "TORCH_COMPANIONS",
    "TORCH_OWNED",
    "TRACKS_CUDA_MAJOR",
    "UNSUFFIXED_CUDA",
    "VERIFY_HASH_HINT",
    "ServingStack",
    "is_conda_core",
    "is_cuda_wheel",
    "is_lock_path",
    "is_serving_stack",
    "lock_glob",
]


# ------------------------------------------------------------------ serving stacks

ServingStack = tuple[str, bool, tuple[str, ...], bool]
"""A row of :data:`SERVING_STACKS`: (name, family, also, forbidden). Plain tuples, not
records: the gate imports this table before every launch."""


def lock_glob(stack: ServingStack) -> str:
    """The lock's pattern for a stack: ``NAME*`` for one with variants (a later variant is
    forbidden too), else ``NAME``."""
    name, family, also, _ = stack
    return name + ("*" if family or also else "")


def _pattern(stack: ServingStack) -> str:
    """The rules' regular expression for a stack: its exact names, no prefix match."""
    name, family, also, _ = stack
    return "|".join([re.escape(name) + ("(-.*)?" if family else ""),
                     *(re.escape(n) for n in also)])


SERVING_STACKS: tuple[ServingStack, ...] = (
    # name             family  also                          forbidden
    ("sglang",           True,  (),                           True),
    ("vllm",             True,  (),                           True),
    ("flashinfer",       True,  (),                           True),
    ("tilelang",         False, (),                           True),
    ("xformers",         False, (),                           True),
    ("tensorrt",         True,  (),                           True),
    ("lmdeploy",         False, (),                           True),
    ("sgl-kernel",       False, (),                           True),
    ("text-generation",  False, ("text-generation-server",),  True),
    ("exllamav2",        False, (),                           True),
    ("llama-cpp-python", False, (),                           True),
    ("mlc-llm",          True,  (),                           True),
    ("outlines",         False, ("outlines-core",),           False),
    ("xgrammar",         False, (),                           False),
    ("decord",           False, (),                           False),
    ("torchao",          False, (),                           False),
    ("triton-kernels",   False, (),                           False),
)
"""Serving and inference stacks, in the order a new lock lists them. Each pins its own
torch, CUDA wheels and triton and JIT-builds kernels against them.

Columns: the distribution's normalized name; ``family``, its ``NAME-...`` distributions
count too (sglang-router, vllm-flash-attn, tensorrt-llm); ``also``, other exact names that
count as this stack (text-generation-server, outlines-core); ``forbidden``, in the
``forbidden`` list of a new lock (:data:`DEFAULT_FORBIDDEN`).

One table for two uses that differ on purpose:

- the rules (``foreign-stack-installed`` in ``envguard diff`` and ``envguard doctor``, and
  the gate telling a lock's own ``forbidden`` patterns from these) match every row, by exact
  name (:func:`is_serving_stack`): they explain, they do not refuse;
- a new lock forbids only the rows marked ``forbidden``, by glob (``sglang*``: a renamed or
  later variant is refused too). outlines, xgrammar, decord, torchao and triton-kernels come
  with serving stacks but also serve training (structured generation in evaluation, torchao's
  float8 training, triton's kernel library), so a lock does not refuse them by default;
  a lock that wants to lists them in its ``forbidden``.

(The two lists were kept apart before, the rules' as one regular expression in
``envguard.explain.packages`` and the lock's as globs in ``envguard.gate.lockfile``; both
are derived from this table now and match exactly what they matched then.)"""

DEFAULT_FORBIDDEN: tuple[str, ...] = tuple(lock_glob(s) for s in SERVING_STACKS if s[3])
"""The ``forbidden`` patterns of a new lock (and of a lock that has no ``forbidden`` key)."""

_SERVING_RE: list[re.Pattern[str]] = []


def is_serving_stack(name: str) -> bool:
    """``name`` (a normalized distribution name) is one of :data:`SERVING_STACKS`."""
    if not _SERVING_RE:
        _SERVING_RE.append(re.compile(
            "^(" + "|".join(_pattern(s) for s in SERVING_STACKS) + ")$"))
    return _SERVING_RE[0].match(name) is not None


# ------------------------------------------------------------------ pip packages

CORE_PACKAGES = frozenset({
    "torch", "triton", "numpy", "transformers", "accelerate", "safetensors", "tokenizers",
    "huggingface-hub", "datasets", "sympy", "networkx", "jinja2", "fsspec", "filelock",
    "typing-extensions", "setuptools", "packaging"})
"""What the trainer imports directly: checked first when versions move (with torch's own
requirements and the CUDA wheels)."""

TORCH_OWNED = frozenset({"torch", "triton", "pytorch-triton"})

CA_BUNDLES = frozenset({"certifi/cacert.pem", "pip/_vendor/certifi/cacert.pem",
                        "botocore/cacert.pem", "requests/cacert.pem",
                        "httplib2/cacerts.txt", "grpc/_cython/_credentials/roots.pem"})
"""CA bundles inside site-packages that sites extend on purpose (their own root CA appended
in an image build): a grown bundle is a known, legitimate edit, and reinstalling the
package would drop the site's CA and break TLS."""

TORCH_COMPANIONS = frozenset({"torchvision", "torchaudio", "torchtext", "torchdata", "torchao",
                              "torchrec", "xformers", "torch-scatter", "torch-sparse",
                              "torch-cluster", "torch-spline-conv", "pyg-lib"})
"""Distributions built against one torch build, CUDA variant included: a ``+cu130``
torchvision beside a ``+cpu`` torch fails to load its ops."""
"""torch and the triton it pins: their builds move together (a rebuild of one is no news
about the others)."""


# ------------------------------------------------------------------ CUDA wheels

CUDA_WHEEL_PREFIXES = ("nvidia-", "cuda-")
"""Names of the distributions that carry CUDA libraries (pip's CUDA wheels)."""


def is_cuda_wheel(name: str) -> bool:
    return name.startswith(CUDA_WHEEL_PREFIXES)


CUDA_SUFFIX = re.compile(r"^nvidia-.+-cu(\d+)$")
"""CUDA 11 and 12 wheels carry their CUDA major as a suffix: ``nvidia-cublas-cu12``."""

TRACKS_CUDA_MAJOR = frozenset({
    "cuda-toolkit", "nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc",
    "nvidia-cuda-cupti", "nvidia-nvjitlink", "nvidia-nvtx", "nvidia-cuda-cccl",
    "nvidia-cuda-nvcc"})
"""CUDA 13 wheels dropped the ``-cuXX`` suffix. These unsuffixed names version with the CUDA
release, so their major is the CUDA major."""

UNSUFFIXED_CUDA = TRACKS_CUDA_MAJOR | frozenset({
    "nvidia-cufft", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse", "nvidia-cufile",
    "nvidia-npp", "nvidia-nvjpeg"})
"""Every unsuffixed CUDA wheel: the others (cufft 12.x, curand 10.x, ...) version on their
own and only say "CUDA 13 or later"."""


# ------------------------------------------------------------------ conda packages

_CONDA_CORE = (
    r"^(cuda(-.*)?|cudatoolkit|libcu\w*(-dev)?|cudnn|libcudnn\w*|nccl|libnccl|nvidia-.*|"
    r"mkl(-.*)?|intel-openmp|llvm-openmp|_openmp_mutex|libblas|libcblas|liblapack|blas|"
    r"openblas|libopenblas|gcc(_.*)?|gxx(_.*)?|libgcc(-ng)?|libstdcxx(-ng)?|clangxx|"
    r"pytorch(-.*)?|torch(vision|audio)?|magma(-.*)?|triton)$")
_CONDA_CORE_RE: list[re.Pattern[str]] = []


def is_conda_core(name: str) -> bool:
    """A conda package that changes kernels and linkage, not only Python code: CUDA, cuDNN,
    NCCL, MKL/BLAS, OpenMP, compilers and the pytorch package itself."""
    if not _CONDA_CORE_RE:
        _CONDA_CORE_RE.append(re.compile(_CONDA_CORE))
    return _CONDA_CORE_RE[0].match(name) is not None


CONDA_CUDA = frozenset({
    "cudatoolkit", "cuda-version", "cuda-runtime", "cuda-cudart", "cuda-libraries",
    "cuda-nvrtc", "cuda-nvcc", "libcublas", "libcusparse", "libcufft", "libcurand",
    "libcusolver", "libnvjitlink"})
"""Conda packages whose version starts with the CUDA version they carry."""


# ------------------------------------------------------------------ locks

CACHE_POLICIES = ("require-warm", "warn-if-cold", "ignore")
"""A lock's ``cache_policy``: what check and run do about a cold compile cache."""


def is_lock_path(text: str) -> bool:
    """A lock given on the command line or to the API is a path when it has a ``/`` (or the
    platform's separator) or ends in ``.toml``; else it is a lock's name, looked up in
    ``lockfiles/``."""
    return "/" in text or os.sep in text or text.endswith(".toml")


# ------------------------------------------------------------------ what envguard says

COLD_REMEDY = (
    "warm the cache single-threaded first: run one full training step (forward and backward, "
    "every bucketed shape) on the main thread before any worker thread or process starts",
    "or restore the cache you had: envguard cache restore (an archive made by envguard "
    "cache save under this build), or a torch.compiler.save_cache_artifacts() Mega-Cache "
    "loaded with load_cache_artifacts() before the first compile (dflash-train does this "
    "itself)",
    "dflash-train --warmup-only fills the cache in one process; then envguard cache save "
    "keeps a copy that survives the next cleanup of /tmp",
    "in threaded code, compile once before starting threads and then set "
    "torch.compiler.set_stance(\"fail_on_recompile\") so no thread compiles later",
    "best: one process per device (torchrun) instead of one thread per device; processes "
    "share no tracing state",
)
"""The remedies of a cold compile cache (``compile-cache-cold`` in diff and doctor)."""

VERIFY_HASH_HINT = ("envguard snapshot --verify hash confirms an edit (content against "
                    "RECORD's hash) and clears a file copied back byte for byte")
"""What to say where only a file's time shows it was written after install."""
