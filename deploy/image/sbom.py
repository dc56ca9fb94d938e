"""A CycloneDX SBOM of the locked dependencies (constraints.txt), with pip-audit's findings.

    python deploy/image/sbom.py CONSTRAINTS AUDIT_JSON OUT_JSON

AUDIT_JSON is ``pip-audit --format json`` over the same file. Every pin becomes a library
component (``pkg:pypi/<name>@<version>``); every vulnerability pip-audit found, a CycloneDX
vulnerability affecting it. Prints a summary; exit 0 when every pin was audited and none is
vulnerable, 1 when one is vulnerable, 3 when some could not be audited (the advisory data
did not answer for them): a scan that did not happen is not a clean one.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def pins(constraints: str) -> list[tuple[str, str]]:
    return re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", constraints, flags=re.MULTILINE)


def purl(name: str, version: str) -> str:
    return f"pkg:pypi/{re.sub(r'[-_.]+', '-', name).lower()}@{version}"


def bom(locked: list[tuple[str, str]], audit: dict[str, Any]) -> dict[str, Any]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    vulnerabilities = [
        {
            "id": v["id"],
            "description": v.get("description", ""),
            "recommendation": f"upgrade to {', '.join(v.get('fix_versions', [])) or 'no fixed version yet'}",
            "affects": [{"ref": purl(d["name"], d["version"])}],
        }
        for d in audit["dependencies"]
        for v in d.get("vulns", [])
    ]
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "component": {"type": "application", "name": project["name"], "version": project["version"]},
        },
        "components": [
            {"type": "library", "bom-ref": purl(n, v), "name": n, "version": v, "purl": purl(n, v)} for n, v in locked
        ],
        "vulnerabilities": vulnerabilities,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    locked = pins(Path(argv[0]).read_text())
    audit = json.loads(Path(argv[1]).read_text())
    document = bom(locked, audit)
    Path(argv[2]).write_text(json.dumps(document, indent=2) + "\n")
    skipped = [d["name"] for d in audit["dependencies"] if "skip_reason" in d]
    vulnerable = sorted({a["ref"] for v in document["vulnerabilities"] for a in v["affects"]})
    print(
        f"sbom: {len(locked)} components, {len(locked) - len(skipped)} audited, {len(skipped)} not audited, "
        f"{len(document['vulnerabilities'])} known vulnerabilities in {len(vulnerable)}: {' '.join(vulnerable)}"
    )
    if vulnerable:
        return 1
    return 3 if skipped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
