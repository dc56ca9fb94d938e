"""A replay by worker processes, each a share of the partitions, rebuilds the same journal as a replay in one
process, and shows its observer every record once; its partitions are divided evenly."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest
from kafka import TopicPartition
from psycopg import sql
from test_replay_staged import ORDER, _publish, _rows

from backbone.handlers import Tracked
from backbone.replay import replay
from backbone.replay.workers import ReplayWorkerFailed, divide, ready_workers
from backbone.topics import Topics
from services.ledger.projection import JOURNAL


@pytest.mark.integration
async def test_two_workers_rebuild_the_journal_one_process_does(dsn: str, kafka_servers: str, unique: str) -> None:
    """With the awkward cases (an event published twice, an entry id reused, a round settled twice): each
    pair shares a key, so a partition, so a worker, and the careful path runs inside the workers."""
    topics = Topics(f"w{unique}.")
    count = len(_publish(kafka_servers, topics))
    names = [topics.wallet_events, topics.table_events]
    alone, shared = f"rw1_{unique}", f"rw2_{unique}"
    seen: list[str] = []

    def observe(batch: Sequence[Tracked]) -> None:
        seen.extend(f"{t.topic}:{t.partition}:{t.offset}" for t in batch)

    try:
        one = await replay(dsn, kafka_servers, names, JOURNAL, alone)
        two = await replay(dsn, kafka_servers, names, JOURNAL, shared, workers=2, observe=observe)
        assert two.events_read == one.events_read == count + count // 50  # every 50th published twice
        assert two.events_applied == one.events_applied == count
        assert len(seen) == len(set(seen)) == one.events_read  # the observer: every record, once
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            for table, order in ORDER.items():
                rows = await _rows(conn, alone, table, order)
                assert rows, table
                assert await _rows(conn, shared, table, order) == rows, table
            # Written by two processes, so ``seq`` interleaves; its uniqueness was put back at the end.
            cur = await conn.execute(
                sql.SQL("SELECT count(DISTINCT seq) = count(*) FROM {}.journal_entries").format(sql.Identifier(shared))
            )
            assert await cur.fetchone() == (True,)
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for schema in (alone, shared):
                await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.integration
async def test_a_worker_that_fails_fails_the_replay(dsn: str, kafka_servers: str, unique: str) -> None:
    """A worker whose writes fail (here: the scratch schema's projection tables are not the ones it
    writes) ends the replay with the worker's error, not with a partial journal taken as whole."""
    topics = Topics(f"wf{unique}.")
    _publish(kafka_servers, topics, awkward=False)
    broken = dataclasses.replace(JOURNAL, stage_ddl=("SELECT 1/0",))
    schema = f"rwf_{unique}"
    try:
        with pytest.raises(ReplayWorkerFailed, match=r"replay-worker-\d: DivisionByZero"):
            await replay(dsn, kafka_servers, [topics.wallet_events, topics.table_events], broken, schema, workers=2)
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_the_partitions_are_divided_by_their_records() -> None:
    end = {TopicPartition("w", p): n for p, n in enumerate([900, 100, 500, 400, 0, 300])}
    end |= {TopicPartition("t", p): n for p, n in enumerate([200, 200])}
    shares = divide(end, 3)
    sizes = sorted(sum(end[tp] for tp in share) for share in shares)
    assert sizes == [800, 900, 900]
    assert Counter(tp for share in shares for tp in share) == Counter(tp for tp, n in end.items() if n)
    assert divide(end, 10) == [[tp] for tp in sorted((tp for tp in end if end[tp]), key=lambda tp: -end[tp])]


def test_the_shares_are_evened_out_beyond_the_largest_first() -> None:
    """Largest first alone gives these 75 296, 67 382 and 57 323 records (the bench's partitions); moving and
    swapping partitions between pairs of shares evens them out to the best three shares there are."""
    sizes = [32900, 32793, 29956, 27367, 24353, 21599, 20797, 10236]
    end = {TopicPartition("w", p): n for p, n in enumerate(sizes)}
    shares = divide(end, 3)
    assert sorted(sum(end[tp] for tp in share) for share in shares) == [65693, 66749, 67559]
    assert sorted(tp.partition for share in shares for tp in share) == list(range(len(sizes)))
    halves = divide(end, 2)
    assert sorted(sum(end[tp] for tp in share) for share in halves) == [99719, 100282]


def test_a_worker_starts_with_the_replays_code_already_loaded() -> None:
    """Workers are forked from a server that imported the replay's code (psycopg's C library among it), so
    a worker does not import it again under its CPU quota: the library is mapped in a worker whose own
    target (``time.sleep``) needs none of it. A worker of a fresh interpreter would not have it."""
    context = ready_workers(JOURNAL)
    worker = context.Process(target=time.sleep, args=(30,), daemon=True)
    worker.start()
    try:
        assert worker.pid is not None
        maps = Path(f"/proc/{worker.pid}/maps").read_text()
        assert "psycopg_binary" in maps
    finally:
        worker.terminate()
        worker.join()
