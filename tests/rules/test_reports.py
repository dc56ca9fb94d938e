"""The committed math reports are exactly what the code generates.

Each report is rendered from the rules code with fixed seeds and no clock, so a
difference means the code changed without ``python -m tools.rules.reports --write``.
The reports cite the project's own rules pages, never a path outside the project.
"""

from __future__ import annotations

import re

import pytest

from bull import variants
from tools.rules import reports

VARIANTS = sorted(variants.VARIANTS)


@pytest.mark.parametrize("variant_id", VARIANTS)
def test_committed_report_is_what_the_code_generates(variant_id: str) -> None:
    committed = reports.report_path(variant_id).read_text(encoding="utf-8")
    generated = reports.generate(variant_id)
    assert committed == generated, f"regenerate with: python -m tools.rules.reports --write --variant {variant_id}"
    assert f"docs/rules/{variant_id}.md" in committed
    assert reports.report_path(variant_id).parent.parent.joinpath("rules", f"{variant_id}.md").exists()
    # Only project paths: parent-relative links stay inside docs/, and no absolute path at all.
    assert all(link.startswith("../rules/") for link in re.findall(r"\.\./[\w./-]+", committed))
    assert not re.search(r"(?<![\w.:/])/(?:work|home|tmp|root|usr|opt|srv)/", committed)
    assert re.search(r"variance", committed, re.IGNORECASE)


def test_the_check_fails_on_a_stale_report(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a report that differs by one character is reported and exits 1."""
    monkeypatch.setattr(reports, "generate", lambda variant_id: f"# {variant_id}\n")
    assert reports.stale(VARIANTS) == VARIANTS
    assert reports.main(["--check"]) == 1
