"""The layers of DESIGN.md hold: each folder imports only the folders it may, and no module
imports itself back through others, function-level imports included (read with `ast`, so
an import inside a function counts as much as one at the top). The table below is the one
docs/layout.md shows; a test keeps the two the same."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"engine": "engine", "kernels": "kernels", "schemas": "schemas", "store": "store",
           "transport": "transport", "consumers": "consumers", "producers": "producers",
           "api": "api", "migrations": "migrations", "cli": "inflight/cli"}

# The engine's dependency-free definitions, the only part of the engine the wire (and what
# stands on the wire alone) may import: SamplingParams and the error tree.
ENGINE_DEFINITIONS = {"engine.errors", "engine.sampling_params"}

# folder -> the folders it may import (DESIGN.md, "Where things live"). The wire takes
# the engine's dependency-free modules (errors, SamplingParams), never the engine proper;
# transport (Kafka clients, the partitioner) takes the wire only (Settings, the errors).
MAY_IMPORT = {
    "kernels": set(),
    "engine": {"kernels"},
    "schemas": ENGINE_DEFINITIONS,
    "store": {"schemas"} | ENGINE_DEFINITIONS,
    "transport": {"schemas"},
    "consumers": {"engine", "kernels", "schemas", "store", "transport"},
    "producers": {"schemas", "store", "transport"} | ENGINE_DEFINITIONS,
    "api": {"producers", "store", "schemas", "transport"} | ENGINE_DEFINITIONS,
    "migrations": {"store", "schemas"},
    "cli": set(FOLDERS) - {"cli"},
}


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for folder, rel in FOLDERS.items():
        for path in (ROOT / rel).rglob("*.py"):
            parts = list(path.relative_to(ROOT / rel).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(["inflight", folder, *parts])] = path
    return mods


def _imports(path: pathlib.Path, name: str, is_pkg: bool) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("inflight.")}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        targets = set()
        for imp in _imports(path, name, path.name == "__init__.py"):
            while imp and imp not in mods:  # `from pkg import name` names an attribute
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                targets.add(imp)
        graph[name] = targets
    return graph


def _folder(module: str) -> str:
    return module.split(".")[1]


def _allowed(src: str, dst: str) -> bool:
    if _folder(src) == _folder(dst):
        return True
    rel = dst.removeprefix("inflight.")
    return any(rel == a or rel.startswith(a + ".") for a in MAY_IMPORT[_folder(src)])


def test_each_folder_imports_only_what_its_layer_may():
    bad = sorted(f"{s} -> {d}" for s, ds in _graph().items() for d in ds if not _allowed(s, d))
    assert not bad, "imports across layers that DESIGN.md does not allow:\n" + "\n".join(bad)


def test_the_wire_takes_nothing_of_the_engine_but_its_definitions():
    """What schemas reaches of the engine, following every import (function-level ones
    too): SamplingParams and the error tree, and the torch-free modules they stand on to
    check a constraint (structured outputs, the grammar check); none of them imports torch
    or the kernels."""
    graph = _graph()
    seen, todo = set(), [m for m in graph if _folder(m) == "schemas"]
    while todo:
        for dst in graph[todo.pop()]:
            if _folder(dst) == "engine" and dst not in seen:
                seen.add(dst)
                todo.append(dst)
    direct = {d.removeprefix("inflight.") for m in graph if _folder(m) == "schemas"
              for d in graph[m] if _folder(d) == "engine"}
    assert direct == ENGINE_DEFINITIONS
    assert seen == {"inflight.engine.errors", "inflight.engine.sampling_params",
                    "inflight.engine.structured_outputs", "inflight.engine.grammar"}
    mods = _modules()
    for name in seen:
        tree = ast.parse(mods[name].read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in names if m.split(".")[0] == "torch"}, name
        assert not any(d.startswith("inflight.kernels") for d in graph[name]), name


def test_the_docs_show_this_table():
    """docs/layout.md's "may import" column is MAY_IMPORT (the engine's definitions are
    written there as `engine.errors`, `engine.sampling_params`)."""
    rows = {}
    for line in (ROOT / "docs" / "layout.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        folder = cells[0].strip("`").rstrip("/").removeprefix("inflight/")
        if len(cells) == 3 and folder in FOLDERS:
            rows[folder] = {w.strip("`,") for w in cells[2].split() if w.startswith("`")}
    assert rows == MAY_IMPORT


def test_no_import_cycles():
    graph = _graph()
    # a package's __init__ importing its own submodules is not a cycle of behaviour
    edges = {s: {d for d in ds if d.rpartition(".")[0] != s} for s, ds in graph.items()}
    assert not _cycles(edges), f"import cycles: {_cycles(edges)}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def test_the_checks_see_imports_and_cycles():
    graph = _graph()
    assert sum(map(len, graph.values())) > 300  # function-level imports are read too
    assert "inflight.engine.errors" in graph["inflight.schemas.errors"]
    assert "inflight.transport.kafka_clients" in graph["inflight.consumers.kafka_io"]
    assert not _allowed("inflight.transport.kafka_clients", "inflight.consumers.kafka_io")
    assert any(d.startswith("inflight.kernels") for d in graph["inflight.engine.model"])
    assert not _allowed("inflight.engine.model", "inflight.schemas.errors")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
