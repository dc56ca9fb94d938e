"""Alert rules and dashboards: promtool-valid, tested, and only about metrics the code exports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
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
    """(The game-integrity tests are in the generated block of alerts.test.yml: they count too.)"""
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


# --- game integrity ----------------------------------------------------------------------


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, OBSERVABILITY / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


integrity = _load("game_integrity")


def test_generated_rtp_rules_and_test_series_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(OBSERVABILITY / "game_integrity.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_every_bet_type_the_table_counts_is_judged_or_excluded_with_a_reason() -> None:
    from services.table.metrics import BET_TYPES

    judged = {(t.variant, t.bet) for t in integrity.theories()}
    counted = {(variant, bet) for variant, areas in BET_TYPES.items() for bet in areas.values()}
    assert judged | set(integrity.EXCLUDED) == counted
    assert not judged & set(integrity.EXCLUDED)
    assert all(len(why) > 40 for why in integrity.EXCLUDED.values())


def test_theory_is_read_from_the_reports_figures() -> None:
    by_key = {(t.variant, t.bet): t for t in integrity.theories()}
    golden = by_key["golden_bull", "area"]
    assert (golden.rtp, golden.variance, golden.stderr) == (1.0, 3.133359, 0.0)
    assert by_key["bai_buu", "banker"].rtp == by_key["bai_buu", "player"].rtp == 0.976885
    baibian = by_key["baibian_bull", "area"]
    assert baibian.rtp == 1.00241 and abs(baibian.stderr - 0.005766) < 1e-5  # the report's standard error
    rules = RULES.read_text()
    for t in by_key.values():
        assert f"variant: {t.variant}\n          bet: {t.bet}" in rules


def test_a_report_whose_table_changed_fails_the_generator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for report in (ROOT / "docs" / "math").glob("*.md"):
        (tmp_path / report.name).write_text(report.read_text().replace("| default (authentic", "| plain (authentic"))
    monkeypatch.setattr(integrity, "MATH", tmp_path)
    with pytest.raises(SystemExit, match=r"golden_bull\.md: 0 lines match"):
        integrity.theories()


def test_a_changed_figure_makes_the_rules_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for report in (ROOT / "docs" / "math").glob("*.md"):
        text = report.read_text().replace("| 100.000000% | 3.133359 |", "| 100.000000% | 3.200000 |")
        (tmp_path / report.name).write_text(text)
    monkeypatch.setattr(integrity, "MATH", tmp_path)
    rules = dict(integrity.targets())[RULES]
    assert rules != RULES.read_text() and "vector(3.2)" in rules


def test_simulated_rounds_are_the_real_engines() -> None:
    fair = integrity.simulate(200)["area"]
    rigged = integrity.simulate(60, rigged=True)["area"]
    assert fair == integrity.simulate(200)["area"]  # fixed seed: the committed series are reproducible
    assert [c.stake for c in fair] == sorted(c.stake for c in fair)  # cumulative
    assert all(c.squares >= 0 and c.won >= 0 and c.lost >= 0 for c in fair)
    assert abs(integrity.rtp(fair[-1]) - 1) < 0.5
    assert integrity.rtp(rigged[-1]) < -1  # the dealer's Bull Bull takes x3 from almost every bet
    bai_buu = integrity.simulate(100, variant_id="bai_buu")
    assert set(bai_buu) == {"banker", "player"} and all(len(h) == 101 for h in bai_buu.values())


def test_the_table_tally_counts_settled_bets_by_bet_type_and_skips_refunds() -> None:
    from bull.money import BetResult, Outcome, Settlement
    from services.table.metrics import tally

    def bet(bet_id: str, area: str, stake: int, outcome: Outcome, net: int) -> BetResult:
        return BetResult(bet_id, "player:p", area, stake, stake * 4, outcome, net)

    settlement = Settlement(
        bets=(
            bet("a", "banker_01", 1_000, Outcome.WIN, 950),
            bet("b", "banker_02", 500, Outcome.LOSS, -500),
            bet("c", "player_01", 2_000, Outcome.HALF_WIN, 475),
            bet("d", "jackpot_banker", 100, Outcome.LOSS, -100),
            bet("e", "player_02", 9_000, Outcome.REFUND, 0),
        ),
        transfers=(),
    )
    counts = tally("bai_buu", settlement)
    assert set(counts) == {"banker", "player", "jackpot"}
    banker = counts["banker"]
    assert (banker.stake_minor, banker.won_minor, banker.lost_minor, banker.stake_square) == (1_500, 950, 500, 1_500**2)
    assert (counts["player"].stake_minor, counts["player"].won_minor) == (2_000, 475)


def test_the_counters_and_gauges_move_and_closed_tables_disappear() -> None:
    from datetime import UTC, datetime

    from prometheus_client import REGISTRY

    from bull.money import BetResult, Outcome, Settlement
    from bull.variants import VARIANTS
    from services.table import metrics

    golden = VARIANTS["golden_bull"]

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    labels = {"variant": "golden_bull", "bet": "area", "config": "custom"}
    stake, lost = "niuniu_table_settled_stake_minor_total", "niuniu_table_settled_lost_minor_total"
    before = {name: value(name, **labels) for name in (stake, lost)}
    won_default = REGISTRY.get_sample_value("niuniu_table_settled_won_minor_total", {**labels, "config": "default"})
    assert won_default is not None  # pre-created
    settlement = Settlement(
        bets=(
            BetResult("x", "player:p", "area_1", 300, 1_500, Outcome.LOSS, -900),
            BetResult("y", "player:q", "area_2", 200, 1_000, Outcome.WIN, 200),
        ),
        transfers=(),
    )
    at = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    metrics.round_settled("t-metrics", golden, golden.parse_config({"commission_bps": "500"}), settlement, at)
    assert value(stake, **labels) - before[stake] == 500
    assert value(lost, **labels) - before[lost] == 900
    ended = "niuniu_table_last_round_ended_timestamp_seconds"
    assert REGISTRY.get_sample_value(ended, {"table": "t-metrics"}) == at.timestamp()
    metrics.table_closed("t-metrics")
    assert REGISTRY.get_sample_value(ended, {"table": "t-metrics"}) is None
