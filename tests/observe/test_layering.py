"""perfcast.observe depends only on core, workload and the evidence/collect readers."""

from __future__ import annotations

import ast
from pathlib import Path

import perfcast.observe

ALLOWED = ("perfcast.core", "perfcast.workload", "perfcast.evidence", "perfcast.collect",
           "perfcast.observe")


def test_observe_imports_nothing_above_it():
    root = Path(perfcast.observe.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if name.startswith("perfcast") and not name.startswith(ALLOWED):
                    found.setdefault(path.name, []).append(name)
    assert found == {}
    assert len(list(root.glob("*.py"))) >= 8  # the walk saw the package
