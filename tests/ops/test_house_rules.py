"""The house rules of the product code: in services/ and backbone/, no function over 60 lines and no
file over 500 (docs/README.md's style), read with ``ast`` from the tree.

A function's lines run from its first decorator to its last line, docstring included. The files and
functions still over their bound when the rules were written are listed in ``KNOWN_OVER`` with their
length then: they may shrink, not grow, and an entry is removed once it is within the bound (the test
fails on a stale entry, so the list only gets shorter).
"""

from __future__ import annotations

import ast
from pathlib import Path

from ops_support import ROOT

PACKAGES = ("services", "backbone")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500

KNOWN_OVER: dict[str, int] = {
    "backbone/consumer.py": 591,
    "backbone/eventstore.py": 558,
}


def lengths(root: Path = ROOT) -> dict[str, int]:
    """Every product file's length, and every function's (``path:name``), in lines."""
    found: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            source = path.read_text()
            found[name] = len(source.splitlines())
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    key = f"{name}:{node.name}"
                    found[key] = max(found.get(key, 0), (node.end_lineno or node.lineno) - start + 1)
    return found


def bound(key: str) -> int:
    return MAX_FUNCTION_LINES if ":" in key else MAX_FILE_LINES


def test_no_function_over_60_lines_and_no_file_over_500_in_services_and_backbone() -> None:
    over = {key: n for key, n in lengths().items() if n > bound(key) and n > KNOWN_OVER.get(key, 0)}
    assert not over, "over the house bounds (split them into well-named parts): " + ", ".join(
        f"{key} {n} lines (at most {KNOWN_OVER.get(key, bound(key))})" for key, n in sorted(over.items())
    )


def test_the_known_exceptions_are_still_over_their_bound() -> None:
    found = lengths()
    stale = sorted(key for key in KNOWN_OVER if found.get(key, 0) <= bound(key))
    assert not stale, f"within the bound now, remove from KNOWN_OVER: {stale}"


def test_the_walk_measures_a_function_from_its_decorator_and_a_file_by_its_lines(tmp_path: Path) -> None:
    """The control: a decorated function of 61 lines in all, in a file of 62, nested in a class."""
    body = "\n".join(f"        x{i} = {i}" for i in range(59))
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / "long.py").write_text(f"class C:\n    @staticmethod\n    def long() -> None:\n{body}\n")
    found = lengths(tmp_path)
    assert found == {"services/long.py": 62, "services/long.py:long": 61}
    assert found["services/long.py:long"] > bound("services/long.py:long")
