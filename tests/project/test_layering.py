"""The library's import graph has no cycle: every ``import`` of a ``dossier`` module, at module
level or inside a function (both run), is an edge; imports under ``if TYPE_CHECKING:`` never
run and are left out. ``from dossier.bundle import reader`` is an edge to the submodule,
``from dossier.bundle import Bundle`` one to the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "dossier"

KNOWN: set[frozenset[str]] = set()
"""Cycles still to be broken (none): a new cycle fails, and so does one listed here once it is
broken (remove it here)."""


def _modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, minus the bodies of ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the dossier modules it imports (at run time)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in mods else base if base in mods else None
                    if target is not None and target != mod:
                        graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_detector_finds_a_cycle(tmp_path: Path) -> None:
    """The check can fail: a function-local import that closes a circle is found, one under
    TYPE_CHECKING is not."""
    pkg = tmp_path / "dossier"
    (pkg / "bundle").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bundle" / "__init__.py").write_text("")
    (pkg / "bundle" / "reader.py").write_text("from dossier.bundle import archive\n")
    (pkg / "bundle" / "archive.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dossier.bundle import "
        "tables\ndef f():\n    from dossier.bundle.reader import Bundle\n")
    (pkg / "bundle" / "tables.py").write_text("import dossier.bundle.archive\n")
    graph = import_graph(pkg)
    assert graph["dossier.bundle.archive"] == {"dossier.bundle.reader"}
    assert cycles(graph) == [frozenset({"dossier.bundle.reader", "dossier.bundle.archive"})]


def test_no_import_cycle_in_the_library() -> None:
    """No cycle at run time (function-level imports and the package root's lazy API
    included), and none either when type-checking imports count."""
    graph = import_graph()
    assert {"dossier.bundle.archive", "dossier.bundle.reader"} <= set(graph)
    assert "dossier.serve" in graph["dossier"]  # the root's lazy ``dossier.load`` counts
    found = set(cycles(graph))
    assert found - KNOWN == set(), sorted(sorted(c) for c in found - KNOWN)
    assert KNOWN - found == set(), "a known cycle is gone: remove it from KNOWN"
    typed = set(cycles(_all_imports()))
    assert typed == set(), sorted(sorted(c) for c in typed)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, package) for each import of a package that holds the importing module: such
    an import runs back up (``from dossier import __version__`` inside ``dossier.cache``
    imports the root, which lazily imports the serving API, which imports the cache)."""
    return sorted((m, t) for m, targets in graph.items() for t in targets
                  if t != m and m.startswith(t + "."))


def test_no_import_runs_back_up() -> None:
    fake = {"dossier.bundle.builder": {"dossier", "dossier.bundle.manifest"},
            "dossier.bundle.manifest": set(), "dossier": set()}
    assert upward_imports(fake) == [("dossier.bundle.builder", "dossier")]  # it can fail
    found = upward_imports(_all_imports())
    assert found == [], found


@pytest.mark.parametrize("lower, upper", [
    ("dossier.bundle.manifest", "dossier.bundle.archive"),
    ("dossier.bundle.archive", "dossier.bundle.reader"),
    ("dossier.bundle.reader", "dossier.bundle.integrity"),
    ("dossier.bundle.integrity", "dossier.bundle.pack"),
    ("dossier.bundle.builder", "dossier.bundle.writer"),
    ("dossier.bundle.builder", "dossier.backends.tensorrt.importer"),
])
def test_bundle_layers(lower: str, upper: str) -> None:
    """Each bundle layer builds on the one below and never imports one above it."""
    graph = import_graph()

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            m = todo.pop()
            if m == b:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return False

    assert reaches(upper, lower), f"{upper} does not build on {lower}"
    assert not reaches(lower, upper), f"{lower} imports {upper}, a layer above it"


# ------------------------------------------------------------------------ bundle/ and backends/
BUNDLE_BACKENDS_ALLOWED: dict[tuple[str, str], str] = {
    ("dossier.backends.tensorrt.importer", "dossier.bundle"):
        "the trtexec import describes a BundleContent and the export reads a bundle: the one "
        "backend module above bundle/, which nothing else in backends/ imports",
}
"""Edges between bundle/ and backends/ that remain, (module, package it may import) -> why. A
new edge fails, and so does one listed here once it is gone (remove it here)."""


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _crossings(graph: dict[str, set[str]], source: str, target: str,
               allowed: set[tuple[str, str]]) -> list[list[str]]:
    """For each module of package ``source`` that reaches one of package ``target`` over edges
    not ``allowed``: the shortest such chain of imports."""
    found = []
    for start in sorted(m for m in graph if _within(m, source)):
        came: dict[str, str | None] = {start: None}
        todo = [start]
        while todo:
            m = todo.pop(0)
            if _within(m, target):
                chain = [m]
                while (up := came[chain[-1]]) is not None:
                    chain.append(up)
                found.append(chain[::-1])
                break
            for w in sorted(graph.get(m, ())):
                if w not in came and not any(m == a and _within(w, b) for a, b in allowed):
                    came[w] = m
                    todo.append(w)
    return found


def test_bundle_and_backends_do_not_import_each_other() -> None:
    """bundle/ never imports backends/ and backends/ never bundle/, directly or through another
    module (at run time, function-level imports included), but for BUNDLE_BACKENDS_ALLOWED."""
    fake = {"dossier.bundle.a": {"dossier.verify"}, "dossier.verify": {"dossier.backends.x"},
            "dossier.backends.x": set()}
    assert _crossings(fake, "dossier.bundle", "dossier.backends", set()) == [
        ["dossier.bundle.a", "dossier.verify", "dossier.backends.x"]]  # the check can fail
    assert _crossings(fake, "dossier.bundle", "dossier.backends",
                      {("dossier.verify", "dossier.backends")}) == []
    graph = import_graph()
    allowed = set(BUNDLE_BACKENDS_ALLOWED)
    for source, target in (("dossier.bundle", "dossier.backends"),
                           ("dossier.backends", "dossier.bundle")):
        chains = _crossings(graph, source, target, allowed)
        assert chains == [], [" -> ".join(c) for c in chains]
    stale = [(a, b) for a, b in sorted(allowed)
             if not any(_within(w, b) for w in graph.get(a, ()))]
    assert stale == [], "an allowed edge is gone: remove it from BUNDLE_BACKENDS_ALLOWED"


# ------------------------------------------------------------------------------ private names
PRIVATE_ALLOWED: set[tuple[str, str]] = set()
"""(importer, private name) pairs still to be removed: a new one fails, and so does one listed
here once it is gone (remove it here)."""


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _owner(path: str, mods: dict[str, Path]) -> str | None:
    """The package a dotted name is private to (None for a public name): the package that
    holds its first private part (``dossier.bundle`` for ``dossier.bundle._files.x`` and for
    ``dossier.bundle.writer._stage``). The root package is the whole library, not a package
    in this sense: a private name of a top-level module is that module's own
    (``dossier.tuner`` for ``dossier.tuner._header``)."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        if _is_private(part):
            prefix = ".".join(parts[:i])
            is_package = prefix in mods and mods[prefix].name == "__init__.py"
            parent = prefix.rpartition(".")[0]
            return prefix if is_package or parent == "dossier" else parent
    return None


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]`` (None for anything but names and attributes)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


def private_uses(root: Path = ROOT) -> set[tuple[str, str]]:
    """(module, private name) for each private name of another package that a library module
    imports (``from dossier.x import _y``, ``import dossier.x._y``, ``from dossier.x._y import
    z``) or reaches as an attribute of a dossier module it imported (``confirmation._y``). Type
    checking imports count too: they couple the same."""
    mods = _modules(root)
    found: set[tuple[str, str]] = set()
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        bound: dict[str, str] = {}  # local name -> the dossier module it is
        names: list[str] = []
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "dossier":
                        names.append(a.name)
                        bound[a.asname or a.name.split(".")[0]] = \
                            a.name if a.asname else "dossier"
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                if base.split(".")[0] != "dossier":
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    names.append(full)
                    if full in mods:
                        bound[a.asname or a.name] = full
        for node in ast.walk(tree):
            parts = _dotted(node) if isinstance(node, ast.Attribute) else None
            if parts and parts[0] in bound and not isinstance(node.ctx, ast.Store):
                names.append(".".join([bound[parts[0]], *parts[1:]]))
        for name in names:
            owner = _owner(name, mods)
            if owner is not None and owner != package:
                parts = name.split(".")
                first = next(i for i, p in enumerate(parts) if _is_private(p))
                found.add((mod, ".".join(parts[: first + 1])))
    return found


def test_the_detector_finds_a_private_name(tmp_path: Path) -> None:
    """The check can fail: a private name imported, or reached through a module, from another
    package is found; one used inside its own package, or a dunder, is not."""
    pkg = tmp_path / "dossier"
    (pkg / "bundle").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '1'\n")
    (pkg / "bundle" / "__init__.py").write_text("")
    (pkg / "bundle" / "_files.py").write_text("def write(): pass\n")
    (pkg / "bundle" / "writer.py").write_text("from dossier.bundle._files import write\n")
    (pkg / "tuner.py").write_text("def _header(): pass\n")
    (pkg / "cli.py").write_text("from dossier import __version__, tuner\n"
                                "from dossier.bundle import _files\nx = tuner._header()\n")
    (pkg / "lock.py").write_text("def f():\n    from dossier.tuner import _header\n")
    assert private_uses(pkg) == {("dossier.cli", "dossier.tuner._header"),
                                 ("dossier.cli", "dossier.bundle._files"),
                                 ("dossier.lock", "dossier.tuner._header")}


def test_no_private_name_is_used_across_packages() -> None:
    found = private_uses()
    assert found - PRIVATE_ALLOWED == set(), sorted(found - PRIVATE_ALLOWED)
    assert PRIVATE_ALLOWED - found == set(), "a listed use is gone: remove it from " \
        f"PRIVATE_ALLOWED: {sorted(PRIVATE_ALLOWED - found)}"


# ------------------------------------------------------------------------------ upward imports
SEARCH = {"dossier.tuner", "dossier.retune"}
"""What runs a search: it asks the build plan, the request factory and a scheduler."""
BELOW_THE_SEARCH = ("dossier.executors", "dossier.backends", "dossier.strategies",
                    "dossier.build_plan", "dossier.jobs.requests", "dossier.jobs.builds",
                    "dossier.build_cache", "dossier.jobs.worker", "dossier.jobs.child",
                    "dossier.measure.confirmation")
"""Modules (and packages) a search uses: none of them imports what runs it, not even for type
checking (that is how the scheduler used to reach into the tuner)."""


def _all_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the dossier modules it imports, type-checking imports included."""
    mods = _modules(root)
    out: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out[mod] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                for a in node.names:
                    full = f"{base}.{a.name}"
                    target = full if full in mods else base if base in mods else None
                    if target is not None:
                        out[mod].add(target)
    return out


def _under(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def test_nothing_below_the_search_imports_it() -> None:
    graph = _all_imports()
    assert set(BELOW_THE_SEARCH) <= set(graph) and SEARCH <= set(graph)
    upward = sorted((m, t) for m, targets in graph.items() if _under(m, BELOW_THE_SEARCH)
                    for t in targets if _under(t, tuple(SEARCH)))
    assert upward == [], upward


def test_the_upward_detector_counts_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "dossier"
    (pkg / "executors").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tuner.py").write_text("")
    (pkg / "executors" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dossier.tuner import T\n")
    assert _all_imports(pkg)["dossier.executors"] == {"dossier.tuner"}
    assert import_graph(pkg)["dossier.executors"] == set()  # the cycle check leaves it out


# ------------------------------------------------------------------------------------- rooms
CLI = Path(__file__).resolve().parents[2] / "cli"

ROOM_CYCLES_KNOWN: set[frozenset[str]] = set()
"""Loops among rooms still to be broken (none): a new one fails, and so does one listed here once it
is broken (remove it here)."""


def room(module: str) -> str:
    """The room a module is in: the root package itself, a top-level module of ``dossier/``,
    a whole subpackage (``dossier.verify`` for ``dossier.verify.policy``), or ``cli``."""
    parts = module.split(".")
    return "cli" if parts[0] == "cli" else ".".join(parts[:2])


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the other rooms its modules import."""
    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        out.setdefault(room(mod), set()).update(
            room(t) for t in targets if room(t) != room(mod))
    return out


def _cli_imports() -> dict[str, set[str]]:
    """cli's modules (one room) -> the dossier modules they import at run time."""
    mods = _modules()
    out: dict[str, set[str]] = {}
    for path in sorted(CLI.glob("*.py")):
        found = out.setdefault(f"cli.{path.stem}", set())
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                base = name.rpartition(".")[0]
                target = name if name in mods else base if base in mods else None
                if target is not None:
                    found.add(target)
    return out


def test_the_detector_finds_a_loop_among_rooms(tmp_path: Path) -> None:
    """The check can fail: two packages whose modules import each other form a loop even
    though no module does (``a.x -> b.y -> a.z``); a subpackage's modules are one room."""
    pkg = tmp_path / "dossier"
    for sub in ("a", "b", "b/inner"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from dossier.b.inner import y\n")
    (pkg / "b" / "inner" / "y.py").write_text("def f():\n    from dossier.a import z\n")
    (pkg / "a" / "z.py").write_text("")
    (pkg / "top.py").write_text("import dossier.a.z\n")
    graph = import_graph(pkg)
    assert cycles(graph) == []
    rooms = room_graph(graph)
    assert rooms["dossier.top"] == {"dossier.a"}
    assert cycles(rooms) == [frozenset({"dossier.a", "dossier.b"})]


def test_no_loop_among_rooms() -> None:
    """No package-level loop: the rooms (the root, each top-level module of ``dossier/``, each
    whole subpackage, and ``cli``) import each other in one direction only, at run time
    (function-level imports included), and within the library also when type-checking
    imports count."""
    graph = {**import_graph(), **_cli_imports()}
    assert "cli.main" in graph and graph["cli.cmd_verify"]
    rooms = room_graph(graph)
    found = set(cycles(rooms))
    assert found - ROOM_CYCLES_KNOWN == set(), sorted(sorted(c) for c in found - ROOM_CYCLES_KNOWN)
    assert ROOM_CYCLES_KNOWN - found == set(), "a known loop is gone: remove it from " \
        "ROOM_CYCLES_KNOWN"
    typed = set(cycles(room_graph(_all_imports())))  # type-checking imports couple too
    assert typed == set(), sorted(sorted(c) for c in typed)
