"""Rules about the interpreter, the machine, environment variables and your own files."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

from envguard.changes import ADDED, MASKED, REMOVED, Change
from envguard.explain.interface import Context, Finding, Rule, Severity
from envguard.explain.remedies import git_command, python_spec, remedy, uv_venv
from envguard.model import Snapshot

_BEHAVIOUR_VARS = ("CUDA", "NCCL", "TORCH", "PYTORCH", "TRITON", "NVIDIA", "CUBLAS", "CUDNN",
                   "NVSHMEM", "LD_", "OMP_", "MKL_", "PYTHONPATH", "HF_", "TRANSFORMERS_")


def python_changed(ctx: Context) -> Iterator[Finding]:
    changes = ctx.diff.find("interpreter")
    if not changes:
        return
    old, new = ctx.old.interpreter, ctx.new.interpreter
    minor = old.version.split(".")[:2] != new.version.split(".")[:2]
    major = minor or old.implementation != new.implementation
    yield Finding(
        rule="python-changed",
        severity=Severity.CRITICAL if major else Severity.WARNING,
        title=(f"Python changed from {old.implementation} {old.version} to "
               f"{new.implementation} {new.version}" if major or old.version != new.version
               else f"the interpreter moved or the venv was recreated ({new.prefix})"),
        explanation=(
            "Compiled wheels are built per Python minor version, and a recreated venv starts "
            "from whatever the installer resolves today. A different sys.path changes which "
            "copy of a module is imported."
        ),
        evidence=tuple(f"{c.key}: {c.old} → {c.new}" for c in changes
                       if c.key != "sys_path") + tuple(
            "sys.path changed" for c in changes if c.key == "sys_path"),
        remedy=(remedy(lambda: uv_venv(python_spec(old.version, "interpreter.version"),
                                       old.prefix),
                       "recreate the venv with the good Python: "),),
        changes=tuple(changes),
        weight=88,
    )


def gpu_driver_changed(ctx: Context) -> Iterator[Finding]:
    keys = ("gpus", "driver_version", "cuda_driver_version", "gpu_probe", "nvcc")
    changes = [c for c in ctx.diff.find("system") if c.key in keys]
    if not changes:
        return
    old, new = ctx.old.system, ctx.new.system
    failed = [s for s in (ctx.old, ctx.new) if s.system.gpu_probe == "error"]
    if failed and (old.gpus or new.gpus):
        yield _gpus_unreadable(changes, failed)
        return
    # The GPU lists of two readable answers differ; absent, 'no devices' and unreadable
    # are all "no GPU listed", not a change of GPUs.
    hardware = not failed and any(c.key == "gpus" for c in changes)
    shown = [c for c in changes if hardware or c.key not in ("gpus", "gpu_probe")]
    if not shown:
        return
    yield Finding(
        rule="gpu-driver-changed",
        severity=Severity.CRITICAL if hardware else Severity.WARNING,
        title="the GPUs changed" if hardware else "the NVIDIA driver or CUDA toolkit changed",
        explanation=(
            "A driver older than the CUDA build of torch fails at the first CUDA call; another "
            "GPU model changes kernels (compute capability), memory and compile-cache keys, "
            "which include the GPU name."
        ),
        evidence=tuple(f"{c.key}: {c.old} → {c.new}" for c in shown),
        remedy=("check nvidia-smi; torch's CUDA build needs a driver whose CUDA version is at "
                "least torch.version.cuda",),
        changes=tuple(shown),
        weight=75,
    )


def _gpus_unreadable(changes: list[Change], failed: list[Snapshot]) -> Finding:
    """One side lists GPUs, the other's nvidia-smi failed: unknown, not a known change."""
    errors = [e.message for s in failed for e in s.errors
              if e.section == "system" and "nvidia-smi" in e.message]
    return Finding(
        rule="gpu-driver-changed",
        severity=Severity.WARNING,
        title="nvidia-smi failed in one snapshot: its GPUs are unknown",
        explanation=(
            "The GPUs cannot be compared. A driver that stopped answering is itself a common "
            "cause of CUDA errors (a driver/kernel-module mismatch after an upgrade, a GPU "
            "that fell off the bus)."
        ),
        evidence=tuple(f"{c.key}: {c.old} → {c.new}" for c in changes) + tuple(errors[:3]),
        remedy=("run nvidia-smi on that machine; if it fails too, reload or reinstall the "
                "driver (a reboot after a driver upgrade)",),
        changes=tuple(changes),
        weight=70,
    )


def cuda_runtime_changed(ctx: Context) -> Iterator[Finding]:
    changes = ctx.diff.find("deep")
    if not changes:
        return
    lost = any(c.key == "cuda_available" and c.old and not c.new for c in changes)
    yield Finding(
        rule="cuda-runtime-changed",
        severity=Severity.CRITICAL if lost else Severity.WARNING,
        title="torch can no longer use CUDA" if lost else
              "what torch sees at run time changed (from --deep snapshots)",
        explanation="These facts come from importing torch: the CUDA runtime, cuDNN and NCCL "
                    "it actually loaded, and inductor's own torch_key.",
        evidence=tuple(f"{c.key}: {c.old} → {c.new}" for c in changes),
        remedy=("compare torch.version.cuda with the driver (nvidia-smi) and the CUDA wheels "
                "installed",),
        changes=tuple(changes),
        weight=93 if lost else 45,
    )


def env_var_changed(ctx: Context) -> Iterator[Finding]:
    changes = ctx.diff.find("environment")
    if not changes:
        return
    behaviour = [c for c in changes if c.key.startswith(_BEHAVIOUR_VARS)]

    def show(value: object) -> str:
        return "unset" if value is None else str(value)

    lines = []
    for c in sorted(changes, key=lambda c: (not c.key.startswith(_BEHAVIOUR_VARS), c.key)):
        if c.kind == ADDED:
            lines.append(f"{c.key} set to {show(c.new)}")
        elif c.kind == REMOVED:
            lines.append(f"{c.key} unset (was {show(c.old)})")
        else:
            lines.append(f"{c.key}: {show(c.old)} → {show(c.new)}")
    masked = [c.key for c in changes if MASKED in f"{c.old}{c.new}"]
    keywords = [c.key.lower() for c in changes]
    if any(c.key.startswith("NCCL") for c in changes):
        keywords.append("nccl")
    if any(c.key.startswith("PYTORCH_CUDA_ALLOC") for c in changes):
        keywords += ["out of memory", "oom"]
    yield Finding(
        rule="env-var-changed",
        severity=Severity.WARNING if behaviour else Severity.INFO,
        title=f"{len(changes)} environment variable(s) changed: "
              + ", ".join(c.key for c in changes[:6]) + (" …" if len(changes) > 6 else ""),
        explanation=(
            "CUDA_*, NCCL_*, TORCH*, TRITON_* and PYTORCH_* variables change device "
            "visibility, allocator behaviour, communication and compilation without any "
            "package changing."
            + (f" Values of {', '.join(masked)} are secret and shown masked; only the fact "
               "that they changed is known." if masked else "")
        ),
        evidence=tuple(lines),
        remedy=(_env_remedy(changes, ctx.old),),
        changes=tuple(changes),
        weight=55,
        keywords=tuple(keywords),
    )


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_remedy(changes: list[Change], good: Snapshot, limit: int = 300) -> str:
    """Export the good values again: whole ``export`` lines only, each value shell-quoted,
    as many as fit in ``limit`` characters (at least one). A masked value is never
    exported (the snapshot does not hold it): its variable is named for the secret store.
    Without any good value, the general advice."""
    exports, secret = [], []
    for c in changes:
        value = good.environment.variables.get(c.key)
        if c.kind == ADDED or value is None:
            continue
        if value.masked:
            secret.append(c.key)
        elif value.value is not None and _SHELL_NAME.fullmatch(c.key):
            exports.append(f"export {c.key}={shlex.quote(value.value)}")
    names = ", ".join(secret[:6]) + (f" and {len(secret) - 6} more" if len(secret) > 6 else "")
    store = (f"restore the value{'s' if len(secret) > 1 else ''} of {names} from your secret "
             "store" if secret else "")
    if not exports:
        return store or "restore the launch environment"
    shown = exports[:1]
    for line in exports[1:]:
        if len("; ".join([*shown, line])) > limit:
            break
        shown.append(line)
    if len(shown) < len(exports):
        shown.append(f"… and {len(exports) - len(shown)} more")
    return ("set them back in the launch script, or export the good values: "
            + "; ".join(shown) + (f"; {store}" if store else ""))


def file_changed(ctx: Context) -> Iterator[Finding]:
    changes = [c for c in ctx.diff.find("files") if c.material]
    if not changes:
        return
    lines = []
    for c in changes:
        if c.kind == REMOVED:
            lines.append(f"{c.key}: missing now (md5 was {c.old['md5']})")
        elif c.kind == ADDED:
            lines.append(f"{c.key}: exists now (md5 {c.new['md5']})")
        else:
            lines.append(f"{c.key}: md5 {c.old['md5']} → {c.new['md5']}")
    git = ctx.diff.first("git", "repository", "commit")
    if git is not None:
        lines.append(f"git commit {git.old} → {git.new}")
    names = [c.key.rsplit("/", 1)[-1] for c in changes]
    yield Finding(
        rule="file-changed",
        severity=Severity.WARNING,
        title=f"{len(changes)} tracked file(s) changed: " + ", ".join(names[:5])
              + (" …" if len(names) > 5 else ""),
        explanation="Your own training code or configuration is not what ran before. Compare "
                    "with md5sum on the machine that ran it, or with git.",
        evidence=tuple(lines),
        remedy=_file_remedies(git.old if git is not None else None,
                              [c.key for c in changes[:8]]),
        changes=tuple(changes),
        weight=65,
        keywords=tuple(names),
    )


def git_state_changed(ctx: Context) -> Iterator[Finding]:
    changes = ctx.diff.find("git")
    if not changes or any(c.material for c in ctx.diff.find("files")):
        return  # file-changed already says it (it reports only material file changes)
    yield Finding(
        rule="git-state-changed", severity=Severity.INFO,
        title="the project's git state changed",
        explanation="Another commit, branch or set of uncommitted edits is checked out.",
        evidence=tuple(f"{c.field}: {c.old} → {c.new}" for c in changes),
        remedy=(_git_diff_good(ctx),), changes=tuple(changes), weight=30)


def _file_remedies(commit: object, files: list[str]) -> tuple[str, ...]:
    """``git diff COMMIT -- FILE...`` and ``git checkout COMMIT -- FILE...`` with the good
    commit when the snapshot names it, else the diff against the index."""
    good = commit if isinstance(commit, str) and commit else None
    diff = remedy(lambda: git_command("diff", good, files))
    if good is None:
        return (diff, "then check out the good commit's version of them to restore them")
    return (diff, remedy(lambda: git_command("checkout", good, files),
                         suffix="  restores them"))


def _git_diff_good(ctx: Context) -> str:
    git = ctx.old.files.git
    commit = git.commit if git is not None else None
    if not commit:
        return "git diff against the good commit (the good snapshot records none)"
    return remedy(lambda: git_command("diff", commit))


RULES = (
    Rule(id="python-changed", title="interpreter changed", check=python_changed,
         keywords=("python", "abi", "undefined symbol", "importerror", "no module named")),
    Rule(id="gpu-driver-changed", title="GPU, driver or CUDA toolkit changed",
         check=gpu_driver_changed,
         keywords=("driver", "cuda driver version is insufficient", "no cuda gpus",
                   "cuda-capable", "nvml", "cuda error", "out of memory", "no kernel image")),
    Rule(id="cuda-runtime-changed", title="CUDA runtime seen by torch changed",
         check=cuda_runtime_changed,
         keywords=("cuda", "cudnn", "nccl", "is_available", "no cuda gpus")),
    Rule(id="env-var-changed", title="environment variable changed", check=env_var_changed,
         keywords=("environment", "visible devices")),
    Rule(id="file-changed", title="tracked file changed", check=file_changed,
         keywords=("md5", "checksum")),
    Rule(id="git-state-changed", title="git state changed", check=git_state_changed),
)
