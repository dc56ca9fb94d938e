"""Refuses an image whose base is not pinned by digest.

Every FROM of the Dockerfile is either an earlier stage or ``${PYTHON_IMAGE}@${PYTHON_DIGEST}``,
PYTHON_DIGEST has no default (a build without it fails), and deploy/image/base.env (what
scripts/sbom builds with) sets PYTHON_DIGEST to a sha256 digest.

    python deploy/image/check_image.py [BASE_ENV]     exit 1 with the reasons
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE_ENV = ROOT / "deploy" / "image" / "base.env"
PINNED_FROM = "${PYTHON_IMAGE}@${PYTHON_DIGEST}"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def base_env(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def problems(dockerfile: str, env: dict[str, str]) -> list[str]:
    found: list[str] = []
    stages: set[str] = set()
    for image, name in re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$", dockerfile, flags=re.MULTILINE | re.I):
        if image != PINNED_FROM and image not in stages:
            found.append(f"FROM {image}: neither an earlier stage nor {PINNED_FROM}")
        stages.add(name)
    if re.search(r"^ARG\s+PYTHON_DIGEST=", dockerfile, flags=re.MULTILINE):
        found.append("ARG PYTHON_DIGEST has a default: a build without the pin must fail")
    if not DIGEST.fullmatch(env.get("PYTHON_DIGEST", "")):
        found.append("base.env: PYTHON_DIGEST is not a sha256 digest (the base is not pinned)")
    if not env.get("PYTHON_IMAGE"):
        found.append("base.env: no PYTHON_IMAGE")
    return found


def main(argv: list[str]) -> int:
    env = base_env(Path(argv[0]) if argv else BASE_ENV)
    found = problems((ROOT / "Dockerfile").read_text(), env)
    for problem in found:
        print(f"check_image: {problem}", file=sys.stderr)
    if not found:
        print(f"check_image: ok: {env['PYTHON_IMAGE']}@{env['PYTHON_DIGEST']}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
