"""The Dockerfile (no engine here to build it): a target per service, pinned installs, non-root."""

from __future__ import annotations

import json
import re
import tomllib

from ops_support import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def stages() -> dict[str, str]:
    """Stage name -> its instructions."""
    parts = re.split(r"^FROM\s+", DOCKERFILE, flags=re.MULTILINE)[1:]
    found = {}
    for part in parts:
        header, _, body = part.partition("\n")
        name = header.split(" AS ")[-1].strip() if " AS " in header else header.strip()
        found[name] = body
    return found


def test_a_target_per_service_runs_its_console_script() -> None:
    services = {s: e for s, e in SCRIPTS.items() if e.endswith(".server:main")}
    assert len(services) == 5  # the four services and the browser gateway
    all_stages = stages()
    for script, entry in services.items():
        service = entry.split(".")[1]
        cmd = re.search(r"^CMD\s+(.+)$", all_stages[service], flags=re.MULTILINE)
        assert cmd and json.loads(cmd[1]) == [script], service


def test_every_console_script_is_named() -> None:
    """The image installs them all (pip install .); the Dockerfile says which is which."""
    missing = [script for script in SCRIPTS if script not in DOCKERFILE]
    assert not missing, f"name {missing} in the Dockerfile (a target for a service, the tool list otherwise)"


def test_installs_from_constraints_generates_protos_runs_as_non_root() -> None:
    assert "-c constraints.txt" in DOCKERFILE
    assert "scripts/gen-protos" in DOCKERFILE
    runtime = stages()["runtime"]
    user = re.search(r"^USER\s+(\S+)$", runtime, flags=re.MULTILINE)
    assert user and user[1].split(":")[0] not in ("0", "root")
    # Everything the image copies from the build context exists.
    for source in re.findall(r"^COPY\s+(?!--from)(.+)\s+\S+$", DOCKERFILE, flags=re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), path
