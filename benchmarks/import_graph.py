"""The console's import graph in figures: rooms (modules, `console.tui` counted as one), arrows (one room importing
another) and floors (the longest chain of arrows, counted in rooms; none where there is a circle), two ways: every
import statement (those inside functions and under TYPE_CHECKING included, as grimp and import-linter see them),
and only those run when a module is imported (module level, TYPE_CHECKING left out). The longest chain is printed
under each.

`python -m benchmarks.import_graph [ROOT]`: ROOT is a checkout (default: this one), so that two commits compare
(`git worktree add /tmp/old REV`, then the same command with /tmp/old).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "console"
ONE_ROOM = ("console.tui",)  # the terminal console's own modules are one room: its insides are its own business


def room(module: str) -> str:
    return next((r for r in ONE_ROOM if module == r or module.startswith(r + ".")), module)


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(tree: ast.Module, package: str, module_level: bool) -> Iterator[tuple[str, list[str]]]:
    """(module named, the names it takes) of each import statement, relative ones made absolute."""
    skipped: set[int] = set()
    if module_level:
        for node in ast.walk(tree):
            is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_function or (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
                skipped |= {id(inner) for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            yield base, [alias.name for alias in node.names]


def arrows(root: Path, module_level: bool) -> dict[str, set[str]]:
    found = modules(root)
    graph: dict[str, set[str]] = {room(name): set() for name in found if name != PACKAGE}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for base, names in imports(ast.parse(path.read_text()), package, module_level):
            submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in found]
            for target in submodules if names and len(submodules) == len(names) else [base, *submodules]:
                while target and target not in found:
                    target = target.rpartition(".")[0]
                if target and target != PACKAGE and room(target) != room(name):
                    graph.setdefault(room(name), set()).add(room(target))
    return graph


def longest(graph: dict[str, set[str]]) -> list[str] | None:
    """The longest chain of arrows; None when a room reaches itself (a circle: tests/test_import_graph.py names
    it)."""
    chains: dict[str, tuple[str, ...]] = {}
    open_: set[str] = set()

    def chain(v: str) -> tuple[str, ...]:
        if v in open_:
            raise RecursionError(v)
        if v not in chains:
            open_.add(v)
            below = sorted((chain(w) for w in graph.get(v, ())), key=len)
            open_.discard(v)
            chains[v] = (v, *(below[-1] if below else ()))
        return chains[v]

    try:
        return list(sorted((chain(v) for v in graph), key=len)[-1])
    except RecursionError:
        return None


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    sys.setrecursionlimit(10_000)
    print(f"{'imports counted':<40} {'rooms':>5} {'arrows':>6} {'floors':>6}")
    chains = []
    for label, module_level in (("every import statement", False), ("module level, run at import", True)):
        graph = arrows(root, module_level)
        chain = longest(graph)
        count = sum(len(targets) for targets in graph.values())
        floors = "circle" if chain is None else str(len(chain))
        print(f"{label:<40} {len(graph):>5} {count:>6} {floors:>6}")
        chains.append(f"{label}: " + " -> ".join(name.removeprefix("console.") for name in chain or ["(a circle)"]))
    print("\n".join(chains))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
