"""Checks of one round: its journal against the table's settlement (pure functions).

``verify-round`` runs every check in ``CHECKS`` over a ``RoundEvidence``. Checks
that need other services plug in the same way: recomputing the deal and the
settlement from the revealed seed needs the table's rules and the rng service's
reveal, so ``recompute`` is a hook (a ``RecomputeStep``) that is None until those
services exist. To add it, implement a ``RecomputeStep`` that fetches the reveal,
re-deals with ``bull.rules`` and returns a Finding for every transfer that
differs from ``evidence.settlement``, and pass it to ``verify`` (the audit command's
``--recompute`` wiring goes in ``audit.py``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from niuniu.table.v1 import events_pb2 as table_pb2

from services.ledger.journal import Line
from services.ledger.queries import EntryRecord, RoundRecord

# Movement kinds that are the settlement's transfers (not hold bookkeeping such as "hold",
# "hold_resize", "post", "void", "expire"); the last three are the red-envelope dealer's fees.
TRANSFER_KINDS = frozenset(
    {
        "win",
        "loss",
        "commission",
        "rebate",
        "jackpot_contribution",
        "jackpot_payout",
        "jackpot_stake",
        "jackpot_seed",  # Bai Buu: the house funds the pool's seed/reset amount in a round that pays it
        "fee",
        "dealer_fee",
        "service_fee",
        "envelope_fee",
    }
)


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.subject}: {self.detail}"


@dataclass(frozen=True, slots=True)
class RoundEvidence:
    record: RoundRecord
    settlement: table_pb2.RoundSettled | None
    voided: table_pb2.RoundVoided | None

    @classmethod
    def of(cls, record: RoundRecord) -> RoundEvidence:
        settlement = table_pb2.RoundSettled.FromString(record.event) if record.status == "settled" else None
        voided = table_pb2.RoundVoided.FromString(record.event) if record.status == "voided" else None
        return cls(record, settlement, voided)

    @property
    def hold_ids(self) -> list[str]:
        if self.settlement is not None:
            return list(self.settlement.hold_ids)
        if self.voided is not None:
            return list(self.voided.hold_ids)
        return []


Check = Callable[[RoundEvidence], list[Finding]]
RecomputeStep = Callable[[RoundEvidence], Awaitable[list[Finding]]]


def _legs(entry: EntryRecord) -> Counter[tuple[str, str, int]]:
    """The entry's legs as (account, bucket, signed amount), credit positive."""
    return Counter((line.account, line.bucket, line.credit_minor - line.debit_minor) for line in entry.lines)


def _expected_legs(transfer: table_pb2.SettlementTransfer) -> Counter[tuple[str, str, int]]:
    payer_bucket = "held" if transfer.hold_id else "available"
    return Counter(
        {
            (transfer.payer, payer_bucket, -transfer.amount_minor): 1,
            (transfer.payee, "available", transfer.amount_minor): 1,
        }
    )


def _transfer_text(index: int, t: table_pb2.SettlementTransfer) -> str:
    held = f" from hold {t.hold_id}" if t.hold_id else ""
    return f"transfer #{index} {t.kind} {t.payer} -> {t.payee} {t.amount_minor}{held} (bet {t.bet_id or '-'})"


def check_transfers(evidence: RoundEvidence) -> list[Finding]:
    """Every settlement transfer has its own movement with exactly its legs, and no transfer is extra."""
    if evidence.settlement is None:
        return []
    unmatched = [e for e in evidence.record.entries if e.kind in TRANSFER_KINDS]
    findings: list[Finding] = []
    for index, transfer in enumerate(evidence.settlement.transfers):
        if transfer.amount_minor == 0:
            continue
        want = _expected_legs(transfer)
        match = next(
            (
                e
                for e in unmatched
                if e.kind == transfer.kind and (not transfer.bet_id or e.bet_id == transfer.bet_id) and _legs(e) == want
            ),
            None,
        )
        if match is not None:
            unmatched.remove(match)
            continue
        near = [e for e in unmatched if e.kind == transfer.kind and e.bet_id == transfer.bet_id]
        seen = "; ".join(f"{e.entry_id}: {_lines_text(e.lines)}" for e in near) or "no movement of that kind and bet"
        findings.append(Finding("transfers", _transfer_text(index, transfer), f"no matching movement ({seen})"))
    for entry in unmatched:
        findings.append(
            Finding("transfers", f"entry {entry.entry_id}", f"{entry.kind} movement matches no settlement transfer")
        )
    return findings


def check_holds_resolved(evidence: RoundEvidence) -> list[Finding]:
    """Each hold of the round is fully resolved: its held legs net to zero."""
    held: defaultdict[str, int] = defaultdict(int)
    for entry in evidence.record.entries:
        for line in entry.lines:
            if line.bucket == "held" and entry.hold_id:
                held[entry.hold_id] += line.credit_minor - line.debit_minor
    return [
        Finding("holds", f"hold {hold_id}", f"{held.get(hold_id, 0)} still held after the round")
        for hold_id in evidence.hold_ids
        if held.get(hold_id, 0) != 0
    ]


def check_voided_round(evidence: RoundEvidence) -> list[Finding]:
    """A voided round moves no money beyond placing and releasing its holds."""
    if evidence.voided is None:
        return []
    return [
        Finding("void", f"entry {e.entry_id}", f"{e.kind} movement in a voided round")
        for e in evidence.record.entries
        if e.kind in TRANSFER_KINDS
    ]


def check_entries_balanced(evidence: RoundEvidence) -> list[Finding]:
    return [
        Finding("balance", f"entry {e.entry_id}", f"debits {debits} != credits {credits}")
        for e in evidence.record.entries
        for debits, credits in [(sum(x.debit_minor for x in e.lines), sum(x.credit_minor for x in e.lines))]
        if debits != credits
    ]


def check_known(evidence: RoundEvidence) -> list[Finding]:
    findings = [Finding("rejects", f"entry {r.entry_id}", f"{r.reason}: {r.detail}") for r in evidence.record.rejects]
    if evidence.record.status == "unknown":
        findings.append(Finding("settlement", evidence.record.round_id, "no RoundSettled or RoundVoided seen"))
    return findings


CHECKS: tuple[Check, ...] = (
    check_known,
    check_entries_balanced,
    check_transfers,
    check_holds_resolved,
    check_voided_round,
)


def run_checks(evidence: RoundEvidence, checks: Sequence[Check] = CHECKS) -> list[Finding]:
    """The findings of ``checks`` (no I/O): what ``verify`` finds without its recompute step."""
    return [finding for check in checks for finding in check(evidence)]


async def verify(
    evidence: RoundEvidence, *, checks: Sequence[Check] = CHECKS, recompute: RecomputeStep | None = None
) -> tuple[list[Finding], bool]:
    """All findings, and whether the recompute step ran."""
    findings = run_checks(evidence, checks)
    if recompute is not None:
        findings.extend(await recompute(evidence))
    return findings, recompute is not None


def _lines_text(lines: Sequence[Line]) -> str:
    return ", ".join(f"{x.account}/{x.bucket} {x.credit_minor - x.debit_minor:+d}" for x in lines)


def journal_text(record: RoundRecord) -> list[str]:
    """The round's journal, one entry per line, for people."""
    out = [f"round {record.round_id}: {record.status}, {len(record.entries)} entries"]
    for e in record.entries:
        refs = " ".join(f"{k}={v}" for k, v in (("hold", e.hold_id), ("bet", e.bet_id)) if v)
        out.append(f"  {e.occurred_at.isoformat()} {e.entry_id} {e.event_type} {e.kind} {refs}".rstrip())
        for line in e.lines:
            out.append(
                f"      {line.account:<28} {line.bucket:<9} debit {line.debit_minor:>12} credit {line.credit_minor:>12}"
            )
    return out


def settlement_text(evidence: RoundEvidence) -> list[str]:
    if evidence.settlement is None:
        return []
    s = evidence.settlement
    out = [f"settlement: table {s.table_id}, variant {s.variant}, {len(s.bets)} bets, {len(s.transfers)} transfers"]
    out.extend(
        f"  bet {b.bet_id} {b.player} {b.area} stake {b.stake_minor} {b.outcome} net {b.net_minor:+d}" for b in s.bets
    )
    out.extend(f"  {_transfer_text(i, t)}" for i, t in enumerate(s.transfers))
    return out
