"""The image's supply chain: the service stages carry no load, bench or chaos tool, the base is
pinned by digest, the SBOM lists every pin with what the scan found, production runs a digest.

No engine builds the image here: the tests read the Dockerfile's stages, run the very step
its service stage runs (deploy/image/service_only.py) and import what that tree keeps.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from ops_support import ROOT, render

DOCKERFILE = (ROOT / "Dockerfile").read_text()
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
SERVICE_TARGETS = ("rng", "table", "wallet", "ledger", "gateway", "niuniu")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "deploy" / "image" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


service_only = _load("service_only")
check_image = _load("check_image")
sbom = _load("sbom")


def stages() -> dict[str, tuple[str, str]]:
    """Stage name -> (what it is FROM, its instructions)."""
    found = {}
    for part in re.split(r"^FROM\s+", DOCKERFILE, flags=re.MULTILINE)[1:]:
        header, _, body = part.partition("\n")
        image, _, name = header.partition(" AS ")
        found[name.strip()] = (image.strip(), body)
    return found


def ancestry(stage: str) -> list[str]:
    chain, all_stages = [stage], stages()
    while chain[-1] in all_stages:
        chain.append(all_stages[chain[-1]][0])
    return chain


@pytest.fixture(scope="module")
def service_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("image") / "service-src"
    service_only.write(ROOT, dest)
    return dest


def test_the_tools_are_console_scripts_of_the_package() -> None:
    assert set(service_only.TOOL_SCRIPTS) <= set(SCRIPTS)


def test_every_service_target_installs_the_tree_without_the_tools() -> None:
    all_stages = stages()
    for target in SERVICE_TARGETS:
        chain = ancestry(target)
        assert "runtime" in chain and "tools" not in chain, (target, chain)
    runtime = all_stages["runtime"][1]
    # The runtime's only venv is service-build's, which installs the tree service_only.py writes.
    assert re.findall(r"^COPY --from=(\S+) /opt/venv ", runtime, flags=re.MULTILINE) == ["service-build"]
    build = all_stages["service-build"][1]
    assert "deploy/image/service_only.py /app /app/service-src" in build
    assert "rm -rf /opt/venv" in build and "pip install -c constraints.txt /app/service-src" in build
    # The full venv (with the tools) reaches the tools stage only.
    users = [name for name, (_, body) in all_stages.items() if re.search(r"^COPY --from=build /opt/venv ", body, re.M)]
    assert users == ["tools"]


def test_the_service_tree_has_no_tool_command_and_none_of_their_code(service_tree: Path) -> None:
    scripts = tomllib.loads((service_tree / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(SCRIPTS) - set(service_only.TOOL_SCRIPTS)
    assert not (service_tree / "tools" / "chaos").exists()
    assert not (service_tree / "tools" / "load.py").exists()
    assert not (service_tree / "backbone" / "bench.py").exists()


def test_every_command_the_service_tree_keeps_imports_without_the_tools(service_tree: Path) -> None:
    modules = sorted(
        {target.split(":")[0] for name, target in SCRIPTS.items() if name not in service_only.TOOL_SCRIPTS}
    )
    import niuniu  # the generated contracts, wherever this checkout finds them

    generated = Path(next(iter(niuniu.__path__))).parent
    env = {**os.environ, "PYTHONPATH": f"{service_tree}{os.pathsep}{generated}"}
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    done = subprocess.run(
        [sys.executable, "-c", code, *modules], cwd=service_tree, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


PINNED = {"PYTHON_IMAGE": "docker.io/library/python:3.11-slim-bookworm", "PYTHON_DIGEST": "sha256:" + "ab" * 32}


def test_the_base_is_pinned_by_a_digest_the_build_must_be_given() -> None:
    assert check_image.problems(DOCKERFILE, PINNED) == []
    assert check_image.problems(DOCKERFILE, {**PINNED, "PYTHON_DIGEST": ""}) == [
        "base.env: PYTHON_DIGEST is not a sha256 digest (the base is not pinned)"
    ]
    by_tag = DOCKERFILE.replace("FROM ${PYTHON_IMAGE}@${PYTHON_DIGEST} AS base", "FROM python:3.11-slim AS base")
    assert check_image.problems(by_tag, PINNED) == [
        "FROM python:3.11-slim: neither an earlier stage nor ${PYTHON_IMAGE}@${PYTHON_DIGEST}"
    ]
    defaulted = DOCKERFILE.replace("ARG PYTHON_DIGEST\n", "ARG PYTHON_DIGEST=sha256:" + "ab" * 32 + "\n")
    assert len(check_image.problems(defaulted, PINNED)) == 1


def test_base_env_names_the_variables_the_dockerfile_takes() -> None:
    env = check_image.base_env(check_image.BASE_ENV)
    assert set(env) == {"PYTHON_IMAGE", "PYTHON_DIGEST"}
    assert re.search(r"^ARG PYTHON_IMAGE=", DOCKERFILE, re.M) and re.search(r"^ARG PYTHON_DIGEST$", DOCKERFILE, re.M)


def test_the_sbom_lists_every_pin_and_what_the_scan_found(tmp_path: Path) -> None:
    constraints = (ROOT / "constraints.txt").read_text()
    locked = sbom.pins(constraints)
    assert len(locked) == len([line for line in constraints.splitlines() if "==" in line and not line.startswith("#")])
    name, version = locked[0]
    audit = {
        "dependencies": [
            {"name": name, "version": version, "vulns": [{"id": "PYSEC-0000-1", "fix_versions": ["9.9"]}]},
            *({"name": n, "version": v, "vulns": []} for n, v in locked[1:]),
        ]
    }
    (tmp_path / "audit.json").write_text(json.dumps(audit))
    args = [str(ROOT / "constraints.txt"), str(tmp_path / "audit.json"), str(tmp_path / "sbom.json")]
    assert sbom.main(args) == 1
    document = json.loads((tmp_path / "sbom.json").read_text())
    assert document["bomFormat"] == "CycloneDX"
    assert [(c["name"], c["version"]) for c in document["components"]] == locked
    (vulnerability,) = document["vulnerabilities"]
    assert vulnerability["affects"] == [{"ref": sbom.purl(name, version)}]
    # A pin the advisory data did not answer for is no clean result.
    audit["dependencies"][0] = {"name": name, "skip_reason": "not found"}
    (tmp_path / "audit.json").write_text(json.dumps(audit))
    assert sbom.main(args) == 3
    audit["dependencies"][0] = {"name": name, "version": version, "vulns": []}
    (tmp_path / "audit.json").write_text(json.dumps(audit))
    assert sbom.main(args) == 0


def test_production_runs_the_image_by_digest() -> None:
    images = {
        c["image"]
        for d in render("overlays/production")
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        if "niuniu-backend" in c["image"]
    }
    assert images and all(re.fullmatch(r"\S+@sha256:[0-9a-f]{64}", image) for image in images), images
