"""The architecture contracts (pyproject.toml's [tool.importlinter], run by scripts/test) hold
on the tree and fail on a forbidden import.

Each failing case copies the packages into a temporary directory, adds one import there and
runs `lint-imports` on the copy: the contract it breaks must be reported BROKEN, by name,
with the offending import, while the untouched copy passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import grimp
import pytest
from ops_support import ROOT, VENV_BIN

PACKAGES = ("bull", "backbone", "services", "tools")
CONTRACTS = {
    c["id"]: c["name"]
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
}


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    # Wide columns: rich would otherwise wrap a contract's name over two lines.
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run(
        [str(VENV_BIN / "lint-imports"), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def verdicts(output: str) -> dict[str, str]:
    """Contract name -> KEPT or BROKEN, from lint-imports' summary lines."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        for name in CONTRACTS.values():
            if line.startswith(name + " "):
                found[name] = line.removeprefix(name + " ").split()[0]
    return found


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pristine copy of the packages and the contracts; tests copy it again before editing."""
    copy = tmp_path_factory.mktemp("architecture")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def module_file(root: Path, module: str) -> Path:
    path = root.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def test_the_tree_keeps_every_contract() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == dict.fromkeys(CONTRACTS.values(), "KEPT")


def test_the_untouched_copy_keeps_every_contract(tree: Path) -> None:
    """The control for the cases below: copying alone breaks nothing."""
    done = lint_imports(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == dict.fromkeys(CONTRACTS.values(), "KEPT")


def a_table_import_to_reverse() -> tuple[str, str]:
    """(importer, imported): two sibling modules of services.table, the first importing the second."""
    graph = grimp.build_graph("services")
    siblings = graph.find_children("services.table")
    for importer in sorted(siblings):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & siblings):
            if not graph.find_children(imported):  # a module, not a package
                return importer, imported
    raise AssertionError("services.table has no module importing a sibling module")


@dataclass(frozen=True)
class Injection:
    contract: str  # the id in pyproject.toml
    module: str  # where the import is added
    statement: str  # the import
    reported: str  # what lint-imports must say about it


INJECTIONS = [
    Injection("pure-kernel", "bull.cards", "import psycopg", "bull is not allowed to import psycopg"),
    Injection("pure-kernel", "bull.rules.golden_bull", "import secrets", "bull is not allowed to import secrets"),
    Injection("pure-kernel", "bull.money", "import backbone.errors", "bull is not allowed to import backbone"),
    Injection(
        "runtime-without-analysis",
        "services.table.metrics",
        "from bull.analysis import exact",
        "services is not allowed to import bull.analysis",
    ),
    Injection(
        "runtime-without-analysis",
        "backbone.errors",
        "from bull.analysis import report",
        "backbone is not allowed to import bull.analysis",
    ),
    Injection(
        "independent-services",
        "services.table.ports",
        "from services.wallet import domain",
        "services.table is not allowed to import services.wallet",
    ),
    Injection(
        "independent-services",
        "services.wallet.domain",
        "from services.rng import seeds",
        "services.wallet is not allowed to import services.rng",
    ),
    Injection(
        "layers", "backbone.errors", "import services.ledger.accounts", "backbone is not allowed to import services"
    ),
    Injection(
        "light-replay",
        "backbone.replay.writing",
        "from backbone.consumer import ExactlyOnceConsumer",
        "backbone.replay is not allowed to import backbone.consumer",
    ),
    Injection(
        "private-modules", "tools.rules.cli", "from bull.rules import _bull", "tools.rules.cli -> bull.rules._bull"
    ),
]


@pytest.mark.parametrize("injection", INJECTIONS, ids=lambda i: f"{i.module}:{i.statement}")
def test_a_forbidden_import_breaks_its_contract(injection: Injection, tree: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    shutil.copytree(tree, copy)
    target = module_file(copy, injection.module)
    target.write_text(target.read_text() + f"\n{injection.statement}  # injected by test_architecture\n")
    done = lint_imports(copy)
    assert done.returncode != 0, done.stdout
    assert verdicts(done.stdout)[CONTRACTS[injection.contract]] == "BROKEN", done.stdout
    assert injection.reported in done.stdout, done.stdout
    assert injection.module in done.stdout, done.stdout


def test_an_import_cycle_in_the_table_breaks_the_acyclic_contract(tree: Path, tmp_path: Path) -> None:
    importer, imported = a_table_import_to_reverse()
    copy = tmp_path / "tree"
    shutil.copytree(tree, copy)
    target = module_file(copy, imported)
    target.write_text(target.read_text() + f"\nimport {importer}  # injected by test_architecture\n")
    done = lint_imports(copy)
    assert done.returncode != 0, done.stdout
    assert verdicts(done.stdout)[CONTRACTS["acyclic"]] == "BROKEN", done.stdout
    assert "No cycles are allowed in services.table" in done.stdout, done.stdout
