"""Every alert links a runbook page that exists, absolutely, from one base; every other page is a
procedure listed under the index's "Procedures" (backup and restore).

The rules link ``https://docs.niuniu.example/runbooks/<alert>.md``; overlays/production sets
its own base once (runbook-base.yaml) and its render links every alert from there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from ops_support import render

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "observability" / "alerts.rules.yml"
RUNBOOKS = ROOT / "docs" / "runbooks"
DEFAULT_BASE = "https://docs.niuniu.example"


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_every_alert_links_its_own_runbook_page() -> None:
    missing = []
    for rule in _alerts():
        url = rule["annotations"].get("runbook_url", "")
        if url != f"{DEFAULT_BASE}/runbooks/{rule['alert']}.md" or not (RUNBOOKS / f"{rule['alert']}.md").is_file():
            missing.append((rule["alert"], url))
    assert missing == []


def test_production_links_every_runbook_from_its_own_base() -> None:
    base = yaml.safe_load((ROOT / "deploy/k8s/overlays/production/runbook-base.yaml").read_text())["data"]["base"]
    assert base != DEFAULT_BASE
    (rule,) = [d for d in render("overlays/production") if d["kind"] == "PrometheusRule"]
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]
    links = {r["alert"]: r["annotations"]["runbook_url"] for r in alerts}
    assert links == {a["alert"]: f"{base}/runbooks/{a['alert']}.md" for a in _alerts()}


def test_every_runbook_page_is_an_alerts_or_a_listed_procedure() -> None:
    names = {rule["alert"] for rule in _alerts()}
    index = (RUNBOOKS / "README.md").read_text()
    procedures = set(re.findall(r"\]\(([A-Za-z]+)\.md\)", index.split("## Procedures", 1)[1]))
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert procedures and not procedures & names
    assert pages == names | procedures
    assert all(f"({name}.md)" in index for name in names)
