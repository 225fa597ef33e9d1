"""The corpus stage: every ``*.py`` under the roots, split by file into train and held-out."""

from __future__ import annotations

import hashlib
import json
import math
import os
import site
import sysconfig
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from realtarget.run import (
    ORDER_SALT,
    PRUNED_DIRS,
    SPLIT_SALT,
    Run,
    log,
    unit_hash,
    write_json_atomic,
)


# -- corpus -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CorpusRoot:
    label: str
    path: str


@dataclass(frozen=True, slots=True)
class Candidate:
    rel: str
    """``<root label>/<path inside the root>``: what the split hashes."""
    path: str
    size: int


@dataclass(frozen=True, slots=True)
class Doc:
    rel: str
    split: str
    text: str


def default_root_paths() -> list[str]:
    paths = [sysconfig.get_paths()["stdlib"], *site.getsitepackages(),
             sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    user = site.getusersitepackages()
    return [*paths, user] if isinstance(user, str) else paths


def label_roots(paths: Sequence[str]) -> list[CorpusRoot]:
    """Existing folders, each once (by real path); labels ``stdlib``, then folder names."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    roots: list[CorpusRoot] = []
    labels: Counter[str] = Counter()
    for raw in paths:
        real = os.path.realpath(raw)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        base = "stdlib" if real == stdlib else os.path.basename(real.rstrip("/")) or "root"
        labels[base] += 1
        label = base if labels[base] == 1 else f"{base}-{labels[base]}"
        roots.append(CorpusRoot(label, real))
    return roots


def scan_root(root: CorpusRoot, other_roots: set[str]) -> Iterator[Candidate]:
    for dirpath, dirnames, filenames in os.walk(root.path):
        dirnames[:] = sorted(d for d in dirnames if d not in PRUNED_DIRS
                             and os.path.join(dirpath, d) not in other_roots)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if not name.endswith(".py") or os.path.islink(full):
                continue
            try:
                size = os.stat(full).st_size
            except OSError:
                continue
            rel = os.path.relpath(full, root.path).replace(os.sep, "/")
            yield Candidate(f"{root.label}/{rel}", full, size)


def read_source(path: str, max_bytes: int, max_line: int) -> tuple[str | None, str]:
    """The file's text, or None and why it is left out."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None, "unreadable"
    if not raw.strip():
        return None, "empty"
    if len(raw) > max_bytes:
        return None, "too_large"
    if b"\0" in raw:
        return None, "nul_bytes"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not_utf8"
    if max(map(len, text.split("\n"))) > max_line:
        return None, "long_lines"  # generated tables, embedded blobs
    return text, "ok"


def split_of(rel: str, fraction: float) -> str:
    return "heldout" if unit_hash(SPLIT_SALT, rel) < fraction else "train"


def select_docs(candidates: list[Candidate], *, cap_bytes: float, fraction: float,
                max_bytes: int, max_line: int) -> tuple[list[Doc], list[dict[str, Any]],
                                                        Counter[str], dict[str, list[str]]]:
    """Read candidates in hash order until ``cap_bytes`` of kept text; drop duplicates
    (the first copy in that order stays, with its own split)."""
    order = sorted(candidates, key=lambda c: unit_hash(ORDER_SALT, c.rel))
    docs: list[Doc] = []
    entries: list[dict[str, Any]] = []
    reasons: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    seen: set[str] = set()
    kept = 0
    with ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 1) * 2)) as pool:
        for start in range(0, len(order), 512):
            if kept >= cap_bytes:
                reasons["over_cap"] += len(order) - start
                break
            chunk = order[start:start + 512]
            texts = pool.map(lambda c: read_source(c.path, max_bytes, max_line), chunk)
            for i, (cand, (text, why)) in enumerate(zip(chunk, texts, strict=True)):
                if kept >= cap_bytes:
                    reasons["over_cap"] += len(chunk) - i
                    break
                digest = hashlib.sha1(text.encode("utf-8")).hexdigest() if text else ""
                if text is not None and digest in seen:
                    why = "duplicate"
                if why != "ok" or text is None:
                    reasons[why] += 1
                    if len(examples.setdefault(why, [])) < 10:
                        examples[why].append(cand.rel)
                    continue
                seen.add(digest)
                split = split_of(cand.rel, fraction)
                docs.append(Doc(cand.rel, split, text))
                entries.append({"path": cand.rel, "bytes": len(text.encode("utf-8")),
                                "split": split, "sha1": digest})
                kept += entries[-1]["bytes"]
    return docs, entries, reasons, examples


def check_split(entries: list[dict[str, Any]]) -> dict[str, int]:
    """No held-out file (by path or by content) is a training file."""
    by_split: dict[str, set[str]] = {"train": set(), "heldout": set()}
    sha: dict[str, set[str]] = {"train": set(), "heldout": set()}
    for e in entries:
        by_split[e["split"]].add(e["path"])
        sha[e["split"]].add(e["sha1"])
    assert not by_split["train"] & by_split["heldout"], "a file is in both splits"
    assert not sha["train"] & sha["heldout"], "a held-out file's content is in training"
    assert by_split["heldout"], "no held-out files: raise --heldout-fraction"
    return {"train_files": len(by_split["train"]), "heldout_files": len(by_split["heldout"])}


def stage_corpus(run: Run) -> dict[str, Any]:
    roots = label_roots(run.args.corpus_root or default_root_paths())
    if not roots:
        raise SystemExit("real_target: no corpus root exists")
    real_roots = {r.path for r in roots}
    candidates: list[Candidate] = []
    found: dict[str, dict[str, Any]] = {}
    for root in roots:
        files = list(scan_root(root, real_roots - {root.path}))
        found[root.label] = {"path": root.path, "py_files": len(files),
                             "py_bytes": sum(c.size for c in files)}
        candidates.extend(files)
    log("corpus", f"{len(candidates)} .py files, {sum(c.size for c in candidates) / 1e6:.0f} MB"
                  f" under {[r.path for r in roots]}")
    cap_mb = run.args.max_corpus_mb if run.args.max_corpus_mb is not None \
        else run.size.max_corpus_mb
    docs, entries, reasons, examples = select_docs(
        candidates, cap_bytes=math.inf if cap_mb is None else cap_mb * 1e6,
        fraction=run.args.heldout_fraction, max_bytes=run.args.max_file_kb * 1024,
        max_line=run.args.max_line)
    counts = check_split(entries)
    run.memo["docs"] = docs
    per_root: dict[str, dict[str, int]] = {}
    for e in entries:
        r = per_root.setdefault(e["path"].split("/", 1)[0],
                                {"files": 0, "bytes": 0, "heldout_files": 0})
        r["files"] += 1
        r["bytes"] += e["bytes"]
        r["heldout_files"] += e["split"] == "heldout"
    split_bytes = Counter[str]()
    for e in entries:
        split_bytes[e["split"]] += e["bytes"]
    rule = (f"held out iff int(sha256('{SPLIT_SALT}' + path)[:8 bytes]) / 2**64 < "
            f"{run.args.heldout_fraction}; path = '<root label>/<path in root>'")
    write_json_atomic(run.work / "manifest.json", {
        "roots": {r.label: r.path for r in roots}, "split_rule": rule,
        "order_rule": f"files read in order of sha256('{ORDER_SALT}' + path) until the cap",
        "files": entries}, indent=None)
    return {"roots": found, "kept": per_root, "files": len(entries),
            "bytes": sum(split_bytes.values()), "train_bytes": split_bytes["train"],
            "heldout_bytes": split_bytes["heldout"], **counts,
            "left_out": dict(reasons), "left_out_examples": examples,
            "max_corpus_mb": cap_mb, "heldout_fraction": run.args.heldout_fraction,
            "split_rule": rule, "checks": "no path or content in both splits (asserted)"}


def corpus_docs(run: Run) -> list[Doc]:
    """The kept files, from this process or re-read through WORK/manifest.json."""
    if "docs" not in run.memo:
        manifest = json.loads((run.work / "manifest.json").read_text(encoding="utf-8"))
        docs = []
        for e in manifest["files"]:
            label, rest = e["path"].split("/", 1)
            text = Path(manifest["roots"][label], rest).read_bytes().decode("utf-8")
            if hashlib.sha1(text.encode("utf-8")).hexdigest() != e["sha1"]:
                raise SystemExit(f"real_target: {e['path']} changed since the corpus stage")
            docs.append(Doc(e["path"], e["split"], text))
        run.memo["docs"] = docs
    docs_: list[Doc] = run.memo["docs"]
    return docs_


