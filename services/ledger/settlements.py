"""The table's record against the wallet's, round by round, from the event stream the replay reads (pure).

``niuniu-audit replay`` compares the journal with itself and with the wallet's balances; a round
the table settled and the wallet refused leaves both consistent (the journal holds what the
wallet did), so those comparisons cannot see it. A ``SettlementReconciler`` is fed every event
the replay reads (both topics, poll after poll) and judges each round that has an outcome:

- the wallet's last answer to it: ``wallet.round_settlement_applied``, or a difference when the
  wallet refused it (``wallet.round_settlement_rejected``) or never answered while its own
  stream went on for ``WALLET_ANSWER_GRACE_S`` after the outcome;
- for an applied round, ``verify-round``'s checks (``verify.CHECKS``) over the wallet's
  movements of the round and the table's outcome the wallet applied (every transfer has its
  movement, every hold of the round is resolved, a voided round moves no money);
- every live bet the table recorded for the round: the hold its record needs (``hold_minor`` of
  its last ``table.bet_placed`` / ``table.bet_changed``) against what the wallet holds for that
  hold id before answering (its last ``wallet.hold_placed`` / ``wallet.hold_resized``, zero once
  voided).

Rounds are judged as soon as the wallet applied them and every partition of both topics has been
read past the events involved (store positions grow along a partition), then forgotten but for
their id (a copy sent again by a relay is recognised by it); the rest are judged at the end. A
round refused by the wallet is kept to the end: a documented repair may still void or settle it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from niuniu.table.v1 import events_pb2 as table_pb2
from niuniu.v1 import events_pb2
from niuniu.wallet.v1 import events_pb2 as wallet_pb2

from backbone.handlers import Tracked
from backbone.replay.model import StagedBatch, Stager
from services.ledger.journal import Line, journal_rows
from services.ledger.queries import EntryRecord, RejectRecord, RoundRecord
from services.ledger.reconcile import Difference
from services.ledger.verify import RoundEvidence, run_checks

# A round the table ended this long before the wallet's latest event, with no answer from the wallet,
# was not answered (the wallet consumes the table's outcomes within seconds); a later one may be in flight.
WALLET_ANSWER_GRACE_S = 60.0

_TABLE_OUTCOMES = {"table.round_settled": "settled", "table.round_voided": "voided"}


@dataclass(slots=True)
class _Hold:
    round_id: str
    amount_minor: int
    position: int  # the wallet position of the amount's event
    resolved_at: int = 0  # the wallet position of its HoldVoided / HoldPosted outside a settlement (0: none)
    cause: str = ""


@dataclass(slots=True)
class _Bet:
    hold_id: str
    hold_minor: int
    position: int  # the table position of the hold_minor's event
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class _Outcome:
    status: str  # "settled" | "voided"
    event: bytes  # the serialized RoundSettled / RoundVoided
    position: int
    occurred_at: datetime


@dataclass(frozen=True, slots=True)
class _Answer:
    applied: bool
    position: int
    source_event_id: str  # the table event it answers
    reason: str = ""
    detail: str = ""
    outcome: str = ""  # what the wallet applied: "settled" | "voided"


@dataclass(slots=True)
class _Round:
    outcomes: dict[str, _Outcome] = field(default_factory=dict)  # by table event id
    answer: _Answer | None = None  # the wallet's latest
    entries: dict[str, EntryRecord] = field(default_factory=dict)  # the wallet's movements of the round, by id
    rejects: list[RejectRecord] = field(default_factory=list)
    bets: dict[str, _Bet] = field(default_factory=dict)
    holds: set[str] = field(default_factory=set)

    def last_outcome(self) -> tuple[str, _Outcome] | None:
        return max(self.outcomes.items(), key=lambda item: item[1].position, default=None)


@dataclass
class SettlementReconciliation:
    rounds_applied: int = 0
    rounds_refused: int = 0
    rounds_awaiting: int = 0  # ended by the table within the grace, no answer yet
    bets_compared: int = 0
    differences: list[Difference] = field(default_factory=list)


class SettlementReconciler:
    """Folds the events of the wallet and table topics (``observe``) into round verdicts (``finish``).

    ``partitions``: each topic's partition count, so a round is judged early only once every
    partition was read past it. Not thread-safe: the replay calls its stager from one thread at a time.
    """

    def __init__(self, wallet_topic: str, table_topic: str, partitions: Mapping[str, int]) -> None:
        self._wallet_topic, self._table_topic = wallet_topic, table_topic
        self._partitions = dict(partitions)
        self._read_to: dict[tuple[str, int], int] = {}  # the highest store position read, per partition
        self._rounds: dict[str, _Round] = {}
        self._holds: dict[str, _Hold] = {}
        self._bets: dict[str, str] = {}  # bet id -> round id, for the bets of rounds not yet judged
        self._done: set[str] = set()
        self._ready: set[str] = set()  # applied rounds waiting for the partitions to pass them
        self._wallet_latest = datetime.min.replace(tzinfo=UTC)
        self.result = SettlementReconciliation()

    def observing(self, stager: Stager) -> Stager:
        """``stager`` that also feeds each poll to this reconciler (the replay's events, read once)."""

        def stage(batch: Sequence[Tracked]) -> StagedBatch:
            self.observe(batch)
            return stager(batch)

        return stage

    def observe(self, batch: Sequence[Tracked]) -> None:
        for tracked in batch:
            envelope = tracked.envelope
            key = (tracked.topic, tracked.partition)
            self._read_to[key] = max(self._read_to.get(key, 0), envelope.store_position)
            if tracked.topic == self._wallet_topic:
                self._wallet_event(tracked)
            elif tracked.topic == self._table_topic:
                self._table_event(envelope)
        for round_id in [r for r in self._ready if self._passed(r)]:
            self._judge(round_id)

    def finish(self) -> SettlementReconciliation:
        """Judge every round still held (the stream's end passes them all); the result."""
        for round_id in sorted(self._rounds):
            state = self._rounds[round_id]
            if state.outcomes or state.answer is not None:
                self._judge(round_id)
        return self.result

    # --- the table's side ---------------------------------------------------------------------------

    def _table_event(self, envelope: events_pb2.EventEnvelope) -> None:
        kind = envelope.event_type
        if kind in _TABLE_OUTCOMES:
            message = table_pb2.RoundSettled() if kind == "table.round_settled" else table_pb2.RoundVoided()
            envelope.payload.Unpack(message)
            round_id = message.round_id or envelope.correlation_id
            state = self._round(round_id)
            if state is not None:
                at = envelope.occurred_at.ToDatetime(tzinfo=UTC)
                outcome = _Outcome(_TABLE_OUTCOMES[kind], message.SerializeToString(), envelope.store_position, at)
                state.outcomes.setdefault(envelope.event_id, outcome)
        elif kind in ("table.bet_placed", "table.bet_changed"):
            bet = table_pb2.BetPlaced() if kind == "table.bet_placed" else table_pb2.BetChanged()
            envelope.payload.Unpack(bet)
            self._bet_needs(bet.round_id, bet.bet_id, bet.hold_id, bet.hold_minor, envelope.store_position)
        elif kind == "table.bet_cancelled":
            cancelled = table_pb2.BetCancelled()
            envelope.payload.Unpack(cancelled)
            state = self._rounds.get(self._bets.get(cancelled.bet_id, ""))
            if state is not None and cancelled.bet_id in state.bets:
                state.bets[cancelled.bet_id].cancelled = True

    def _bet_needs(self, round_id: str, bet_id: str, hold_id: str, hold_minor: int, position: int) -> None:
        state = self._round(round_id)
        if state is None:
            return
        known = state.bets.get(bet_id)
        if known is None or known.position < position:
            cancelled = known.cancelled if known is not None else False
            state.bets[bet_id] = _Bet(hold_id, hold_minor, position, cancelled)
            self._bets[bet_id] = round_id

    # --- the wallet's side --------------------------------------------------------------------------

    def _wallet_event(self, tracked: Tracked) -> None:
        envelope = tracked.envelope
        self._wallet_latest = max(self._wallet_latest, envelope.occurred_at.ToDatetime(tzinfo=UTC))
        kind = envelope.event_type
        if kind == "wallet.round_settlement_applied":
            applied = wallet_pb2.RoundSettlementApplied()
            envelope.payload.Unpack(applied)
            answer = _Answer(True, envelope.store_position, envelope.causation_id, outcome=applied.outcome)
            self._answer(applied.round_id or envelope.correlation_id, answer)
        elif kind == "wallet.round_settlement_rejected":
            rejected = wallet_pb2.RoundSettlementRejected()
            envelope.payload.Unpack(rejected)
            answer = _Answer(False, envelope.store_position, rejected.source_event_id, rejected.reason, rejected.detail)
            self._answer(rejected.round_id or envelope.correlation_id, answer)
        elif kind in ("wallet.hold_placed", "wallet.hold_resized", "wallet.hold_voided", "wallet.hold_posted"):
            self._hold_event(envelope)
        else:
            return
        self._journal(tracked)

    def _answer(self, round_id: str, answer: _Answer) -> None:
        state = self._round(round_id)
        if state is None or (state.answer is not None and state.answer.position >= answer.position):
            return
        state.answer = answer
        if answer.applied:
            self._ready.add(round_id)
        else:
            self._ready.discard(round_id)

    def _hold_event(self, envelope: events_pb2.EventEnvelope) -> None:
        position = envelope.store_position
        if envelope.event_type == "wallet.hold_placed":
            placed = wallet_pb2.HoldPlaced()
            envelope.payload.Unpack(placed)
            state = self._round(placed.round_id) if placed.round_id else None
            if state is not None and placed.hold_id not in self._holds:
                self._holds[placed.hold_id] = _Hold(placed.round_id, placed.amount_minor, position)
                state.holds.add(placed.hold_id)
        elif envelope.event_type == "wallet.hold_resized":
            resized = wallet_pb2.HoldResized()
            envelope.payload.Unpack(resized)
            hold = self._holds.get(resized.hold_id)
            if hold is not None and hold.position < position:
                hold.amount_minor, hold.position = resized.amount_minor, position
        else:  # resolved outside a settlement: nothing is held any more
            voided = envelope.event_type == "wallet.hold_voided"
            resolved = wallet_pb2.HoldVoided() if voided else wallet_pb2.HoldPosted()
            envelope.payload.Unpack(resolved)
            hold = self._holds.get(resolved.hold_id)
            if hold is not None and not hold.resolved_at:
                cause = resolved.cause if isinstance(resolved, wallet_pb2.HoldVoided) else "posted"
                hold.resolved_at, hold.cause = position, cause

    def _journal(self, tracked: Tracked) -> None:
        """The event's movements as the journal writes them, kept with their round (the evidence of verify)."""
        envelope = tracked.envelope
        rows, rejected = journal_rows(envelope)
        at = envelope.occurred_at.ToDatetime(tzinfo=UTC)
        for entry_id, index, kind, round_id, hold_id, bet_id, lines in rows:
            state = self._rounds.get(round_id)
            if state is None or round_id in self._done:
                continue
            state.entries.setdefault(
                entry_id,
                EntryRecord(
                    entry_id, envelope.event_id, index, envelope.event_type, kind, round_id, hold_id, bet_id, at,
                    tracked.topic, tracked.partition, tracked.offset, envelope.store_position,
                    tuple(Line(*line) for line in lines),
                ),
            )  # fmt: skip
        state = self._rounds.get(envelope.correlation_id)
        if state is not None:
            state.rejects.extend(
                RejectRecord(envelope.event_id, r.movement_index, r.entry_id, envelope.event_type,
                             envelope.correlation_id, r.reason, r.detail)
                for r in rejected
            )  # fmt: skip

    # --- verdicts -----------------------------------------------------------------------------------

    def _round(self, round_id: str) -> _Round | None:
        """The round's state, made on first sight; None for a round judged already (a copy sent again)."""
        if not round_id or round_id in self._done:
            return None
        state = self._rounds.get(round_id)
        if state is None:
            state = self._rounds[round_id] = _Round()
        return state

    def _passed(self, round_id: str) -> bool:
        """Every partition of both topics was read past the round's outcome and the wallet's answer."""
        state = self._rounds[round_id]
        last = state.last_outcome()
        if state.answer is None or last is None:
            return False
        return self._read_past(self._wallet_topic, state.answer.position) and self._read_past(
            self._table_topic, last[1].position
        )

    def _read_past(self, topic: str, position: int) -> bool:
        count = self._partitions.get(topic, 0)
        return count > 0 and all(self._read_to.get((topic, p), 0) >= position for p in range(count))

    def _judge(self, round_id: str) -> None:
        state = self._rounds.pop(round_id)
        self._ready.discard(round_id)
        self._done.add(round_id)
        self.result.differences.extend(self._verdict(round_id, state))
        self.result.differences.extend(self._hold_differences(round_id, state))
        for hold_id in state.holds:
            self._holds.pop(hold_id, None)
        for bet_id in state.bets:
            self._bets.pop(bet_id, None)

    def _verdict(self, round_id: str, state: _Round) -> list[Difference]:
        answer, last = state.answer, state.last_outcome()
        subject = f"round {round_id}"
        if last is None:
            assert answer is not None
            what = "applied by the wallet" if answer.applied else f"refused by the wallet ({answer.reason})"
            return [Difference("settlement", subject, f"{what}, no outcome from the table", "-", "-", "wallet")]
        status = last[1].status
        if answer is None:
            if self._wallet_latest.timestamp() - last[1].occurred_at.timestamp() < WALLET_ANSWER_GRACE_S:
                self.result.rounds_awaiting += 1
                return []
            return [Difference("settlement", subject, f"{status} by the table, no answer from the wallet",
                               status, "(none)", "wallet")]  # fmt: skip
        if not answer.applied:
            self.result.rounds_refused += 1
            what = f"{status} by the table, refused by the wallet ({answer.reason})"
            return [Difference("settlement", subject, what, status, answer.detail or answer.reason, "wallet")]
        self.result.rounds_applied += 1
        source = state.outcomes.get(answer.source_event_id, last[1])
        record = RoundRecord(round_id, source.status, source.event, tuple(state.entries.values()), tuple(state.rejects))
        found = [
            Difference("settlement", subject, f"verify: {finding}", source.status, answer.outcome, "wallet")
            for finding in run_checks(RoundEvidence.of(record))
        ]
        if answer.outcome and answer.outcome != status:
            found.append(Difference("settlement", subject, "the wallet applied another outcome than the table's last",
                                    status, answer.outcome, "wallet"))  # fmt: skip
        return found

    def _hold_differences(self, round_id: str, state: _Round) -> list[Difference]:
        """Each live bet's hold as the table's record needs it, against the wallet's before it answered: less
        is a difference (more is not: a smaller resize may land after the table's record, or not at all). A
        round the wallet voided moved no money, so what its holds held took nothing from anyone."""
        if not state.outcomes or (state.answer is not None and state.answer.outcome == "voided"):
            return []
        answered_at = state.answer.position if state.answer is not None else 2**63 - 1
        found: list[Difference] = []
        for bet_id, bet in sorted(state.bets.items()):
            if bet.cancelled:
                continue
            self.result.bets_compared += 1
            held, how = self._held(bet.hold_id, answered_at)
            if held < bet.hold_minor:
                found.append(
                    Difference("holds", f"bet {bet_id} (round {round_id})",
                               f"the table's record needs a hold of {bet.hold_minor}, the wallet holds {held}{how}",
                               str(bet.hold_minor), str(held), "wallet")
                )  # fmt: skip
        return found

    def _held(self, hold_id: str, answered_at: int) -> tuple[int, str]:
        """What the wallet held for ``hold_id`` when it answered the round, and how (for the report)."""
        hold = self._holds.get(hold_id)
        if hold is None:
            return 0, " (no such hold placed)"
        if hold.resolved_at and hold.resolved_at < answered_at:
            return 0, f" (hold {hold_id} resolved before the settlement: {hold.cause}, was {hold.amount_minor})"
        return hold.amount_minor, ""
