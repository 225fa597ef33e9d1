"""nox sessions: tests, lint, typecheck, typecheck-newest-torch, bench. Run with
`uv run nox -s NAME`.

Sessions use uv to build their venvs. Set ENVGUARD_TORCH_FIND_LINKS to a folder
of torch wheels (CI sets it to the machine's local CPU wheel) to avoid a
multi-GB CUDA download.
"""

from __future__ import annotations

import os
import sys

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:  # envguard itself depends on tomli there
    import tomli as tomllib

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["lint", "typecheck", "tests"]


def _install_project(session: nox.Session, *, with_torch: bool) -> None:
    args = ["-e", ".[dflash]" if with_torch else "."]
    find_links = os.environ.get("ENVGUARD_TORCH_FIND_LINKS")
    if with_torch and find_links:
        session.install("--find-links", find_links, "torch==2.13.0+cpu")
    session.install(*args)


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (real venvs built with uv, real torch, offline)."""
    _install_project(session, with_torch=True)
    session.install("pytest", "pytest-xdist", "hypothesis", "uv")
    session.run("pytest", "-n", "auto", *session.posargs)


@nox.session
def integrations(session: nox.Session) -> None:
    """The W&B and MLflow helpers against the real libraries (W&B offline, MLflow with a
    file store): envguard depends on neither, so the default suite runs stand-ins."""
    _install_project(session, with_torch=False)
    session.install("pytest", "hypothesis", "uv", "wandb", "mlflow-skinny")
    session.run("pytest", "tests/envguard/integrations/test_integrations.py",
                "-m", "real_library", "-rs", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "envguard", "dflash", "tests", "benchmarks", "noxfile.py")


# What mypy needs besides the project: envguard/restore/build.py imports the uv package.
TYPECHECK_TOOLS = ("mypy", "uv")
# torch's own requirements that are plain Python; its CUDA libraries are left out.
TORCH_PYTHON_DEPS = ("typing-extensions", "sympy", "networkx", "jinja2", "filelock", "fsspec")


@nox.session
def typecheck(session: nox.Session) -> None:
    _install_project(session, with_torch=True)  # dflash is type-checked against torch
    session.install(*TYPECHECK_TOOLS)
    session.run("mypy", "envguard", "dflash")


def _dflash_extra_without_torch() -> list[str]:
    with open("pyproject.toml", "rb") as f:
        extra: list[str] = tomllib.load(f)["project"]["optional-dependencies"]["dflash"]
    return [req for req in extra if not req.startswith("torch")]


@nox.session(name="typecheck-newest-torch")
def typecheck_newest_torch(session: nox.Session) -> None:
    """mypy against the newest torch on PyPI (`typecheck` uses CI's pinned one): torch's
    type hints change between releases, and dflash must check under both. The torch wheel
    comes without its CUDA dependencies: it is read by mypy, never imported.
    `uv run nox -s typecheck-newest-torch -- torch==X.Y.Z` checks another release.
    """
    session.install("-e", ".", *_dflash_extra_without_torch(), *TORCH_PYTHON_DEPS,
                    *TYPECHECK_TOOLS)
    session.install("--no-deps", "--upgrade", *(session.posargs or ["torch"]))
    session.run("python", "-c", "from importlib.metadata import version; "
                "print('type-checking against torch', version('torch'))")
    session.run("mypy", "envguard", "dflash")


@nox.session
def bench(session: nox.Session) -> None:
    """Snapshot speed against pip freeze, uv pip freeze, collect_env and sha256sum.

    `uv run nox -s bench -- --python /path/to/training/venv/bin/python` benchmarks that env;
    without --python it benchmarks this session's own env (with torch installed).
    """
    _install_project(session, with_torch=True)
    session.install("uv", "pip")
    args = list(session.posargs)
    if "--python" not in args:
        args += ["--python", str(session.virtualenv.bin) + "/python"]
    session.run("python", "benchmarks/bench_snapshot.py", "--markdown", *args)


@nox.session(venv_backend="none", name="bench-gpu")
def bench_gpu(session: nox.Session) -> None:
    """DFlash on one GPU: ceilings, throughput and MFU, flex vs dense, cold vs warm start,
    the compile race. Run it on the GPU machine, in the training environment:
    `uv run nox -s bench-gpu -- --out results --stages ceilings,train,dense,start,race`.
    """
    session.run("python", "benchmarks/gpu_dflash.py", *session.posargs, external=True)


@nox.session(venv_backend="none")
def lock(session: nox.Session) -> None:
    """Regenerate lockfiles/dflash-train.toml: the CI environment and the H200 reference.

    Run it in the environment .ci/run builds (the project .venv with .ci/constraints.txt).
    The H200 entry comes from a snapshot taken on that machine (tests/data/); refresh it
    with `envguard snapshot -o tests/data/h200-snapshot.json` there.
    """
    run = ("uv", "run", "--no-sync", "envguard", "lock", "dflash-train")
    session.run(*run, "--entry", "ci-cpu", "--file", "dflash/**/*.py", external=True)
    session.run(*run, "--from", "tests/data/h200-snapshot.json", "--entry", "h200-cu130",
                external=True)
