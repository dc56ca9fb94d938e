"""Alert rules and dashboards: promtool-valid, tested, and only about metrics the code exports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from types import ModuleType

import pytest
from ops_support import ROOT, promtool, yaml

PROMTOOL = promtool()
OBSERVABILITY = ROOT / "deploy" / "observability"
RULES = OBSERVABILITY / "alerts.rules.yml"
DASHBOARDS = sorted((OBSERVABILITY / "dashboards").glob("*.json"))


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_queries", OBSERVABILITY / "check_queries.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    return checker.exported_metrics()  # type: ignore[no-any-return]


def promtool_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=OBSERVABILITY, capture_output=True, text=True, timeout=60)


def test_promtool_check_rules() -> None:
    done = promtool_run("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_test_rules() -> None:
    done = promtool_run("test", "rules", "alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_test_that_fires_it() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((OBSERVABILITY / "alerts.test.yml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert alerts - fired == set(), "alerts no promtool test fires"
    assert fired <= alerts


def test_prometheusrule_is_rendered_from_the_rules() -> None:
    done = subprocess.run(
        [str(OBSERVABILITY / "render-prometheusrule"), "--check"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr


def test_four_dashboards_one_per_concern() -> None:
    boards = {p.name: json.loads(p.read_text()) for p in DASHBOARDS}
    assert set(boards) == {
        "niuniu-traffic.json",
        "niuniu-game-health.json",
        "niuniu-money.json",
        "niuniu-pipeline-lag.json",
    }
    assert len({b["uid"] for b in boards.values()}) == len(boards)
    for name, board in boards.items():
        assert board["panels"], name
        assert board["templating"]["list"][0]["type"] == "datasource", name
        for panel in checker._panels(board["panels"]):
            for target in panel.get("targets", []):
                assert target["datasource"]["uid"] == "${datasource}", f"{name}: {panel['title']}"


def test_every_query_parses() -> None:
    queries = checker.all_queries()
    assert len(queries) > 40
    assert checker.parse_errors(queries, PROMTOOL) == []


def test_every_metric_and_label_is_exported_by_the_services(exported: dict[str, set[str]]) -> None:
    assert "grpc_server_handled_total" in exported  # the registry was read
    assert checker.name_errors(checker.all_queries(), exported) == []


# --- the checker itself ----------------------------------------------------------------


def test_names_in_finds_metrics_and_labels_not_functions_or_keywords() -> None:
    metrics, labels = checker.names_in(
        'sum by (grpc_service) (rate(grpc_server_handled_total{grpc_code!~"OK|NOT_FOUND"}[5m]))'
        " / on (job) group_left (x) foo offset 5m > 1e3"
        " and histogram_quantile(0.99, sum by (le) (rate(a_bucket[$__rate_interval])))"
    )
    assert metrics == {"grpc_server_handled_total", "foo", "a_bucket"}
    assert labels == {"grpc_service", "grpc_code", "job", "x", "le"}


def test_checker_reports_unknown_metrics_stray_labels_and_bad_syntax(exported: dict[str, set[str]]) -> None:
    Query = checker.Query
    errors = checker.name_errors(
        [
            Query("typo", "rate(niuniu_outbox_publish_total[5m])"),
            Query("label", "sum by (grpc_servce) (grpc_server_started_total)"),
            Query("fine", 'sum by (job) (rate(grpc_server_handled_total{grpc_code="OK"}[5m]))'),
        ],
        exported,
    )
    assert len(errors) == 2
    assert "niuniu_outbox_publish_total" in errors[0]
    assert "grpc_servce" in errors[1]
    bad = checker.parse_errors([Query("ok", "up"), Query("broken", "sum(rate(up[5m])")], PROMTOOL)
    assert bad and "[broken]" in "\n".join(bad)
