"""The package's layers point one way: every import inside ``src/interq`` (module level or inside a function) goes
from a room to a room of a lower layer, or stays in its own room, and no two modules import each other through any
chain. docs/architecture.md describes the rooms; :data:`LAYERS` below is the table this test enforces.

The graph is read with ``ast`` from the source files, not by importing them, so it sees imports that run only on
some paths (inside functions, under ``if``) and needs none of the optional dependencies. An edge goes to the module
an import names (``from interq import kernels`` -> ``interq.kernels``, ``from interq.quant.config import
X`` -> ``interq.quant.config``); the parent packages Python runs on the way are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# room -> (layer, the module-name prefixes it holds). A module may import its own room and the rooms of lower layers;
# an import of a room in the same layer (sideways) or a higher one (up) fails. The longest matching prefix decides.
LAYERS: dict[str, tuple[int, tuple[str, ...]]] = {
    "base": (0, ("interq", "interq._optional", "interq._hf", "interq.allocator", "interq.presets", "interq.switches",
                 "interq.errors")),
    "kernels": (1, ("interq.kernels",)),
    "algo": (1, ("interq.algo",)),  # the algorithm: a leaf
    "envs": (1, ("interq.envs",)),  # environments: leaves the agent loop uses
    "models": (1, ("interq.models",)),
    "executor": (2, ("interq.quant",)),
    "rollout": (3, ("interq.rollout",)),
    "machine": (3, ("interq.machine",)),  # what a measurement ran on (reads the executor's backend choice)
    "agent": (4, ("interq.agent",)),
    "trainer": (5, ("interq.train", "interq.rundir")),  # rundir: a run directory's lock, --out checks, signals
    "integrations": (5, ("interq.integrations",)),  # verl's trainer with interq's executor and correction
    "entry": (6, ("interq.cli", "interq.__main__", "interq.selfcheck")),
}


def room_of(module: str) -> str:
    """The room of a dotted module name (the longest prefix in :data:`LAYERS`); KeyError for one outside the table."""
    best, best_len = None, -1
    for room, (_, prefixes) in LAYERS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = room, len(p)
    if best is None:
        raise KeyError(module)
    return best


def modules(root: Path = SRC) -> dict[str, Path]:
    """Dotted name -> source file of every module under ``root/interq`` (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted((root / "interq").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported interq module, line) for every import statement in the file, at any depth (relative imports
    resolved against ``name``'s package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # ``from pkg import submodule`` names the submodule
                sub = f"{target}.{a.name}"
                found.append((sub if sub in known else target, node.lineno))
    return list(dict.fromkeys((t, line) for t, line in found if t == "interq" or t.startswith("interq.")))


def graph() -> dict[str, list[tuple[str, int]]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def wrong_arrows(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Every import that goes up or sideways in :data:`LAYERS`, as ``module:line -> target (room L -> room L')``."""
    bad = []
    for src, targets in edges.items():
        a = room_of(src)
        for dst, line in targets:
            b = room_of(dst)
            if a != b and LAYERS[b][0] >= LAYERS[a][0]:
                bad.append(f"{src}:{line} -> {dst} ({a} {LAYERS[a][0]} -> {b} {LAYERS[b][0]})")
    return bad


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    succ = {m: sorted({d for d, _ in ts if d != m and d in edges}) for m, ts in edges.items()}
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in succ:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter[0]
                counter[0] += 1
                stack.append(v)
                on_stack.add(v)
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
            if work:  # back in the caller's frame: fold this child's low-link into its parent's
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def test_every_module_has_a_room():
    missing = [m for m in modules() if _room_or_none(m) is None]
    assert not missing, f"modules outside tests/test_import_graph.py's LAYERS table: {missing}"


def _room_or_none(module: str) -> str | None:
    try:
        return room_of(module)
    except KeyError:
        return None


def test_imports_point_down_the_layers():
    bad = wrong_arrows(graph())
    assert not bad, "imports that go up or sideways (see docs/architecture.md):\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, f"modules that import each other (directly or through others): {found}"


def test_the_executor_imports_neither_the_trainer_nor_the_rollout():
    edges = graph()
    bad = [f"{s}:{line} -> {d}" for s, ts in edges.items() if room_of(s) in ("executor", "kernels")
           for d, line in ts if room_of(d) in ("trainer", "rollout", "agent")]
    assert not bad, bad


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "interq"
    (pkg / "quant").mkdir(parents=True)
    (pkg / "train").mkdir()
    for f in ("__init__.py", "quant/__init__.py", "train/__init__.py", "train/rl.py"):
        (pkg / f).write_text("")
    (pkg / "quant" / "aligned.py").write_text("def f():\n    from ..train import rl\n    import interq.train.rl\n")
    mods = modules(tmp_path)
    edges = {n: imports(n, p, set(mods)) for n, p in mods.items()}
    assert edges["interq.quant.aligned"] == [("interq.train.rl", 2), ("interq.train.rl", 3)]
    assert len(wrong_arrows(edges)) == 2


@pytest.mark.parametrize("edges, want", [
    ({"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}, [["a", "b", "c"]]),
    ({"a": [("b", 1)], "b": [], "c": [("c", 1)]}, []),
    ({"a": [("b", 1)], "b": [("a", 1)], "c": [("d", 1)], "d": [("c", 1)]}, [["a", "b"], ["c", "d"]]),
])
def test_the_cycle_finder(edges, want):
    assert sorted(cycles(edges)) == want
