"""Real breakages from public trackers, rebuilt from real PyPI wheels, and envguard's score on them.

    python benchmarks/cases_pypi.py build [--offline] [--only ID] [--cache DIR] [--work DIR]
    python benchmarks/cases_pypi.py score [--offline] [--only ID] [--no-bisect]
        [--markdown docs/CASES.md] [--json OUT]

The cases are data (benchmarks/cases_pypi.toml). `build` makes for each case a GOOD venv (its
pins and five old "noise" packages), checks the command passes there, applies the user's
break (plus five noise upgrades) to a BAD venv, checks the command fails there with the
user's error, and snapshots both. Every wheel is kept in the cache (`--cache`, default
~/.cache/envguard-cases-pypi/wheels) with the exact pins of both venvs (`locks/`), so that
`--offline` rebuilds with `uv --no-index --find-links CACHE` only. `score` runs envguard
diff/doctor/run/bisect and the peers (pip check, uv pip check, pipdeptree) on the BAD venvs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).with_suffix(".toml")
ENVGUARD_PY = str(ROOT / ".venv" / "bin" / "python")
PYTHONS = {
    "3.11": "/root/.pyenv/versions/3.11.7/bin/python3.11",
    "3.12": "/root/.pyenv/versions/3.12.1/bin/python3.12",
}
NOISE = {re.split(r"[=<>]", p)[0] for p in tomllib.loads(DATA.read_text())["noise"]["new"]}
HOME = Path.home() / ".cache" / "envguard-cases-pypi"
MARKERS = {
    "working-folder": (
        "working folder",
        "working directory",
        "current directory",
        "shadow",
        "random.py",
        "pygame.py",
    ),
    "PYTHONPATH": ("pythonpath",),
    "local-build": (
        "built locally",
        "local build",
        "linux_x86_64",
        "rebuilt",
        "from source",
        "sdist",
    ),
}


@dataclass
class Case:
    id: str
    report: str
    symptom: str
    command: list[str]
    culprit: str
    baseline_needed: bool
    good: list[str]
    match: str = ""
    install: list[str] = field(default_factory=list)
    uninstall: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    pythonpath: dict[str, Any] = field(default_factory=dict)
    local_build: str = ""
    local_build_env: dict[str, str] = field(default_factory=dict)
    fake: str = ""


def load() -> tuple[list[Case], dict[str, list[str]]]:
    data = tomllib.loads(DATA.read_text())
    return [Case(**c) for c in data["case"]], data["noise"]


def run(
    args: list[str],
    *,
    timeout: float = 600,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full)
    except subprocess.TimeoutExpired as e:
        p = subprocess.CompletedProcess(args, 124, str(e.stdout or ""), f"timeout after {timeout}s")
    if check and p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{' '.join(map(str, args[:4]))} ... exited {p.returncode}: {tail[0]}")
    return p


def envguard(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    e = {"PYTHONPATH": str(ROOT), **(env or {})}
    return run([ENVGUARD_PY, "-m", "envguard", *args], cwd=cwd, env=e, timeout=timeout)


class Builder:
    def __init__(self, cache: Path, work: Path, offline: bool) -> None:
        self.cache, self.work, self.offline = cache, work, offline
        self.no_bisect = False
        self.locks = cache.parent / "locks"
        self.local = cache.parent / "local"
        for d in (cache, self.locks, self.local, work):
            d.mkdir(parents=True, exist_ok=True)

    def src(self) -> list[str]:
        return (
            ["--no-index", "--find-links", str(self.cache)]
            if self.offline
            else ["--find-links", str(self.cache)]
        )

    def pip(self, py: str) -> Path:
        """A venv with pip for `pip wheel` (fills the cache) and `pip check`."""
        d = self.cache.parent / f"pip-{py}"
        if not (d / "bin" / "pip").exists():
            run(["uv", "venv", "-q", "--seed", "-p", PYTHONS[py], str(d)], check=True, timeout=300)
        return d / "bin" / "pip"

    def venv(self, d: Path, py: str = "3.11") -> Path:
        if d.exists():
            shutil.rmtree(d)
        run(["uv", "venv", "-q", "-p", PYTHONS[py], str(d)], check=True, timeout=120)
        return d / "bin" / "python"

    def uv(self, py: Path, *args: str, cons: Path | None = None) -> None:
        extra = ["-c", str(cons)] if cons and cons.exists() and self.offline else []
        run(
            ["uv", "pip", *args[:1], "-q", "--python", str(py), *self.src(), *extra, *args[1:]],
            check=True,
            timeout=900,
        )

    def freeze(self, py: Path, lock: Path, pyver: str = "3.11") -> None:
        pins = run(["uv", "pip", "freeze", "--python", str(py)], check=True).stdout.split()
        pins = [p for p in pins if "==" in p]
        lock.write_text("\n".join(pins) + "\n")
        if self.offline:
            return
        tag = "cp" + pyver.replace(".", "")  # a wheel for this Python, or for any
        have = {
            re.sub(r"[-_.]+", "_", f.name.split("-")[0]).lower() + "==" + f.name.split("-")[1]
            for f in self.cache.glob("*.whl")
            if f"-{tag}-" in f.name or "-none-" in f.name or "-abi3-" in f.name
        }
        need = [
            p
            for p in pins
            if re.sub(r"[-_.]+", "_", p.split("==")[0]).lower() + "==" + p.split("==")[1]
            not in have
        ]
        if need:  # pip wheel: downloads the wheel as is, or builds one from an sdist
            run(
                [str(self.pip(pyver)), "wheel", "-q", "--no-deps", "-w", str(self.cache), *need],
                check=True,
                timeout=1800,
            )

    def dir(self, c: Case) -> Path:
        """A neutral folder name: a case id in a path would name the culprit for any tool."""
        return self.work / hashlib.sha1(c.id.encode()).hexdigest()[:10]

    def build(self, c: Case, noise: dict[str, list[str]]) -> dict[str, Any]:
        """GOOD is built, checked and snapshotted; the break is then applied in place (as the
        user did)."""
        d = self.dir(c)
        shutil.rmtree(d, ignore_errors=True)
        proj = d / "proj"
        proj.mkdir(parents=True)
        glock, block = self.locks / f"{c.id}.good.txt", self.locks / f"{c.id}.bad.txt"
        py = self.venv(d / "venv")
        self.uv(py, "install", *(["-r", str(glock)] if self.offline else [*c.good, *noise["old"]]))
        self.freeze(py, glock)
        res: dict[str, Any] = {"id": c.id, "dir": str(d), "env": {}}
        g = run([str(py), *c.command[1:]], cwd=proj, timeout=300)
        res["good_rc"], res["good_tail"] = (
            g.returncode,
            g.stderr.strip().splitlines()[-1:] if g.returncode else [],
        )
        res["good_snapshot_rc"] = envguard(
            "snapshot", "--python", str(py), "-o", str(d / "good.json"), "-q", cwd=proj
        ).returncode
        dist = re.split(r"[=<>]", c.good[0])[0] if c.good else "tqdm"
        lk = envguard("lock", "case", "--python", str(py), "--distribution", dist, cwd=proj)
        res["lock_rc"], res["lock_err"] = lk.returncode, lk.stderr.strip()[-300:]
        gr = envguard(
            "run",
            "--lock",
            "lockfiles/case.toml",
            "--python",
            str(py),
            "--",
            str(py),
            *c.command[1:],
            cwd=proj,
        )
        res["run_good_rc"] = gr.returncode
        env = self.apply_break(c, d, py, noise)
        self.freeze(py, block)
        for name, text in c.files.items():
            (proj / name).write_text(text)
        b = run([str(py), *c.command[1:]], cwd=proj, env=env, timeout=300)
        lines = [ln for ln in b.stderr.strip().splitlines() if ln.strip()]
        res.update(env=env, bad_rc=b.returncode, bad_last_line=lines[-1] if lines else "")
        res["symptom_seen"] = (c.match or c.symptom) in b.stderr + b.stdout
        res["reproduces"] = g.returncode == 0 and b.returncode != 0 and res["symptom_seen"]
        res["bad_snapshot_rc"] = envguard(
            "snapshot", "--python", str(py), "-o", str(d / "bad.json"), "-q", cwd=proj, env=env
        ).returncode
        br = envguard(
            "run",
            "--lock",
            "lockfiles/case.toml",
            "--python",
            str(py),
            "--force",
            "--",
            str(py),
            *c.command[1:],
            cwd=proj,
            env=env,
        )
        res["run_bad_rc"], res["run_bad_stderr"] = br.returncode, br.stderr[-6000:]
        (d / "status.json").write_text(json.dumps(res, indent=1))
        return res

    def apply_break(
        self, c: Case, d: Path, py: Path, noise: dict[str, list[str]]
    ) -> dict[str, str]:
        env: dict[str, str] = {}
        if c.uninstall:
            run(["uv", "pip", "uninstall", "-q", "--python", str(py), *c.uninstall], check=True)
        if c.local_build:
            out = self.local / c.id
            if not self.offline or not list(out.glob("*.whl")):
                shutil.rmtree(out, ignore_errors=True)
                name = c.local_build.split("==")[0]
                run(
                    [
                        str(self.pip("3.11")),
                        "wheel",
                        "-q",
                        "--no-deps",
                        "--no-cache-dir",
                        "--no-binary",
                        name,
                        "-w",
                        str(out),
                        c.local_build,
                    ],
                    env=c.local_build_env,
                    check=True,
                    timeout=900,
                )
            wheel = next(out.glob("*.whl"))
            run(
                [
                    "uv",
                    "pip",
                    "install",
                    "-q",
                    "--python",
                    str(py),
                    "--reinstall",
                    "--no-deps",
                    str(wheel),
                ],
                check=True,
            )
        if c.pythonpath:
            opy = self.venv(d / "other", c.pythonpath["python"])
            olock = self.locks / f"{c.id}.other.txt"
            self.uv(
                opy,
                "install",
                *(["-r", str(olock)] if self.offline else c.pythonpath["requirements"]),
            )
            self.freeze(opy, olock, c.pythonpath["python"])
            env["PYTHONPATH"] = str(next((d / "other" / "lib").glob("python3.*/site-packages")))
        self.uv(py, "install", *c.install, *noise["new"], cons=self.locks / f"{c.id}.bad.txt")
        return env


def names_culprit(text: str, culprit: str) -> bool:
    t = text.lower()
    if culprit in MARKERS:
        return any(m in t for m in MARKERS[culprit])
    alts = {culprit.lower(), culprit.lower().replace("-", "_"), culprit.lower().replace("-", "")}
    return any(re.search(rf"(?<![\w-]){re.escape(a)}(?![\w-])", t) for a in alts)


def finding_names(f: dict[str, Any], culprit: str, noise: set[str]) -> bool:
    """The finding singles the culprit out: it names it, and does not lump it with the noise
    upgrades."""
    keys = {
        re.sub(r"[-_.]+", "-", str(ch).split(".")[1]).lower()
        for ch in f.get("changes", [])
        if str(ch).startswith("packages.")
    }
    text = " ".join([f.get("title", ""), *map(str, f.get("evidence", [])[:3])])
    if culprit in MARKERS:
        return names_culprit(
            " ".join([text, f.get("rule", ""), *map(str, f.get("changes", []))]), culprit
        )
    if keys & noise or any(names_culprit(f.get("title", ""), n) for n in noise):
        return False
    return culprit.lower() in keys or names_culprit(text, culprit)


def rank(findings: list[dict[str, Any]], culprit: str, noise: set[str]) -> str:
    return next(
        (str(i) for i, f in enumerate(findings, 1) if finding_names(f, culprit, noise)), "-"
    )


def parse_json(p: subprocess.CompletedProcess[str]) -> dict[str, Any] | None:
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        return None


def score(c: Case, b: Builder) -> dict[str, Any]:
    d = b.dir(c)
    st = json.loads((d / "status.json").read_text())
    bpy, env = d / "venv" / "bin" / "python", st["env"]
    r: dict[str, Any] = {
        "id": c.id,
        "reproduces": st["reproduces"],
        "bad_last_line": st["bad_last_line"],
    }
    g, n = str(d / "good.json"), str(d / "bad.json")
    for col, extra in (("diff_symptom", ["--symptom", c.symptom]), ("diff", [])):
        j = parse_json(envguard("diff", g, n, *extra, "--format", "json"))
        fs = j.get("findings", []) if j else []
        r[col] = {
            "rank": rank(fs, c.culprit, NOISE) if j else "error",
            "first": fs[0].get("title", "") if fs else "",
            "rules": [f.get("rule") for f in fs],
        }
    p = envguard(
        "doctor",
        "--python",
        str(bpy),
        "--symptom",
        c.symptom,
        "--format",
        "json",
        "-q",
        cwd=d / "proj",
        env=env,
    )
    j = parse_json(p)
    fs = j.get("findings", []) if j else []
    r["doctor"] = {
        "rank": rank(fs, c.culprit, NOISE) if j else "error",
        "rules": [f.get("rule") for f in fs],
        "note": "" if j else p.stderr.strip()[-300:],
    }
    r["run"] = score_run(c, st)
    pc = run([str(b.pip("3.11")), "--python", str(bpy), "check"], timeout=120)
    uc = run(["uv", "pip", "check", "--python", str(bpy)], timeout=120)
    pd = run(
        [
            "uvx",
            "--offline" if b.offline else "--quiet",
            "pipdeptree",
            "--python",
            str(bpy),
            "--warn",
            "fail",
        ],
        timeout=300,
    )
    r["pip_check"] = names_culprit(pc.stdout + pc.stderr, c.culprit) and pc.returncode != 0
    r["uv_check"] = names_culprit(uc.stdout + uc.stderr, c.culprit) and uc.returncode != 0
    r["pipdeptree"] = names_culprit(pd.stdout + pd.stderr, c.culprit) and pd.returncode != 0
    r["peer_output"] = {
        "pip": (pc.stdout + pc.stderr)[-400:],
        "uv": uc.stderr[-400:],
        "pipdeptree": pd.stderr[-400:],
    }
    # peers first: they read BAD as it is; bisect then builds its own trial venvs
    r["bisect"] = (
        score_bisect(c, b, d, bpy)
        if c.culprit not in MARKERS and not b.no_bisect
        else {"verdict": "n/a", "exact": None}
    )
    return r


def score_run(c: Case, st: dict[str, Any]) -> dict[str, Any]:
    """The post-failure lines `envguard run --force` printed on stderr during build (GOOD's
    lock, BAD's run)."""
    err = st.get("run_bad_stderr", "")
    if st.get("lock_rc"):
        return {
            "first": False,
            "any": False,
            "lines": [],
            "note": "lock failed: " + st.get("lock_err", ""),
        }
    tail = err.split("Traceback (most recent call last)")[-1].splitlines()
    post = [ln for ln in tail if ln.startswith("envguard")]
    first = next(
        (ln for ln in post if re.match(r"envguard: +(\d+\.|-|\*|\[)", ln)), post[0] if post else ""
    )
    lumped = any(names_culprit(first, n) for n in NOISE)
    return {
        "rc": st.get("run_bad_rc"),
        "first": bool(first) and names_culprit(first, c.culprit) and not lumped,
        "any": any(names_culprit(ln, c.culprit) for ln in post),
        "lines": post[:8],
    }


def score_bisect(c: Case, b: Builder, d: Path, bpy: Path) -> dict[str, Any]:
    bw = b.cache.parent / "bisect-work"
    bw.mkdir(exist_ok=True)
    p = envguard(
        "bisect",
        str(d / "good.json"),
        str(d / "bad.json"),
        "--python",
        str(bpy),
        "--find-links",
        str(b.cache),
        "--no-index",
        "--timeout",
        "120",
        "--workdir",
        str(bw),
        "--format",
        "json",
        "--",
        "python",
        *c.command[1:],
        cwd=d / "proj",
        timeout=1500,
    )
    j = parse_json(p)
    if not j:
        return {
            "verdict": f"error rc={p.returncode}",
            "exact": False,
            "note": p.stderr.strip()[-200:],
        }
    ids = [str(x.get("id", "")).lower() for x in j.get("culprits", [])]
    return {
        "verdict": j.get("verdict"),
        "culprits": ids,
        "exact": ids == [c.culprit.lower()],
        "reason": j.get("reason", ""),
    }


def bisect_cell(bis: dict[str, Any], culprit: str) -> str:
    if bis["exact"] is None:
        return "n/a"
    ids = bis.get("culprits", [])
    if bis["exact"]:
        return "exact"
    return (
        f"culprit + {', '.join(i for i in ids if i != culprit.lower())}"
        if culprit.lower() in ids
        else str(bis["verdict"])
    )


def pct(n: int, total: int) -> str:
    return f"{n}/{total} ({100 * n // max(total, 1)}%)"


def table(cases: list[Case], res: list[dict[str, Any]]) -> str:
    by = {c.id: c for c in cases}
    head = (
        "| case | report | user's error (shortened) | culprit | baseline | reproduces "
        "| diff+symptom | diff "
        "| doctor | run | bisect | pip check | uv check | pipdeptree |\n|" + "---|" * 14
    )
    rows = [head]
    yes = lambda v: "yes" if v else "no"  # noqa: E731
    for r in res:
        c = by[r["id"]]
        m = re.search(r"github\.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)", c.report)
        ref = f"[{m[1]}#{m[2]}]({c.report})" if m else c.report
        err = (c.symptom[:70] + "…" if len(c.symptom) > 70 else c.symptom).replace("|", "\\|")
        bis = r["bisect"]
        rows.append(
            f"| {c.id} | {ref} | `{err}` | {c.culprit} | {yes(c.baseline_needed)} "
            f"| {yes(r['reproduces'])} "
            f"| {r['diff_symptom']['rank']} | {r['diff']['rank']} | {r['doctor']['rank']} "
            f"| {'first' if r['run']['first'] else ('named' if r['run'].get('any') else 'no')} "
            f"| {bisect_cell(bis, c.culprit)} "
            f"| {yes(r['pip_check'])} | {yes(r['uv_check'])} | {yes(r['pipdeptree'])} |"
        )
    rep = [r for r in res if r["reproduces"]]
    n = len(rep)
    bis = [r for r in rep if r["bisect"]["exact"] is not None]
    tot = {
        "diff --symptom: culprit first": sum(r["diff_symptom"]["rank"] == "1" for r in rep),
        "diff: culprit first": sum(r["diff"]["rank"] == "1" for r in rep),
        "doctor: culprit first": sum(r["doctor"]["rank"] == "1" for r in rep),
        "doctor: culprit named": sum(r["doctor"]["rank"] not in ("-", "error") for r in rep),
        "run post-failure: culprit first": sum(bool(r["run"]["first"]) for r in rep),
        "pip check names culprit": sum(r["pip_check"] for r in rep),
        "uv pip check names culprit": sum(r["uv_check"] for r in rep),
        "pipdeptree --warn fail names culprit": sum(r["pipdeptree"] for r in rep),
    }
    lines = [
        "",
        f"Totals over the {n} cases that reproduce (of {len(res)}):",
        "",
        "| tool | score |",
        "|---|---|",
    ]
    lines += [f"| {k} | {pct(v, n)} |" for k, v in tot.items()]
    lines.append(
        "| bisect: exact culprit (package cases) | "
        f"{pct(sum(bool(r['bisect']['exact']) for r in bis), len(bis))} |"
    )
    found = sum(
        c.culprit.lower() in r["bisect"].get("culprits", []) for r in bis for c in [by[r["id"]]]
    )
    lines.append(f"| bisect: culprit among the culprits found | {pct(found, len(bis))} |")
    return "\n".join(rows + lines) + "\n"


SECTION = "## Real breakages rebuilt from PyPI"


def write_markdown(path: Path, body: str, res: list[dict[str, Any]]) -> None:
    text = path.read_text() if path.exists() else ""
    text = text.split("\n" + SECTION)[0].rstrip("\n")
    fails = [
        f"- `{r['id']}`: the case did not reproduce; BAD's last error line: `{r['bad_last_line']}`"
        for r in res
        if not r["reproduces"]
    ]
    intro = (
        f"\n\n{SECTION}\n\n"
        "Each row is a breakage a user reported, rebuilt by `benchmarks/cases_pypi.py` from "
        "the real PyPI wheels in real uv venvs (Python 3.11): GOOD has the pins and five old "
        "unrelated packages, BAD is GOOD after the user's step plus five unrelated upgrades. "
        "The command passes in GOOD and fails in BAD with the user's own error line (checked "
        "on every build). Columns: the culprit's rank among the findings (`diff` with and "
        "without `--symptom`, `doctor --symptom` on BAD alone; `-` = not named); `run`: the "
        "post-failure lines of `envguard run --force` (lock of GOOD, command run in BAD); "
        "`bisect`: exact culprit found offline from the wheel cache; peers: does `pip check` "
        "/ `uv pip check` / `pipdeptree --warn fail` name the culprit. `baseline`: whether "
        "only a before/after comparison can show the cause. Rebuild with `python "
        "benchmarks/cases_pypi.py build` then `score --markdown docs/CASES.md`."
        "\n\n"
    )
    extra = ("\n" + "\n".join(fails) + "\n") if fails else ""
    path.write_text(text + intro + body + extra)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("action", choices=["build", "score"])
    ap.add_argument("--offline", action="store_true", help="only the wheel cache (uv --no-index)")
    ap.add_argument("--only", action="append", default=[], help="a case id (repeatable)")
    ap.add_argument("--cache", type=Path, default=HOME / "wheels")
    ap.add_argument("--work", type=Path, default=HOME / "work")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-bisect", action="store_true", help="score without bisect (fast)")
    a = ap.parse_args()
    cases, noise = load()
    cases = [c for c in cases if not a.only or c.id in a.only]
    b = Builder(a.cache.expanduser(), a.work.expanduser(), a.offline)
    b.no_bisect = a.no_bisect
    res: list[dict[str, Any]] = []
    for c in cases:
        try:
            r = b.build(c, noise) if a.action == "build" else score(c, b)
        except (RuntimeError, OSError, StopIteration, json.JSONDecodeError) as e:
            print(f"{c.id}: error: {e}", file=sys.stderr)
            continue
        res.append(r)
        if a.action == "build":
            tag = (
                "reproduces"
                if r["reproduces"]
                else f"DOES NOT reproduce (good rc {r['good_rc']}, {r['good_tail']})"
            )
            print(f"{c.id}: {tag}; BAD's last line: {r['bad_last_line'][:150]}", flush=True)
        else:
            print(
                f"{c.id}: diff+s {r['diff_symptom']['rank']} diff {r['diff']['rank']} "
                f"doctor {r['doctor']['rank']} run {r['run']['first']} "
                f"bisect {r['bisect'].get('exact')} pip {r['pip_check']} uv {r['uv_check']} "
                f"deptree {r['pipdeptree']}",
                flush=True,
            )
    if a.action == "score" and res:
        body = table(cases, res)
        print(body)
        if a.markdown:
            write_markdown(a.markdown, body, res)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0 if res else 1


if __name__ == "__main__":
    sys.exit(main())
