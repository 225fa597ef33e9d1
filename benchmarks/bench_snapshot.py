#!/usr/bin/env python3
"""Time ``envguard snapshot`` against peer tools on ONE target environment, in ONE run.

    python benchmarks/bench_snapshot.py --python PY [--markdown] [--json OUT] [--quick]

Stdlib only; tools run as subprocesses, output discarded. envguard runs as ``sys.executable -m
envguard`` (or ``--envguard CMD``; ``--envguard-src REPO`` adds PYTHONPATH=REPO). Caches, config
and PYTHONPYCACHEPREFIX point into a temporary folder (PYTHONDONTWRITEBYTECODE is removed, so
every tool runs from bytecode after its warm-up, writing no .pyc elsewhere). Missing peers are
n/a; the exit status is 1 only if an envguard measurement failed, 2 if PY cannot run.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import io
import itertools
import json
import os
import platform
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

MB = 1e6
_DROPPED = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json", "uv_cache.json"}
_PROBE = ("import importlib.util as u, json, platform, sys; print(json.dumps({'sys_path': "
          "[p for p in sys.path if p], 'version': platform.python_version(), 'executable': "
          "sys.executable, 'pip': u.find_spec('pip') is not None, 'torch': "
          "u.find_spec('torch') is not None}))")


@dataclass
class Result:
    key: str
    operation: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # overrides shown with the command
    stdin: str | None = None
    warmup_s: list[float] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)
    status: str = "ok"  # ok | n/a | failed
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    @property
    def minimum(self) -> float | None:
        return min(self.times_s) if self.times_s else None

    def command(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        line = " ".join(x for x in (env, shlex.join(self.argv)) if x)
        return line + (f" < {shlex.quote(self.stdin)} > /dev/null" if self.stdin else "")


def timed(argv: list[str], env: dict[str, str], cwd: str, stdin: str | None = None) -> float:
    """Wall time of one run; raises RuntimeError on a non-zero exit."""
    with open(stdin or os.devnull, "rb") as fh:
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=cwd, stdin=fh, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, check=False)
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.decode(errors='replace')[-400:]}")
    return elapsed


def _verified(row: list[str]) -> bool:
    """envguard's rule: hashed rows, minus ``..`` script rows, __pycache__/.pyc, INSTALLER & co."""
    if len(row) < 2 or not row[0] or not row[1]:
        return False
    rel = row[0].replace("\\", "/")
    if rel.startswith(".."):
        parts = [p for p in rel.split("/") if p not in ("..", ".", "")]
        return not parts or parts[0] not in ("bin", "Scripts")
    head, _, base = rel.rpartition("/")
    return not ("__pycache__" in rel or rel.endswith((".pyc", ".pyo"))
                or (head.endswith(".dist-info") and base in _DROPPED))


def record_files(sys_path: list[str]) -> dict[str, Any]:
    """Existing files of every verified RECORD row; the first dist of a name on sys.path wins."""
    names: set[str] = set()
    paths: list[str] = []
    n_records = record_bytes = listed_bytes = 0
    for site in dict.fromkeys(os.path.abspath(p) for p in sys_path):
        for meta in sorted(os.listdir(site)) if os.path.isdir(site) else []:
            name = re.sub(r"[-_.]+", "-", meta.rsplit(".", 1)[0].split("-")[0]).lower()
            if not meta.endswith((".dist-info", ".egg-info")) or name in names:
                continue
            names.add(name)
            record = os.path.join(site, meta, "RECORD")
            if meta.endswith(".egg-info") or not os.path.isfile(record):
                continue
            with open(record, encoding="utf-8", newline="") as fh:
                text = fh.read()
            n_records, record_bytes = n_records + 1, record_bytes + len(text.encode())
            for row in filter(_verified, csv.reader(io.StringIO(text.replace("\r", "")))):
                full = os.path.normpath(os.path.join(site, row[0]))
                try:
                    listed_bytes += os.stat(full).st_size
                except OSError:
                    continue
                paths.append(full)
    return {"distributions": len(names), "record_files": n_records, "record_bytes": record_bytes,
            "listed_files": len(paths), "listed_bytes": listed_bytes, "paths": paths}


def find_uv() -> str | None:
    """The ``uv`` PyPI package's binary, else ``uv`` on PATH (a pyenv shim adds ~0.15 s/call)."""
    try:
        return str(importlib.import_module("uv").find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def first_line(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.split(
            "\n")[0]
    except OSError:
        return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--python", required=True, metavar="PY", help="target interpreter")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--envguard", metavar="CMD", help="envguard command line (shell-split)")
    how.add_argument("--envguard-src", metavar="DIR", help="run envguard from this repo root")
    ap.add_argument("--uv", metavar="PATH", help="uv binary (default: uv package, then PATH)")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions (default 7)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up runs (default 2)")
    ap.add_argument("--collect-env-reps", type=int, default=3)
    ap.add_argument("--cwd", help="folder the tools run in (default: the temporary folder)")
    ap.add_argument("--json", metavar="OUT", help="write every raw number here")
    ap.add_argument("--markdown", action="store_true", help="print a markdown report")
    ap.add_argument("--quick", action="store_true",
                    help="the default snapshot and the freezes only (the ratio bar): no "
                    "collect_env, no --verify hash, no sha256sum (minutes on a large env)")
    args = ap.parse_args()
    skipped = "skipped (--quick)" if args.quick else None

    tmp = tempfile.mkdtemp(prefix="envguard-bench-")
    cwd = os.path.abspath(args.cwd or tmp)
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    sandbox = {"ENVGUARD_CACHE_DIR": "cache", "XDG_CACHE_HOME": "xdg-cache",
               "XDG_CONFIG_HOME": "xdg-config", "TORCHINDUCTOR_CACHE_DIR": "inductor",
               "TRITON_CACHE_DIR": "triton", "CUDA_CACHE_PATH": "cuda", "UV_CACHE_DIR": "uv",
               "PYTHONPYCACHEPREFIX": "pycache"}
    for var, sub in sandbox.items():
        env[var] = os.path.join(tmp, sub)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    eg_env: dict[str, str] = {}
    if args.envguard:
        eg = shlex.split(args.envguard)
    else:
        eg = [sys.executable, "-m", "envguard"]
        if args.envguard_src:
            eg_env["PYTHONPATH"] = os.path.abspath(args.envguard_src)

    py = args.python  # an interpreter, a venv folder, or a name on PATH
    py = os.path.join(py, "bin", "python") if os.path.isdir(py) else py
    py = os.path.abspath(py) if os.sep in py else shutil.which(py) or py
    try:
        probe = subprocess.run([py, "-c", _PROBE], env=env, cwd=cwd, capture_output=True,
                               text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"[bench] cannot run target {py}: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        return 2
    target = json.loads(probe.stdout)
    files = record_files(target["sys_path"])
    paths: list[str] = files.pop("paths")
    file_list = os.path.join(tmp, "record-files.nul")
    with open(file_list, "wb") as fh:
        fh.write(b"".join(os.fsencode(p) + b"\0" for p in paths))
    snap_out = os.path.join(tmp, "snapshot.json")
    results: dict[str, Result] = {}
    n, w = args.reps, args.warmup

    def add(res: Result, warmups: int, reps: int, once: Callable[[], float],
            missing: str | None = None) -> None:
        """Warm-ups, then timed runs; or n/a when ``missing`` says why the tool is absent."""
        results[res.key] = res
        print(f"[bench] {res.operation}: " + (f"n/a ({missing})" if missing else
              f"{warmups} warm-up + {reps} runs of\n  {res.command()}"), file=sys.stderr)
        try:
            if missing:
                raise LookupError(missing)
            res.warmup_s = [once() for _ in range(warmups)]
            res.times_s = [once() for _ in range(reps)]
        except (OSError, RuntimeError, LookupError) as exc:
            res.status, res.note = "n/a" if missing else "failed", str(exc)

    def envguard(argv: list[str], cache: str | None = None) -> float:
        return timed(argv, {**env, **eg_env, **({"ENVGUARD_CACHE_DIR": cache} if cache else {})},
                     cwd)

    def envguard_json(key: str) -> dict[str, Any]:
        ok = results[key].status == "ok"
        return dict(json.loads(Path(snap_out).read_text(encoding="utf-8"))) if ok else {}

    # The default snapshot; its first warm-up run is also reported as the "first run".
    argv = [*eg, "snapshot", "--python", py, "-q", "-o", snap_out]
    add(Result("default", "envguard snapshot (default, --verify size)", argv, dict(eg_env)),
        max(w, 1), n, lambda: envguard(argv))
    default_json = envguard_json("default")
    pip_argv = [py, "-m", "pip", "freeze"]
    add(Result("pip_freeze", "pip freeze", pip_argv), w, n, lambda: timed(pip_argv, env, cwd),
        None if target["pip"] else "pip is not importable in the target")
    uv = args.uv or find_uv()
    uv_argv = [uv or "uv", "pip", "freeze", "--python", py]
    add(Result("uv_freeze", "uv pip freeze", uv_argv), w, n, lambda: timed(uv_argv, env, cwd),
        None if uv else "no uv binary found")
    ce_argv = [py, "-m", "torch.utils.collect_env"]
    add(Result("collect_env", "torch collect_env", ce_argv), 1, args.collect_env_reps,
        lambda: timed(ce_argv, env, cwd),
        skipped or (None if target["torch"] else "torch not importable"))

    # --verify hash on a cold hash cache (a fresh ENVGUARD_CACHE_DIR per run) vs sha256sum.
    hash_argv = [*eg, "snapshot", "--python", py, "--verify", "hash", "-q", "-o", snap_out]
    runs = itertools.count(1)

    def cold_once() -> float:
        cache = os.path.join(tmp, f"cold-cache-{next(runs)}")
        try:
            return envguard(hash_argv, cache)
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    add(Result("hash_cold", "envguard --verify hash, cold hash cache", hash_argv,
               {**eg_env, "ENVGUARD_CACHE_DIR": f"{tmp}/cold-cache-<new per run>"}),
        max(w, 1), n, cold_once, skipped)
    hash_json = envguard_json("hash_cold")
    sha_argv = ["xargs", "-0", "sha256sum"]
    has_sha = bool(shutil.which("sha256sum") and shutil.which("xargs"))
    add(Result("sha256sum", "sha256sum, same files", sha_argv, stdin=file_list), max(w, 1), n,
        lambda: timed(sha_argv, {**env, "LC_ALL": "C"}, cwd, file_list),
        skipped or (None if has_sha and paths
                    else "no sha256sum/xargs, or no RECORD-listed files"))

    # Warm re-runs: --verify hash with a cache filled by the warm-up; the default snapshot.
    warm = os.path.join(tmp, "warm-cache")
    add(Result("hash_warm", "envguard --verify hash, warm hash cache (re-run)", hash_argv,
               {**eg_env, "ENVGUARD_CACHE_DIR": warm}), 1, n,
        lambda: envguard(hash_argv, warm), skipped)
    add(Result("default_warm", "envguard snapshot (default), warm re-run", argv, dict(eg_env)),
        w, n, lambda: envguard(argv))

    integ = hash_json.get("integrity") or {}
    eg_bytes = int(integ.get("hashed_bytes") or 0) or None
    med = {k: r.median for k, r in results.items()}
    d = med["default"]
    mbps_eg = ratio(eg_bytes / MB if eg_bytes else None, med["hash_cold"])
    mbps_sha = ratio(files["listed_bytes"] / MB, med["sha256sum"])

    def bar(name: str, value: float | None, limit: float | None, at_most: bool) -> dict[str, Any]:
        ok = None if value is None or limit is None else (value <= limit) == at_most
        verdict = "n/a" if value is None else "report" if ok is None else "PASS" if ok else "FAIL"
        return {"bar": name, "value": value, "limit": limit, "verdict": verdict}

    bars = [
        bar("default snapshot ≤ 0.5× pip freeze (envguard ÷ pip freeze)",
            ratio(d, med["pip_freeze"]), 0.5, True),
        bar("default snapshot ≤ 0.1× collect_env (envguard ÷ collect_env)",
            ratio(d, med["collect_env"]), 0.1, True),
        bar("default snapshot vs uv pip freeze (envguard ÷ uv), report only",
            ratio(d, med["uv_freeze"]), None, True),
        bar("--verify hash cold throughput ≥ 0.7× sha256sum's (envguard MB/s ÷ sha256sum MB/s)",
            ratio(mbps_eg, mbps_sha), 0.7, False),
        bar("warm re-run --verify hash ≤ 0.5 s (median s)", med["hash_warm"], 0.5, True),
        bar("warm re-run default snapshot ≤ 0.5 s (median s)", med["default_warm"], 0.5, True),
    ]
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(), "cpu_count": os.cpu_count(),
        "nproc": first_line(["nproc"]), "sha256sum": first_line(["sha256sum", "--version"]),
        "machine": platform.machine(), "platform": platform.platform(),
        "bench_python": platform.python_version(), "target_python": target["version"],
        "target_executable": target["executable"], "tmp": tmp, "cwd": cwd,
        "sandbox_env": {k: env[k] for k in [*sandbox, "PIP_DISABLE_PIP_VERSION_CHECK"]},
        "removed_env": {k: os.environ[k] for k in dropped if k in os.environ},
        "envguard_packages": len(default_json.get("packages") or []),
        "envguard_duration_s": default_json.get("duration_s"),
        "envguard_hash_duration_s": hash_json.get("duration_s"),
        "envguard_hashed_bytes": eg_bytes, "envguard_checked_files": integ.get("checked_files"),
        "throughput_mb_s": {"envguard_hash_cold": mbps_eg, "sha256sum": mbps_sha},
        **files,
    }
    first = results["default"].warmup_s[0] if results["default"].warmup_s else None
    report = {"meta": meta, "first_run_default_s": first, "bars": bars,
              "results": [{**asdict(r), "median_s": r.median, "min_s": r.minimum,
                           "command": r.command()} for r in results.values()]}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
    if args.markdown or not args.json:
        print(markdown(results, meta, bars, first, py, eg))
    shutil.rmtree(tmp, ignore_errors=True)
    failed = [r for r in results.values() if r.argv[: len(eg)] == eg and r.status != "ok"]
    return 1 if failed else 0


def markdown(results: dict[str, Result], meta: dict[str, Any], bars: list[dict[str, Any]],
             first: float | None, py: str, eg: list[str]) -> str:
    d = results["default"].median
    tp = meta["throughput_mb_s"]

    def short(r: Result) -> str:
        line = shlex.join(r.argv).replace(shlex.join(eg), "envguard").replace(shlex.quote(py), "PY")
        line = line.replace(str(meta["tmp"]), "$TMP")
        return f"`{line}`" + (" (stdin: the RECORD file list)" if r.stdin else "")

    def rel(r: Result) -> str:
        if r.status != "ok":
            return f"{r.status}: {r.note}"[:120]
        if r.key == "default":
            return "1.00 (baseline)"
        if r.key == "hash_cold" and tp["envguard_hash_cold"]:
            return f"{tp['envguard_hash_cold']:.0f} MB/s = " \
                   f"{fmt(ratio(tp['envguard_hash_cold'], tp['sha256sum']), '.2f')}× sha256sum's"
        if r.key == "sha256sum":
            return f"{fmt(tp['sha256sum'], '.0f')} MB/s (peer for --verify hash)"
        if r.key.startswith(("hash_", "default_")):
            return f"this ÷ envguard default = {fmt(ratio(r.median, d), '.2f')}×"
        return f"envguard default ÷ this = {fmt(ratio(d, r.median), '.2f')}×"

    out = [f"Target `{meta['target_executable']}` (Python {meta['target_python']}): "
           f"{meta['distributions']} distributions, {meta['record_files']} RECORD files "
           f"({meta['record_bytes']} bytes), {meta['listed_files']} hashed RECORD-listed files "
           f"({meta['listed_bytes'] / MB:.0f} MB).  ",
           f"Host `{meta['hostname']}`, {meta['cpu_count']} CPUs (nproc {meta['nproc']}), "
           f"{meta['platform']}, bench Python {meta['bench_python']}, {meta['sha256sum']}, "
           f"{meta['date']}. "
           f"Wall time of whole processes; median and min of the timed runs after warm-ups; "
           f"page cache warm.", "",
           "| operation | command | median s | min s | ratio (direction stated) |",
           "|---|---|---|---|---|"]
    if first is not None:
        out.append(f"| envguard snapshot (default), first run (compiles its bytecode into the "
                   f"fresh PYTHONPYCACHEPREFIX) | {short(results['default'])} | {first:.3f} | "
                   f"{first:.3f} | 1 sample |")
    for r in results.values():
        out.append(f"| {r.operation} | {short(r)} | {fmt(r.median)} | {fmt(r.minimum)} | "
                   f"{rel(r)} |")
    out += ["", "| bar | value | verdict |", "|---|---|---|"]
    out += [f"| {b['bar']} | {fmt(b['value'], '.3f')} | {b['verdict']} |" for b in bars]
    out += ["", "Exact command lines (every command also had: " + " ".join(
        f"{k}={v}" for k, v in meta["sandbox_env"].items()) + "; unset: " + (" ".join(
            meta["removed_env"]) or "nothing") + "):", "",
        "```", *[r.command() for r in results.values()], "```"]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
