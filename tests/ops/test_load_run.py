"""``niuniu-load`` on the real stack, CI-sized: it starts the services, bets, and its ``--audit``
finds the run's journal clean (``niuniu-audit replay``: the replay equals the live journal and
the wallet's balances); it leaves neither schemas nor topics behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from backbone.kafka import make_admin

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 600


def test_a_short_load_run_bets_and_its_journal_replays_clean(infra: dict[str, str], tmp_path: Path) -> None:
    command = [
        str(Path(sys.executable).parent / "niuniu-load"),
        *("--tables", "2", "--players", "6", "--in-flight", "6", "--duration", "15"),  # a round or more a table
        *("--variants", "golden_bull,baibian_bull"),  # the banked table gets its banker from the load
        *("--bets-per-call", "2"),  # PlaceBets calls (the bets of one call share the trips)
        *("--rate", "30"),  # paced: the run shows each figure is there, not how high it goes
        *("--warmup", "3"),  # uncounted bets, then the run's tables analyzed
        *("--log-dir", str(tmp_path), "--audit"),
    ]
    done = subprocess.run(
        command, env={**os.environ, **infra}, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    warm = re.search(r"warm-up: (\d+) bets in [0-9.]+ s, not counted; then ANALYZE of the run's (\d+) tables", text)
    assert warm is not None and all(int(n) > 0 for n in warm.groups()), text[-3000:]
    accepted = re.search(r"run 1: (\d+) bets accepted", text)
    assert accepted is not None and int(accepted.group(1)) > 0, text[-3000:]
    assert re.search(r"run 1: \d+ bets accepted .*PlaceBets of 2 bets", text), text[-3000:]
    by_variant = re.search(r"accepted by variant  baibian_bull (\d+), golden_bull (\d+)", text)
    assert by_variant is not None and all(int(n) > 0 for n in by_variant.groups()), text[-3000:]
    assert "NO_BANKER" not in text, text[-3000:]
    # Where the latency went: the table's handling of PlaceBets and the wallet's of PlaceHolds inside it.
    handled = re.search(r"mean server-side ms  table PlaceBets ([0-9.]+), wallet PlaceHolds ([0-9.]+)", text)
    assert handled is not None and 0 < float(handled.group(2)) < float(handled.group(1)), text[-3000:]
    # How many bets share a table transaction and holds a wallet one (the group-commit histograms).
    groups = re.search(
        r"mean group  table bets a recording transaction ([0-9.]+), wallet holds a transaction ([0-9.]+)", text
    )
    assert groups is not None and all(1 <= float(g) <= 64 for g in groups.groups()), text[-3000:]
    # Where the CPU went, per accepted bet: the database's (with its backends that ended) and the machine's.
    per_bet = re.search(r"CPU ms per accepted bet: .*table ([0-9.]+).*postgres ([0-9.]+).*; machine ([0-9.]+)", text)
    assert per_bet is not None, text[-3000:]
    table_ms, postgres_ms, machine_ms = (float(v) for v in per_bet.groups())
    assert 0 < table_ms < machine_ms and 0 < postgres_ms < machine_ms, text[-3000:]
    # Each settled round reached the wallet, then (after the wallet's COMMIT) Kafka as the wallet's event.
    lags = {
        what: float(m.group(1))
        for what in ("wallet's last movement", "its settlement event on Kafka")
        if (m := re.search(rf"settlement -> {what}, \d+ rounds: .* max ([0-9.]+) s", text))
    }
    assert len(lags) == 2, text[-3000:]
    assert 0 < lags["wallet's last movement"] <= lags["its settlement event on Kafka"], text[-3000:]
    # Where that way to Kafka went. After the table's relay took the event, the wallet began applying it
    # (it cannot before Kafka has it), and the wallet's relay took the wallet's event after that.
    stages = re.search(
        r"of which, median / max s: the table's relay took it (-?[0-9.]+) / (-?[0-9.]+),"
        r" the wallet began applying it ([0-9.]+) / ([0-9.]+),"
        r" the wallet's relay took its event ([0-9.]+) / ([0-9.]+)",
        text,
    )
    assert stages is not None, text[-3000:]
    for median, worst in (stages.group(3, 4), stages.group(5, 6)):
        assert 0 < float(median) <= float(worst), text[-3000:]
    assert "INTERNAL" not in text and "UNKNOWN" not in text, text[-3000:]
    assert re.search(r"differences: 0\b", text) and "RESULT: OK" in text, text[-3000:]
    took = re.search(r"the audit took ([0-9.]+) s", text)
    assert took is not None and float(took.group(1)) > 0, text[-3000:]
    run = re.search(r"logs in .*/([0-9a-f]+)\)", text)
    assert run is not None, text[:500]
    admin = make_admin(infra["KAFKA_BOOTSTRAP_SERVERS"], "test-load-run")
    try:
        left = [t for t in admin.list_topics() if t.startswith(f"load{run.group(1)}.")]
    finally:
        admin.close()
    assert left == []  # the run's topics went with its schemas
    with psycopg.connect(infra["DATABASE_URL"]) as conn:
        schemas = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"load_{run.group(1)}_%",))
        assert schemas.fetchall() == []
