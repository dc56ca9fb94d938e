"""Every alert links a runbook page that exists, and every runbook page belongs to an alert."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "observability" / "alerts.rules.yml"
RUNBOOKS = ROOT / "docs" / "runbooks"


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_every_alert_links_its_own_runbook_page() -> None:
    missing = []
    for rule in _alerts():
        url = rule["annotations"].get("runbook_url", "")
        if url != f"docs/runbooks/{rule['alert']}.md" or not (ROOT / url).is_file():
            missing.append((rule["alert"], url))
    assert missing == []


def test_every_runbook_page_is_an_alerts_and_is_listed() -> None:
    names = {rule["alert"] for rule in _alerts()}
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == names
    index = (RUNBOOKS / "README.md").read_text()
    assert all(f"({name}.md)" in index for name in names)
