"""Writes the service image's source tree: the project without the load, bench and chaos tools.

The service image (the Dockerfile's default target) installs this tree, so it carries no
``niuniu-load``, ``niuniu-bench`` or ``niuniu-chaos`` and none of the code only they import:
a tool that floods or breaks a system has no business in the pods that run it. Which code is
theirs alone follows the imports (within this repository) of every console script in
pyproject.toml, so a module a service starts to use stays in.

    python deploy/image/service_only.py SRC DEST    (SRC: a checkout; DEST: created)
"""

from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path

TOOL_SCRIPTS = ("niuniu-load", "niuniu-bench", "niuniu-chaos")
PACKAGES = ("backbone", "bull", "services", "tools")
COPIED = (*PACKAGES, "pyproject.toml", "constraints.txt")


def console_scripts(pyproject: str) -> dict[str, str]:
    """Console script name -> the module its entry point names, from pyproject.toml's [project.scripts]."""
    section = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return {name: target.split(":")[0] for name, target in re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', section, re.M)}


def module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported(root: Path, start: str) -> set[str]:
    """``start`` and every repository module it imports, transitively, with their parent packages."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen or module.split(".")[0] not in PACKAGES:
            continue
        path = module_file(root, module)
        if path is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                todo.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo.append(node.module)
                todo.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return seen


def tools_only(root: Path) -> set[str]:
    """The modules the tool scripts import and no other console script does."""
    scripts = console_scripts((root / "pyproject.toml").read_text())
    unknown = set(TOOL_SCRIPTS) - set(scripts)
    if unknown:
        raise SystemExit(f"service_only: {sorted(unknown)} are not console scripts in pyproject.toml")
    kept = set().union(*(imported(root, m) for s, m in scripts.items() if s not in TOOL_SCRIPTS))
    tools = set().union(*(imported(root, scripts[s]) for s in TOOL_SCRIPTS))
    return tools - kept


def without_tool_scripts(pyproject: str) -> str:
    names = "|".join(re.escape(s) for s in TOOL_SCRIPTS)
    return re.sub(rf"^(?:{names})\s*=.*\n", "", pyproject, flags=re.MULTILINE)


def write(src: Path, dest: Path) -> list[str]:
    """Copy the project to ``dest`` minus the tools' scripts and modules; the modules removed."""
    removed = sorted(tools_only(src))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        if (src / name).is_dir():
            shutil.copytree(src / name, dest / name, ignore=ignore)
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / name, dest / name)
    for module in removed:
        path = module_file(dest, module)
        if path is None:
            continue  # inside a package already removed
        if path.name == "__init__.py":
            shutil.rmtree(path.parent)
        else:
            path.unlink()
    (dest / "pyproject.toml").write_text(without_tool_scripts((src / "pyproject.toml").read_text()))
    return removed


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    removed = write(Path(argv[0]), Path(argv[1]))
    print(f"service_only: without {', '.join(TOOL_SCRIPTS)} and {len(removed)} modules: {', '.join(removed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
