"""The components' own tools, run beside a benchmark (backbone/limits.py): pgbench, and Kafka's
ProducerPerformance and ConsumerPerformance from the broker's jars, against the real stack;
their reports parsed; a tool that is missing or fails gives no rate and says why."""

from __future__ import annotations

import math
import uuid

import psycopg
import pytest

from backbone import limits
from backbone.kafka import TopicSpec, ensure_topics, make_admin

PGBENCH_REPORT = """\
transaction type: /tmp/insert.sql
scaling factor: 1
number of clients: 16
duration: 3 s
number of transactions actually processed: 20118
latency average = 2.349 ms
initial connection time = 33.430 ms
tps = 6811.588338 (without initial connection time)
"""

PRODUCER_REPORT = """\
98041 records sent, 19608.2 records/sec (5.61 MB/sec), 1.2 ms avg latency, 220.0 ms max latency.
200000 records sent, 50722.8 records/sec (14.51 MB/sec), 457.88 ms avg latency, 1046.00 ms max latency, \
417 ms 50th, 834 ms 95th, 856 ms 99th, 884 ms 99.9th.
"""

CONSUMER_REPORT = """\
start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, \
fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
2026-12-02 13:51:46:926, 2026-12-02 13:51:48:897, 57.2205, 29.0312, 200000, 101471.3343, 1000, 971, 58.9294, \
205973.2235
"""


def test_the_reports_are_read_as_the_tools_print_them() -> None:
    assert limits.parse_pgbench(PGBENCH_REPORT) == pytest.approx(6811.588338)
    # The final line, not an interim one; the consumer's rate while fetching (its group's join left out).
    assert limits.parse_producer_performance(PRODUCER_REPORT) == pytest.approx(50722.8)
    consumed = limits.parse_consumer_performance(CONSUMER_REPORT)
    assert consumed is not None and consumed[0] == 200000 and consumed[1] == pytest.approx(205973.2235)
    for parse in (limits.parse_pgbench, limits.parse_producer_performance, limits.parse_consumer_performance):
        assert parse("ERROR: could not connect") is None
    assert limits.parse_consumer_performance(CONSUMER_REPORT.replace("200000,", "")) is None  # a short row


def test_a_limit_reads_as_a_share_or_says_why_it_is_missing() -> None:
    limit = limits.Limit(4000.0, "pgbench")
    assert limit.measured and limit.ratio(1000.0) == "25.0 %" and str(limit) == "4000/s (pgbench)"
    missing = limits.Limit(math.nan, "pgbench not found")
    assert not missing.measured and missing.ratio(1000.0) == "n/a"
    assert str(missing) == "not measured (pgbench not found)"


@pytest.mark.integration
async def test_a_missing_tool_is_not_measured_and_says_which(
    infra: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIUNIU_PGBENCH", "/nonexistent/pgbench")
    monkeypatch.setenv("NIUNIU_KAFKA_LIBS", "/nonexistent/libs")
    postgres = await limits.pgbench_commits(infra["DATABASE_URL"], seconds=1)
    assert not postgres.measured and "/nonexistent/pgbench" in postgres.how
    kafka = await limits.kafka_producer_rate(infra["KAFKA_BOOTSTRAP_SERVERS"], "t.none", records=1, record_size=1)
    assert not kafka.measured and "NIUNIU_KAFKA_LIBS" in kafka.how
    assert await _probe_tables(infra["DATABASE_URL"]) == []  # the probe's table went with it


@pytest.mark.integration
async def test_pgbench_commits_on_the_real_database_and_leaves_nothing(infra: dict[str, str]) -> None:
    limit = await limits.pgbench_commits(infra["DATABASE_URL"], clients=4, seconds=1)
    assert limit.measured and limit.per_s > 0, limit
    assert "pgbench" in limit.how and "4 connections" in limit.how
    assert await _probe_tables(infra["DATABASE_URL"]) == []


@pytest.mark.integration
async def test_kafkas_own_producer_and_consumer_on_the_real_broker(infra: dict[str, str]) -> None:
    servers = infra["KAFKA_BOOTSTRAP_SERVERS"]
    topic = f"t{uuid.uuid4().hex[:8]}.limits"
    ensure_topics(servers, [TopicSpec(topic, partitions=2)])
    produced = await limits.kafka_producer_rate(servers, topic, records=2_000, record_size=100)
    assert produced.measured and produced.per_s > 0, produced
    read = await limits.kafka_consumer_rate(servers, {topic: 2_000})
    assert read.measured and read.per_s > 0, read
    admin = make_admin(servers, "test-limits")
    try:
        groups = [g["group_id"] for g in admin.list_groups()]
    finally:
        admin.close()
    assert not [g for g in groups if g.startswith("niuniu-perf-")]  # its consumer group was deleted


async def _probe_tables(dsn: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'probe\\_%'")
        return [str(r[0]) for r in await cur.fetchall()]
