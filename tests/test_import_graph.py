"""No import circle anywhere in the project (the layering itself is import-linter's: `make lint`).

The graph is grimp's (the library under import-linter): every import statement, those inside functions and
under TYPE_CHECKING included, since a circle hidden in a function is still a circle to whoever reads the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

PACKAGES = ("backends", "console", "themes")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    assert circles(graph) == []


def test_a_circle_is_found_when_there_is_one(tmp_path: Path) -> None:
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f() -> None:\n    from circled import b\n")
    (package / "b.py").write_text("from circled import a\n")
    (package / "c.py").write_text("from circled import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert circles(grimp.build_graph("circled")) == [["circled.a", "circled.b"]]
    finally:
        sys.path.remove(str(tmp_path))
