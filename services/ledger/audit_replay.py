"""``niuniu-audit replay``'s work: the wallet's balances taken, the journal replayed from Kafka into a scratch
store, and the replay reconciled with the live journal and the wallet (the table's rounds with the wallet
alongside, ``services/ledger/settlements.py``); the report printed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import psycopg

from backbone.archive import Verified
from backbone.replay import replay
from backbone.replay.model import ReplayReport
from services.ledger import queries
from services.ledger.archived import open_archive, print_archive
from services.ledger.audit_config import AuditConfig, AuditError
from services.ledger.audit_kafka import partition_counts, wait_for_wallet_position
from services.ledger.audit_scratch import connect, scratch_store
from services.ledger.projection import CONSUMER, JOURNAL
from services.ledger.reconcile import (
    BalanceSource,
    Difference,
    JournalComparison,
    WalletBalance,
    WalletComparison,
    WalletUnavailable,
    compare_balance_maps,
    compare_journals,
    compare_with_wallet,
)
from services.ledger.settlements import SettlementReconciler, SettlementReconciliation

CUT_POLL_S = 0.2
"""How often the audit asks the wallet how far its events have reached Kafka."""

PartitionKey = tuple[str, int]


@dataclass
class AuditReport:
    replay: ReplayReport
    journal: JournalComparison
    live_trial: queries.TrialBalance
    replay_trial: queries.TrialBalance
    rejects: list[queries.RejectRecord]
    wallet: WalletComparison | None
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wallet_error: str = ""
    # The wallet event position the wallet comparison was made at (0: no wallet comparison).
    cut_position: int = 0
    scratch: str = ""
    settlements: SettlementReconciliation | None = None
    archive: Verified | None = None

    @property
    def ok(self) -> bool:
        return not self.differences and not self.wallet_error


async def _replay_cut(conn: psycopg.AsyncConnection) -> dict[PartitionKey, int]:
    """The last offset the replay read, per partition."""
    cur = await conn.execute(
        'SELECT topic, partition, max("offset") FROM processed_events WHERE consumer = %s GROUP BY 1, 2', (CONSUMER,)
    )
    return {(str(r[0]), int(r[1])): int(r[2]) for r in await cur.fetchall()}


async def _live_positions(conn: psycopg.AsyncConnection) -> dict[PartitionKey, int]:
    """The next offset the live consumer will read, per partition."""
    cur = await conn.execute(
        "SELECT topic, partition, next_offset FROM consumer_positions WHERE consumer = %s", (CONSUMER,)
    )
    return {(str(r[0]), int(r[1])): int(r[2]) for r in await cur.fetchall()}


def _in_live_scope(replay_cut: dict[PartitionKey, int]) -> Callable[[queries.EntryRecord], bool]:
    return lambda e: e.partition < 0 or e.offset <= replay_cut.get((e.topic, e.partition), -1)


def _in_replay_scope(live_next: dict[PartitionKey, int]) -> Callable[[queries.EntryRecord], bool]:
    return lambda e: e.partition < 0 or e.offset < live_next.get((e.topic, e.partition), 0)


def _trial_differences(label: str, trial: queries.TrialBalance) -> list[Difference]:
    if trial.imbalance_minor == 0:
        return []
    return [
        Difference(
            "trial_balance",
            f"{label} journal",
            "total debits != total credits",
            str(trial.total_debit_minor),
            str(trial.total_credit_minor),
            "credits",
        )
    ]


def _reject_differences(live: list[queries.RejectRecord], replayed: list[queries.RejectRecord]) -> list[Difference]:
    found = [
        Difference(
            "rejects", f"entry {r.entry_id} (event {r.event_id})", f"movement refused: {r.reason}", "-", r.detail
        )
        for r in replayed
    ]
    live_keys = {(r.event_id, r.movement_index): r.reason for r in live}
    replay_keys = {(r.event_id, r.movement_index): r.reason for r in replayed}
    for key in sorted(set(live_keys) | set(replay_keys)):
        if live_keys.get(key) != replay_keys.get(key):
            found.append(
                Difference(
                    "rejects",
                    f"event {key[0]} movement {key[1]}",
                    "reject differs",
                    str(live_keys.get(key)),
                    str(replay_keys.get(key)),
                )
            )
    return found


async def audit_replay(
    config: AuditConfig,
    wallet: BalanceSource | None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> AuditReport:
    """Replay, then reconcile live vs replay vs wallet. ``wallet`` None skips the wallet comparison.

    The wallet's balances are taken first (each page exact as of a wallet position); the
    replay starts once Kafka holds every wallet event up to the highest of them, so the
    rebuilt journal as of each page's position is the consistent cut to compare with.
    """
    topic_names = [config.topics.wallet_events, config.topics.table_events]
    listed: dict[str, WalletBalance] | None = None
    wallet_error = ""
    if wallet is not None:
        try:
            listed = await wallet.balances()
        except WalletUnavailable as error:
            wallet_error = str(error)
    cut = max((b.as_of_position for b in (listed or {}).values()), default=0)
    archived, checked = (
        open_archive(config.archive, config.archive_head, topic_names) if config.archive else (None, None)
    )
    await _wait_for_cut(config, cut, checked, wallet if listed is not None else None)
    partitions = await asyncio.to_thread(partition_counts, config.kafka, topic_names)
    settlements = SettlementReconciler(config.topics.wallet_events, config.topics.table_events, partitions)
    async with scratch_store(config) as (scratch_dsn, scratch_label):
        replayed = await replay(  # the plain indexes only for a replay kept for inspection: nothing here reads them
            scratch_dsn,
            config.kafka,
            topic_names,
            JOURNAL,
            config.replay_schema,
            progress=progress,
            indexes=config.keep_replay,
            observe=settlements.observe,  # fed every event the replay reads
            workers=config.workers if config.workers > 1 else 0,
            archived=archived,
        )
        live_conn = await connect(config.dsn, config.live_schema)
        replay_conn = await connect(scratch_dsn, config.replay_schema)
        async with live_conn, replay_conn:
            report = await _reconcile(live_conn, replay_conn, replayed, listed)
    report.settlements = settlements.finish()
    report.differences.extend(report.settlements.differences)
    report.wallet_error = wallet_error
    report.cut_position = cut
    report.scratch = scratch_label
    report.archive = checked
    return report


async def _wait_for_cut(config: AuditConfig, cut: int, checked: Verified | None, wallet: BalanceSource | None) -> None:
    """Wait until Kafka holds every wallet event up to the wallet's snapshot at ``cut``, but those in the
    archive (``checked``); ``AuditError`` if it does not within ``config.cut_timeout_s``.

    The wallet's relays publish partition by partition (each replica its own share), so the last record
    of each partition says nothing of an earlier event still on its way to another one: the wallet's own
    ``published_below`` is the watermark. A wallet that does not give it is judged by the partitions."""
    # Every wallet event below the archive's ``archived_below`` is in the archive (Kafka may have deleted them).
    floor = max((h.archived_below.get("wallet", 1) - 1 for h in checked.headers), default=0) if checked else 0
    if cut <= floor:
        return
    below = await _wait_for_published(wallet, cut, config.cut_timeout_s) if wallet is not None else 0
    if below > cut:
        return
    if below:
        raise AuditError(
            f"the wallet has published its events below position {below} only, {config.cut_timeout_s:.0f} s"
            f" after its snapshot at position {cut}: is the wallet's relay publishing?"
        )
    reached = await asyncio.to_thread(
        wait_for_wallet_position, config.kafka, config.topics.wallet_events, cut, config.cut_timeout_s
    )
    if reached < cut:
        raise AuditError(
            f"Kafka holds wallet events up to position {reached} only, {config.cut_timeout_s:.0f} s after the"
            f" wallet's snapshot at position {cut}: is the wallet's relay publishing?"
        )


async def _wait_for_published(wallet: BalanceSource, cut: int, timeout_s: float) -> int:
    """The wallet's ``published_below`` once it passes ``cut`` (or at the deadline; 0: not given)."""
    deadline = time.monotonic() + timeout_s
    while True:
        below = await wallet.published_below()
        if below > cut or below == 0 or time.monotonic() >= deadline:
            return below
        await asyncio.sleep(CUT_POLL_S)


async def _reconcile(
    live_conn: psycopg.AsyncConnection,
    replay_conn: psycopg.AsyncConnection,
    replayed: ReplayReport,
    listed: dict[str, WalletBalance] | None,
) -> AuditReport:
    replay_cut, live_next = await _replay_cut(replay_conn), await _live_positions(live_conn)
    live_scope, replay_scope = _in_live_scope(replay_cut), _in_replay_scope(live_next)
    journal = await compare_journals(
        queries.iter_entries(live_conn),
        queries.iter_entries(replay_conn),
        live_in_scope=live_scope,
        replayed_in_scope=replay_scope,
    )
    live_trial = await queries.trial_balance(live_conn, from_lines=True)
    replay_trial = await queries.trial_balance(replay_conn, from_lines=True)
    live_rejects, replay_rejects = await queries.rejects(live_conn), await queries.rejects(replay_conn)
    report = AuditReport(replayed, journal, live_trial, replay_trial, replay_rejects, None)
    report.differences.extend(journal.differences)
    report.differences.extend(_trial_differences("live", live_trial))
    report.differences.extend(_trial_differences("replayed", replay_trial))
    report.differences.extend(_reject_differences(live_rejects, replay_rejects))
    replay_balances = await queries.balances_table(replay_conn)
    for label, conn, table in (
        ("live", live_conn, await queries.balances_table(live_conn)),
        ("replayed", replay_conn, replay_balances),
    ):
        report.differences.extend(
            Difference(d.check, f"{label} {d.subject}", "balances table vs journal lines", d.live, d.other, "lines")
            for d in compare_balance_maps("balances", table, await queries.balances_from_lines(conn), "lines")
        )
    if journal.live_out_of_scope or journal.replayed_out_of_scope:
        report.notes.append(
            f"the live consumer and the replay saw different stream ends ({journal.live_out_of_scope} live entries "
            f"newer than the replay, {journal.replayed_out_of_scope} replayed entries the live consumer has not "
            "reached): those entries and the live-vs-replay balances were not compared"
        )
    else:
        live_balances = await queries.balances_table(live_conn)
        report.differences.extend(compare_balance_maps("balances", live_balances, replay_balances, "replay"))
    if listed is not None:
        report.wallet = compare_with_wallet(replay_balances, listed, await _replayed_as_of(replay_conn, listed))
        report.differences.extend(report.wallet.differences)
    return report


async def _replayed_as_of(
    replay_conn: psycopg.AsyncConnection, listed: dict[str, WalletBalance]
) -> dict[int, dict[tuple[str, str], int]]:
    """Each listed account's replayed balances as of its page's wallet position (the same cut on both
    sides), by position. One pass over the journal, whatever the number of pages: a trial balance as of
    each page's position read the whole journal once a page (1 000 accounts a page)."""
    cuts = {account: b.as_of_position for account, b in listed.items() if b.as_of_position > 0}
    as_of: dict[int, dict[tuple[str, str], int]] = {position: {} for position in cuts.values()}
    if not cuts:
        return as_of
    cur = await replay_conn.execute(
        "SELECT l.account, l.bucket, c.at, sum(l.credit_minor) - sum(l.debit_minor)"
        " FROM unnest(%s::text[], %s::bigint[]) AS c (account, at)"
        " JOIN journal_lines l ON l.account = c.account"
        " JOIN journal_entries e ON e.entry_id = l.entry_id AND e.wallet_position <= c.at"
        " GROUP BY 1, 2, 3",
        (list(cuts), list(cuts.values())),
    )
    for account, bucket, at, balance in await cur.fetchall():
        as_of[int(at)][str(account), str(bucket)] = int(balance)
    return as_of


def print_report(report: AuditReport, out: TextIO, *, wallet_skipped: bool) -> None:
    r, j = report.replay, report.journal
    rate = r.events_read / r.seconds if r.seconds else 0.0
    print("ledger audit: replay reconciliation", file=out)
    print(
        f"  replay     {r.events_read} events read, {r.events_applied} applied in {r.seconds:.2f} s"
        f" ({rate:.0f} events/s) into schema {r.schema}",
        file=out,
    )
    if report.scratch:
        print(f"  scratch    {report.scratch}", file=out)
    if report.archive is not None:
        print_archive(report.archive, out)
    print(
        f"  journal    live {j.live_entries} entries, replayed {j.replayed_entries}, compared {j.compared};"
        f" not compared: {j.live_out_of_scope} live, {j.replayed_out_of_scope} replayed",
        file=out,
    )
    for label, trial in (("live", report.live_trial), ("replayed", report.replay_trial)):
        print(
            f"  trial      {label:<8} {len(trial.rows)} account/buckets, debits {trial.total_debit_minor}"
            f" credits {trial.total_credit_minor} imbalance {trial.imbalance_minor}",
            file=out,
        )
    print(f"  rejects    {len(report.rejects)} movements refused by the journal", file=out)
    if report.settlements is not None:
        s = report.settlements
        print(
            f"  rounds     table vs wallet: {s.rounds_applied} applied, {s.rounds_refused} refused by the wallet,"
            f" {s.rounds_awaiting} awaiting its answer; {s.bets_compared} bets' holds compared",
            file=out,
        )
    if wallet_skipped:
        print("  wallet     skipped (--no-wallet)", file=out)
    elif report.wallet_error:
        print(f"  wallet     UNAVAILABLE: {report.wallet_error}", file=out)
    elif report.wallet is not None:
        not_listed = ", ".join(report.wallet.not_listed_by_wallet) or "none"
        print(
            f"  wallet     {report.wallet.accounts_compared} accounts compared"
            f" (system accounts the wallet does not list: {not_listed})",
            file=out,
        )
        if report.cut_position:
            print(
                f"  cut        the wallet's balances at wallet position {report.cut_position}, the replayed journal"
                " as of the same position (later events: not compared with the wallet)",
                file=out,
            )
    for note in report.notes:
        print(f"  note: {note}", file=out)
    print(f"differences: {len(report.differences)}", file=out)
    for difference in report.differences:
        print(f"  {difference}", file=out)
    print("RESULT: OK" if report.ok else "RESULT: FAILED", file=out)
