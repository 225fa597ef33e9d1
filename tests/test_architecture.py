"""The shape of the code: no import cycles, no module over 400 lines, no ``utils``, layers.

Imports are read with ``ast`` from every module of ``envguard`` and ``dflash``, also
those inside functions and under ``TYPE_CHECKING`` (a dependency either way), with
relative imports resolved. ``from pkg import name`` counts as an import of
``pkg.name`` when that is a module of the project, else of ``pkg``. Importing
``pkg.sub`` is not counted as importing ``pkg`` itself (Python runs ``pkg/__init__.py``
first, but that is the package's face, not a dependency of the importer).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400

Graph = Mapping[str, set[str]]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder under ``root``), by dotted name."""
    return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterable[tuple[str, str | None]]:
    """(module, name or None) for every import statement anywhere in ``node``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            for alias in n.names:
                yield alias.name, None
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (n.level - 1)] if n.level > 1 else base
                target = ".".join([*base, *([n.module] if n.module else [])])
            else:
                target = n.module or ""
            for alias in n.names:
                yield target, alias.name


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    mods: dict[str, Path] = {}
    for package in packages:
        mods.update(modules_of(root, package))
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        edges: set[str] = set()
        for target, imported in _imported(tree, name, path.name == "__init__.py"):
            if imported is not None and f"{target}.{imported}" in mods:
                edges.add(f"{target}.{imported}")
            elif target in mods:
                edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or None. Depth-first, iterative."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path: list[str] = [start]
        stack = [iter(sorted(graph.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def _explain(cycle: list[str] | None) -> str:
    return "import cycle: " + " -> ".join(cycle or [])


# ------------------------------------------------------------------------ the finder itself

def test_find_cycle_on_small_graphs() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"x": {"y", "z"}, "y": {"z"}, "z": {"y"}}) == ["y", "z", "y"]


def test_a_planted_cycle_through_a_function_level_relative_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import low\n")
    (pkg / "top.py").write_text("from pkg.sub import low\n")
    (pkg / "sub" / "low.py").write_text("def f():\n    from .. import top\n    return top\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.sub.low"] == {"pkg.top"}
    assert graph["pkg.sub"] == {"pkg.sub.low"}
    assert find_cycle(graph) == ["pkg.sub.low", "pkg.top", "pkg.sub.low"]
    (pkg / "sub" / "low.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(tmp_path, ["pkg"])) is None


# ------------------------------------------------------------------------ the project

@pytest.mark.parametrize("package", ["envguard", "dflash"])
def test_no_import_cycle(package: str) -> None:
    graph = import_graph(ROOT, ["envguard", "dflash"])
    cycle = find_cycle({m: t for m, t in graph.items() if m.split(".")[0] == package})
    assert cycle is None, _explain(cycle)


@pytest.mark.parametrize("package", ["envguard", "dflash"])
def test_no_module_over_400_lines(package: str) -> None:
    long = {name: n for name, p in modules_of(ROOT, package).items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


@pytest.mark.parametrize("package", ["envguard", "dflash"])
def test_no_file_or_folder_named_utils(package: str) -> None:
    found = [str(p.relative_to(ROOT)) for p in (ROOT / package).rglob("*")
             if p.name.lower().startswith("utils") and "__pycache__" not in p.parts]
    assert not found, f"name what the code does instead: {found}"


def commands_by_module(root: Path) -> dict[str, list[str]]:
    """``envguard.cli.<module>`` -> the commands its ``add_parsers(sub)`` adds to ``sub``
    (``sub.add_parser("name", ...)``; a sub-command, added to another parser, not counted),
    for every module of ``envguard.cli`` that has an ``add_parsers``."""
    found: dict[str, list[str]] = {}
    for name, path in modules_of(root, "envguard").items():
        if not name.startswith("envguard.cli."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in tree.body:
            if not (isinstance(func, ast.FunctionDef) and func.name == "add_parsers"
                    and func.args.args):
                continue
            sub = func.args.args[0].arg
            found[name] = [call.args[0].value for call in ast.walk(func)
                           if isinstance(call, ast.Call) and call.args
                           and ast.unparse(call.func) == f"{sub}.add_parser"
                           and isinstance(call.args[0], ast.Constant)]
    return found


def test_each_command_has_its_own_module(tmp_path: Path) -> None:
    """``envguard <command>`` is defined by ``envguard/cli/<command>.py`` and by no other
    module (``COMMANDS`` in ``envguard.cli.program`` imports only that one to run it); what
    commands share lives in ``program``, ``output`` and ``options``."""
    from envguard.cli.program import COMMANDS

    assert commands_by_module(ROOT) == {f"envguard.cli.{c.replace('-', '_')}": [c]
                                        for c in COMMANDS}
    planted = tmp_path / "envguard" / "cli" / "gate.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("def add_parsers(sub):\n    sub.add_parser('lock')\n"
                       "    chk = sub.add_parser('check')\n"
                       "    chk.add_subparsers().add_parser('deep')\n", encoding="utf-8")
    assert commands_by_module(tmp_path) == {"envguard.cli.gate": ["lock", "check"]}


LOWER = ("envguard.errors", "envguard.exitcodes", "envguard.paths", "envguard.atomic",
         "envguard.validation", "envguard.model", "envguard.units", "envguard.snapshot_file",
         "envguard.toml_write", "envguard.changes", "envguard.probe", "envguard.explain",
         "envguard.input_file", "envguard.redact", "envguard.redact_forms",
         "envguard.redact_names", "envguard.redact_shapes")
UPPER = ("envguard.cli", "envguard.api", "envguard.integrations", "envguard.doctor",
         "envguard.history", "envguard.gate",
         "envguard.restore", "envguard.bisection", "envguard.cache",
         "envguard.fleet", "envguard.render")


def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_lower_layers_never_import_the_commands() -> None:
    """The collectors and the diff engine know nothing of gates, stores or renderers."""
    graph = import_graph(ROOT, ["envguard"])
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if _within(m, LOWER)
                    for t in targets if _within(t, UPPER))
    assert not upward, upward


def test_only_the_cli_imports_the_cli() -> None:
    graph = import_graph(ROOT, ["envguard"])
    callers = sorted(f"{m} -> {t}" for m, targets in graph.items()
                     if not _within(m, ("envguard.cli", "envguard.__main__"))
                     for t in targets if _within(t, ("envguard.cli",)))
    assert not callers, callers


FASTPATH = ("envguard.probe.fastpath",)
SNAPSHOT = ("envguard.probe.collector", "envguard.probe.distributions",
            "envguard.probe.integrity", "envguard.probe.interpreter")
"""What the fast path speeds up: the collector, the scan of dist-info folders, the RECORD
check and the interpreter probe."""


def test_the_fast_path_sits_below_what_it_speeds_up() -> None:
    """``envguard.probe.fastpath`` (memo files, stat-ahead) is used by the snapshot's
    modules and never uses them: stat-ahead runs before they are imported."""
    graph = import_graph(ROOT, ["envguard"])
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if _within(m, FASTPATH)
                    for t in targets if _within(t, SNAPSHOT))
    assert not upward, upward
    assert not (ROOT / "envguard" / "probe" / "memo").exists()  # the old name is gone


def _frozen_dataclasses(root: Path) -> list[str]:
    """``module:Class`` of every class decorated ``@dataclass(frozen=True, ...)``."""
    found = []
    for name, path in modules_of(root, "envguard").items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("dataclass")
                        and any(k.arg == "frozen" and ast.unparse(k.value) == "True"
                                for k in deco.keywords)):
                    found.append(f"{name}:{node.name}")
    return found


def test_records_are_frozen_not_frozen_dataclasses(tmp_path: Path) -> None:
    """One mechanism for records: ``@frozen`` (envguard/frozen.py), whose classes load in
    a third of a frozen dataclass's time in front of every guarded launch."""
    assert not _frozen_dataclasses(ROOT)
    planted = tmp_path / "envguard" / "planted.py"
    planted.parent.mkdir()
    planted.write_text("import dataclasses\n\n@dataclasses.dataclass(frozen=True)\n"
                       "class Late:\n    x: int\n", encoding="utf-8")
    assert _frozen_dataclasses(tmp_path) == ["envguard.planted:Late"]


def explain_rule_modules(root: Path) -> set[str]:
    """The modules of ``envguard.explain`` that hold diff rules: those with a top-level
    ``RULES`` (what ``envguard.explain.engine`` collects into ``ALL_RULES``)."""
    found = set()
    for name, path in modules_of(root, "envguard").items():
        if not name.startswith("envguard.explain."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, (ast.Assign, ast.AnnAssign))
               and any(isinstance(t, ast.Name) and t.id == "RULES"
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
               for n in tree.body):
            found.add(name)
    return found


def test_the_doctor_never_imports_a_diff_rule_module() -> None:
    """What the doctor shares with the diff rules lives in neutral modules
    (``explain.tables``: data; ``explain.queries``: facts and findings both build;
    ``explain.remedies``: commands); a rule module is the diff's own."""
    rules = explain_rule_modules(ROOT)
    assert rules == {f"envguard.explain.{m}"
                     for m in ("caches", "conda", "environment", "packages", "torch")}
    graph = import_graph(ROOT, ["envguard"])
    direct = sorted(f"{m} -> {t}" for m, targets in graph.items()
                    if _within(m, ("envguard.doctor",)) for t in targets if t in rules)
    assert not direct, direct


def test_every_report_in_the_render_table_has_text_markdown_and_json() -> None:
    """One table from report type to module (``envguard.render.MODULES``); every module of
    it renders all three formats, so a new format cannot silently fall back to text."""
    import importlib

    from envguard.render import MODULES, OutputFormat, renderer

    assert len(set(MODULES.values())) == 12
    for kind, name in MODULES.items():
        module = importlib.import_module(f"envguard.render.{name}")
        for fmt in OutputFormat:
            chosen = renderer(module, fmt)  # type: ignore[arg-type]
            assert callable(chosen), (kind, fmt)
            assert chosen.__module__ == module.__name__, (kind, fmt)
            assert chosen.__name__ == fmt.name.lower(), (kind, fmt)


def _output_format_branches(root: Path) -> list[str]:
    """``module:function`` of every place in ``envguard.render`` that names a member of
    ``OutputFormat`` (``OutputFormat.JSON``) or compares with a format's name (``"json"``)."""
    names = {f.lower() for f in ("TEXT", "JSON", "MARKDOWN")}
    found: set[str] = set()

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            where = f"{where.split(':')[0]}:{node.name}"
        if ((isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
             and node.value.id == "OutputFormat")
                or (isinstance(node, ast.Compare)
                    and any(isinstance(c, ast.Constant) and c.value in names
                            for c in (node.left, *node.comparators)))):
            found.add(where)
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    for name, path in modules_of(root, "envguard").items():
        if name == "envguard.render" or name.startswith("envguard.render."):
            visit(ast.parse(path.read_text(encoding="utf-8")), f"{name}:<module>")
    return sorted(found)


def test_the_dispatch_is_the_only_branch_on_output_format_in_render(tmp_path: Path) -> None:
    """``envguard.render.renderer`` is the one place that chooses by format: a ``match`` over
    ``OutputFormat`` that ends in ``assert_never``, so mypy proves it exhaustive."""
    found = _output_format_branches(ROOT)
    assert found == ["envguard.render:renderer"], found
    init = (ROOT / "envguard" / "render" / "__init__.py").read_text(encoding="utf-8")
    func = next(n for n in ast.walk(ast.parse(init))
                if isinstance(n, ast.FunctionDef) and n.name == "renderer")
    assert any(isinstance(n, ast.Call) and ast.unparse(n.func) == "assert_never"
               for n in ast.walk(func))
    planted = tmp_path / "envguard" / "render" / "late.py"
    planted.parent.mkdir(parents=True)
    planted.write_text('def json_or_text(fmt: str) -> str:\n'
                       '    return "{}" if fmt == "json" else ""\n', encoding="utf-8")
    assert _output_format_branches(tmp_path) == ["envguard.render.late:json_or_text"]


# Tests mirror the code: tests/envguard/<package>/ for envguard/<package>/ (top-level modules
# and attacks that cross packages at tests/envguard/), tests/dflash/ for dflash/, tests/cases/
# for whole breakages rebuilt end to end. At tests/ itself only checks of the project as a
# whole, and the shared fixtures.
PROJECT_WIDE = frozenset({"test_architecture.py", "test_readme.py"})
SCENARIOS = "cases"


def misplaced_tests(root: Path) -> list[str]:
    """Test modules whose folder names no package of the code, or that sit at tests/ without
    being a check of the whole project."""
    tests = root / "tests"
    wrong = []
    for path in sorted(tests.rglob("test_*.py")):
        folder = path.parent.relative_to(tests)
        parts = folder.parts
        if not parts:
            ok = path.name in PROJECT_WIDE
        elif parts[0] == SCENARIOS:
            ok = len(parts) == 1
        else:
            ok = (root / folder / "__init__.py").is_file()
        if not ok:
            wrong.append(str(path.relative_to(root)))
    return wrong


def test_tests_mirror_the_packages() -> None:
    assert misplaced_tests(ROOT) == []


def test_a_test_outside_the_mirror_is_named(tmp_path: Path) -> None:
    for name in ("envguard/__init__.py", "envguard/probe/__init__.py",
                 "tests/envguard/probe/test_ok.py", "tests/envguard/test_top.py",
                 "tests/cases/test_case.py", "tests/test_architecture.py",
                 "tests/test_stray.py", "tests/envguard/nosuch/test_lost.py",
                 "tests/cases/deep/test_deep.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert misplaced_tests(tmp_path) == ["tests/cases/deep/test_deep.py",
                                         "tests/envguard/nosuch/test_lost.py",
                                         "tests/test_stray.py"]
