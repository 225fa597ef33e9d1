"""envguard's shared knowledge exists once: in envguard/explain/tables.py.

Every module of ``envguard`` is parsed with ``ast`` (dflash has tables of its own: the
import names of its extra, say); none but the tables
module may assign a table's name (or a name a table had before it moved there), hold a
literal collection with a table's members (or three or more of them and nothing else), or
repeat one of the tables' long texts. The tables keep what the two lists of serving
stacks matched before they became one, and importing them (as the gate does before every
launch) loads no diff rule.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import envguard

ROOT = Path(envguard.__file__).resolve().parent.parent
"""The checkout under test (the envguard imported, not necessarily this file's)."""
TABLES_FILE = ROOT / "envguard" / "explain" / "tables.py"
FORMER_NAMES = {"FOREIGN_STACKS", "CORE", "_TORCH_OWNED", "_CUDA_SUFFIX_RE",
                "_TRACKS_CUDA_MAJOR", "_UNSUFFIXED_CUDA"}
"""What the tables were called in the modules they came from."""


def _tables() -> dict[str, frozenset[str]]:
    """Every string table of envguard.explain.tables, by name, as a set of members."""
    from envguard.explain import tables

    found: dict[str, frozenset[str]] = {}
    for name in tables.__all__:
        value = getattr(tables, name)
        if isinstance(value, (tuple, frozenset)) and value and all(
                isinstance(v, str) for v in value):
            found[name] = frozenset(value)
    found["SERVING_STACKS"] = frozenset(
        n for row in tables.SERVING_STACKS for n in (row[0], *row[2]))
    found["UNSUFFIXED_CUDA - TRACKS_CUDA_MAJOR"] = tables.UNSUFFIXED_CUDA - tables.TRACKS_CUDA_MAJOR
    return found


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted((ROOT / "envguard").rglob("*.py")):
        if path != TABLES_FILE:
            yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _assigned(tree: ast.Module) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Name):
                    yield t.id, node.lineno


def _string_literals(tree: ast.Module) -> Iterator[tuple[frozenset[str], int]]:
    """Literal tuples, lists and sets of two or more strings (not symptom ``keywords=``:
    they say which words of an error point at a rule, not what a package is)."""
    skip = {id(k.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
            for k in n.keywords if k.arg == "keywords"}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in skip:
            items = [e.value for e in node.elts
                     if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(items) >= 2 and len(items) == len(node.elts):
                yield frozenset(items), node.lineno


def test_every_table_is_in_the_tables_module() -> None:
    tables = _tables()
    assert {"SERVING_STACKS", "DEFAULT_FORBIDDEN", "CORE_PACKAGES", "TORCH_OWNED",
            "CUDA_WHEEL_PREFIXES", "TRACKS_CUDA_MAJOR", "UNSUFFIXED_CUDA", "CONDA_CUDA",
            "CACHE_POLICIES", "COLD_REMEDY"} <= set(tables)


def test_no_module_assigns_a_table_name_again() -> None:
    from envguard.explain import tables

    names = {n for n in tables.__all__ if n.isupper()} | FORMER_NAMES
    again = [f"{path.relative_to(ROOT)}:{line} {name}" for path, tree in _modules()
             for name, line in _assigned(tree) if name in names]
    assert again == []


def test_no_module_holds_a_copy_of_a_table() -> None:
    """Equal members, or three or more members of one table and nothing else (a copy
    with a member left out or a table cut in two)."""
    tables = _tables()
    copies = [f"{path.relative_to(ROOT)}:{line} ~ {name}"
              for path, tree in _modules() for members, line in _string_literals(tree)
              for name, table in tables.items()
              if members == table or (len(members) >= 3 and members <= table)]
    assert copies == []


def test_no_module_repeats_a_text_or_a_pattern_of_the_tables() -> None:
    from envguard.explain import tables

    texts = {*tables.COLD_REMEDY, tables.VERIFY_HASH_HINT, tables.CUDA_SUFFIX.pattern}
    stacks = {row[0] for row in tables.SERVING_STACKS}
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            named = {s for s in stacks if s in node.value}
            if node.value in texts or (len(named) >= 3 and "|" in node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


# ------------------------------------------------------------------ what they match


def test_the_serving_stacks_match_what_the_two_lists_matched() -> None:
    """The rules' names (exact, or the stack's family) and the lock's globs."""
    from envguard.explain.tables import DEFAULT_FORBIDDEN, is_serving_stack

    assert DEFAULT_FORBIDDEN == (
        "sglang*", "vllm*", "flashinfer*", "tilelang", "xformers", "tensorrt*", "lmdeploy",
        "sgl-kernel", "text-generation*", "exllamav2", "llama-cpp-python", "mlc-llm*")
    stacks = ["sglang", "sglang-router", "vllm", "vllm-flash-attn", "flashinfer-python",
              "tilelang", "xformers", "tensorrt", "tensorrt-llm", "tensorrt-cu12-libs",
              "lmdeploy", "text-generation", "text-generation-server", "exllamav2",
              "llama-cpp-python", "mlc-llm", "mlc-llm-nightly", "sgl-kernel", "outlines",
              "outlines-core", "xgrammar", "decord", "torchao", "triton-kernels"]
    others = ["sglangx", "vllmx", "text-generation-inference", "outlines-dev", "xformers-x",
              "torch", "triton", "flash-attn", "tilelang-x", "a-sglang", "torchaudio", ""]
    assert [n for n in stacks if not is_serving_stack(n)] == []
    assert [n for n in others if is_serving_stack(n)] == []
    # The lock's globs are wider for a stack with variants (a later variant is refused)
    # and leave out what also serves training.
    forbidden = [n for n in stacks + others
                 if any(fnmatch.fnmatchcase(n, p) for p in DEFAULT_FORBIDDEN)]
    assert "text-generation-inference" in forbidden and "sglangx" in forbidden
    assert not {"outlines", "outlines-core", "xgrammar", "decord", "torchao",
                "triton-kernels"} & set(forbidden)


def test_the_bundled_lock_forbids_the_default_list() -> None:
    from envguard.explain.tables import DEFAULT_FORBIDDEN
    from envguard.gate.lookup import read_lock

    for path in sorted((ROOT / "lockfiles").glob("*.toml")):
        assert read_lock(path).forbidden == DEFAULT_FORBIDDEN, path


@pytest.mark.parametrize(("text", "is_path"), [
    ("dflash-train", False), ("train.toml", True), ("lockfiles/train", True),
    ("./x", True), ("a.b", False), ("/abs/lock.toml", True)])
def test_a_lock_is_a_path_or_a_name(text: str, is_path: bool) -> None:
    from envguard.explain.tables import is_lock_path

    assert is_lock_path(text) is is_path


def test_the_gate_reads_the_tables_without_loading_a_rule() -> None:
    """``envguard.explain``'s face is lazy: the lockfile imports the tables, and a passing
    gate still imports no rule; the names of the face load on first use."""
    code = ("import sys, envguard.gate.command, envguard.explain.tables; "
            "loaded = sorted(m for m in sys.modules if m.startswith('envguard.explain.')); "
            "assert loaded == ['envguard.explain.tables'], loaded; "
            "from envguard.explain import explain, ALL_RULES, Severity, symptom_text; "
            "assert len(ALL_RULES) > 20 and 'envguard.explain.engine' in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
