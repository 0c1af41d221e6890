"""Arrows point down (docs: DESIGN.md, "Four kinds of truth, four layers"): the layers a
package may import, read from the source's import statements (imports under
`if TYPE_CHECKING:` are annotations only and do not count)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "perfcast"
BELOW = {
    "core": set(),
    "hardware": {"core"},
    "workload": {"core"},
    "evidence": {"core", "workload", "hardware"},
    "plan": {"core", "workload", "hardware", "evidence"},
    "report": {"core", "workload", "hardware", "evidence", "plan"},
}


def _imports(tree: ast.AST) -> list[str]:
    out: list[str] = []

    def visit(node, annotation_only=False):
        for child in ast.iter_child_nodes(node):
            only = annotation_only or (isinstance(child, ast.If)
                                       and "TYPE_CHECKING" in ast.unparse(child.test))
            if not only and isinstance(child, ast.ImportFrom) and child.module:
                out.append(child.module)
            elif not only and isinstance(child, ast.Import):
                out.extend(a.name for a in child.names)
            visit(child, only)

    visit(tree)
    return [m for m in out if m == "perfcast" or m.startswith("perfcast.")]


def _graph(package: str) -> dict[str, list[str]]:
    out = {}
    for path in sorted((SRC / package).rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(p for p in parts if p != "__init__")
        out[name] = _imports(ast.parse(path.read_text(encoding="utf-8")))
    return out


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for package, allowed in BELOW.items():
        for module, imports in _graph(package).items():
            for target in imports:
                layer = target.split(".")[1] if "." in target else ""
                if layer != package and layer not in allowed:
                    wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_evidence_modules_import_no_circle():
    graph = {m: [t for t in ts if t.startswith("perfcast.evidence")]
             for m, ts in _graph("evidence").items()}

    def reaches(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    circles = [" -> ".join(c) for m in graph if (c := reaches(m))]
    assert not circles, "\n".join(circles)


def test_the_test_sees_imports():
    # the reader finds a real import (guards the two tests above against reading nothing)
    assert "perfcast.evidence.factory" in _graph("plan")["perfcast.plan.step"]
