"""Regenerate or check the committed math reports (``docs/math/<variant>.md``).

    python -m tools.rules.reports --write      # regenerate all four
    python -m tools.rules.reports --check      # exit 1 and name every report that differs
    python -m tools.rules.reports --check --variant bai_buu

The reports are deterministic (fixed seeds, no clock), so a committed report that
differs from what the code generates means the code changed and the report was not
regenerated; ``tests/rules/test_reports.py`` runs the check.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bull import variants
from tools.rules import registry

ROOT = Path(__file__).resolve().parents[2]
REPORT_DIR = ROOT / "docs" / "math"


def report_path(variant_id: str) -> Path:
    return REPORT_DIR / f"{variant_id}.md"


def generate(variant_id: str) -> str:
    return registry.get(variant_id).report()


def stale(variant_ids: Sequence[str]) -> list[str]:
    """The variants whose committed report differs from (or is missing against) the generated one."""
    out = []
    for variant_id in variant_ids:
        path = report_path(variant_id)
        if not path.exists() or path.read_text(encoding="utf-8") != generate(variant_id):
            out.append(variant_id)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.rules.reports", description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="regenerate the reports")
    action.add_argument("--check", action="store_true", help="exit 1 if a committed report differs")
    parser.add_argument("--variant", action="append", choices=sorted(variants.VARIANTS), help="default: all")
    args = parser.parse_args(argv)
    variant_ids = args.variant or list(variants.VARIANTS)
    if args.write:
        for variant_id in variant_ids:
            report_path(variant_id).write_text(generate(variant_id), encoding="utf-8")
            print(f"wrote {report_path(variant_id).relative_to(ROOT)}")
        return 0
    differing = stale(variant_ids)
    for variant_id in differing:
        print(f"{report_path(variant_id).relative_to(ROOT)} differs from the generated report", file=sys.stderr)
    if differing:
        print("regenerate with: python -m tools.rules.reports --write", file=sys.stderr)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
