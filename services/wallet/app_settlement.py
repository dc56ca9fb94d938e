"""The wallet application's settlements: a round's payouts applied in the consumer's transaction.

A settlement is applied once (a re-sent one is a duplicate); one that cannot be applied is
recorded as rejected and changes nothing. The round's holds it does not name are released.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime

import psycopg

from backbone.errors import NotFound
from services.wallet import domain, domain_holds, domain_settlement, events, metrics, repo, repo_holds, repo_settlement
from services.wallet.app_holds import Holds
from services.wallet.domain_holds import Hold
from services.wallet.domain_settlement import SettlementCommand, SettlementRejected

log = logging.getLogger(__name__)


def settlement_digest(command: SettlementCommand) -> str:
    return hashlib.sha256(repr(command).encode()).hexdigest()


class Settlement(Holds):
    """A table's settlement of a round, applied in the consumer's transaction, or rejected as a whole."""

    async def round_settlement(self, round_id: str) -> repo_settlement.RoundRecord:
        domain.check_id(round_id, "ROUND_ID")
        async with self._pool.connection() as conn:
            found = await repo_settlement.round_record(conn, round_id)
        if found is None:
            raise NotFound("ROUND_NOT_FOUND", f"the wallet has seen no settlement of round {round_id}")
        return found

    async def apply_settlement(
        self, conn: psycopg.AsyncConnection, command: SettlementCommand, source_type: str, source_id: str
    ) -> str:
        """Apply a table's settlement in the caller's transaction; returns "settled", "voided",
        "duplicate" or "rejected". A bad settlement never raises: it is recorded as rejected."""
        if not domain.is_id(command.round_id):
            detail = f"round id {command.round_id!r:.80}"
            await self.reject_settlement(conn, command, source_type, source_id, "ROUND_ID_INVALID", detail)
            return "rejected"
        now = self.clock()
        outcome = "voided" if command.voided else "settled"
        record = await repo_settlement.round_record(conn, command.round_id, lock=True)
        digest = settlement_digest(command)
        if record is not None and record.status != "rejected":
            if record.status == outcome and record.digest == digest:
                metrics.SETTLEMENTS_DUPLICATE.inc()
                log.info("settlement already applied", extra={"round_id": command.round_id})
                return "duplicate"
            reason = "ROUND_ALREADY_SETTLED" if record.status == "settled" else "ROUND_ALREADY_VOIDED"
            detail = f"round {command.round_id} was already {record.status}; this {source_type} differs"
            await self.reject_settlement(conn, command, source_type, source_id, reason, detail)
            return "rejected"
        try:
            plan, strays = await self._plan_settlement(conn, command, now)
        except SettlementRejected as rejected:
            await self.reject_settlement(conn, command, source_type, source_id, rejected.reason, rejected.detail)
            return "rejected"
        version = record.version if record else 0
        applied = events.settlement_applied(command.round_id, command.table_id, plan, command.voided, source_id)
        # The writes in one round trip: nothing here reads a result (the hold statuses are checked by
        # the resolutions' statement, the round stream's version by the strict append).
        async with conn.pipeline():
            await repo_holds.save_resolutions(conn, plan.holds)
            await repo.save_movements(conn, plan.movements, "settlement", now)
            await self._store.append_queued(conn, events.round_stream(command.round_id), version, [applied])
            await repo_settlement.save_round(
                conn,
                repo_settlement.RoundRecord(
                    command.round_id, command.table_id, outcome, version + 1, digest, "", "", now
                ),
            )
        released = await self._release_strays(conn, strays, now, command.round_id)
        metrics.SETTLEMENTS_APPLIED.labels(outcome).inc()
        for hold in (*plan.holds, *released):
            self._count_resolution(hold)
        log.info(
            "settlement applied",
            extra={"round_id": command.round_id, "outcome": outcome, "movements": len(plan.movements)},
        )
        return outcome

    async def _plan_settlement(
        self, conn: psycopg.AsyncConnection, command: SettlementCommand, now: datetime
    ) -> tuple[domain_settlement.SettlementPlan, list[tuple[str, str]]]:
        """The settlement decided on its locked accounts and holds, and the round's holds it does not name
        (hold id, account; their accounts locked too)."""
        hold_ids = command.all_hold_ids()
        named, others = await repo_settlement.settlement_holds(conn, command.round_id, hold_ids)
        # The owners of the round's holds the settlement does not name are locked now too (with
        # the rest, in one order), for _release_strays.
        owners = {h.account for h in named.values()} | {account for _, account in others}
        locks = await repo_settlement.lock_for_settlement(conn, command.round_id, command.accounts() | owners, hold_ids)
        states = {n: a.state for n, a in locks.accounts.items()}
        return domain_settlement.decide_settlement(command, states, locks.holds, now), locks.strays

    async def _release_strays(
        self, conn: psycopg.AsyncConnection, strays: list[tuple[str, str]], now: datetime, round_id: str
    ) -> list[Hold]:
        """Release the round's open holds its settlement does not name (``strays``: hold id, account), as
        VoidHold would.

        A bet whose hold the wallet placed but whose recording at the table failed (the table
        timed out waiting for the wallet and could not reach it to void the hold) is in no
        settlement: once the round's one settlement is applied nothing can post that hold, so
        it is released here, in the settlement's transaction, instead of waiting for its expiry.
        The movement is the one VoidHold makes (``void:<hold id>``), so a later VoidHold from the
        table is a replay."""
        released: list[Hold] = []
        for hold_id, account in strays:
            locked = await repo.lock_accounts(conn, [account])  # held already: the current version
            hold = await repo_holds.hold(conn, hold_id, lock=True)
            if hold is None or account not in locked:
                continue
            decision = domain_holds.decide_void(hold, now)
            if decision.replayed:
                continue
            await self._save_resolution(conn, locked, decision, now)
            released.append(decision.hold)
            log.warning(
                "hold of a settled round released: the settlement does not name it",
                extra={"round_id": round_id, "hold_id": hold_id, "amount_minor": hold.amount_minor},
            )
        return released

    async def reject_settlement(
        self,
        conn: psycopg.AsyncConnection,
        command: SettlementCommand,
        source_type: str,
        source_id: str,
        reason: str,
        detail: str,
    ) -> None:
        """Record that nothing of a settlement was applied, and why; an applied round keeps its status."""
        event = events.settlement_rejected(command.round_id, command.table_id, source_type, source_id, reason, detail)
        if not domain.is_id(command.round_id):
            await self._store.append(conn, events.round_stream(f"invalid-{source_id}"), 0, [event])
        else:
            record = await repo_settlement.round_record(conn, command.round_id, lock=True)
            version = record.version if record else 0
            await self._store.append(conn, events.round_stream(command.round_id), version, [event])
            applied = record is not None and record.status != "rejected"
            await repo_settlement.save_round(
                conn,
                repo_settlement.RoundRecord(
                    command.round_id,
                    record.table_id if record and applied else command.table_id,
                    record.status if record and applied else "rejected",
                    version + 1,
                    record.digest if record and applied else settlement_digest(command),
                    reason,
                    detail,
                    self.clock(),
                ),
            )
        self._count_rejection(command, reason, detail)

    @staticmethod
    def _count_rejection(command: SettlementCommand, reason: str, detail: str) -> None:
        metrics.SETTLEMENTS_REJECTED.labels(reason).inc()
        log.error(
            "settlement rejected: nothing of it was applied",
            extra={"round_id": command.round_id, "table_id": command.table_id, "reason": reason, "detail": detail},
        )
