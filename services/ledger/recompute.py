"""The recompute step of ``niuniu-audit verify-round``: re-deal and re-settle a round.

From the table's public record of the round (commitment, revealed seed, client seed,
the variant and the configuration snapshot, the revealed hands or grabs, the bets) it
checks, with nothing but the published derivation and the variant's own ``settle``
(``bull.variants``, the very function the table ran):

- the revealed seed hashes to the commitment published before betting opened;
- the deck (or red envelope) derived from the seed deals exactly the hands (grabs)
  the table revealed;
- settling the round's bets on those hands, funded as the table funds them (the
  round's banker or dealer from the record), gives exactly the transfers of the
  table's RoundSettled event, matched one to one on (payer, payee, kind, bet,
  amount): a transfer the rules give that the table did not pay, or one the table
  paid that the rules do not give, is a finding of its own.

A round that pays from the progressive jackpot pool is settled on what the pool could pay
then, which its RoundSettled records (``jackpot_pool_minor``): the pool's share of each
winner and the house's top-up to the floor are checked like any other transfer. Records
written before that field, of rounds that paid the pool, leave their jackpot payouts and
seeds to the journal checks.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping

import grpc
from niuniu.table.v1 import table_pb2, table_pb2_grpc

from backbone import tls
from backbone.auth import bearer
from bull import fairness as fair
from bull import variants
from bull.money import Settlement, TransferKind
from bull.variants import red_envelope_bull as reb
from bull.variants.baibian_bull import OPEN
from bull.variants.base import EnvelopeSplit, Funding, SeatHand, TableBet
from services.ledger.verify import Finding, RecomputeStep, RoundEvidence

DEFAULT_TABLE_ADDR = "127.0.0.1:50052"
GET_ROUND_TIMEOUT_S = 10.0

TransferKey = tuple[str, str, str, str, int]


def table_address() -> str:
    return os.environ.get("NIUNIU_TABLE_ADDR", DEFAULT_TABLE_ADDR)


def recompute_via_table(address: str, token: str) -> RecomputeStep:
    """A RecomputeStep that reads the round's public record from the table service with ``token`` (an auditor's)."""
    auditor = bearer(token)

    async def step(evidence: RoundEvidence) -> list[Finding]:
        settlement = evidence.settlement or evidence.voided
        if settlement is None:
            return [Finding("recompute", evidence.record.round_id, "no table settlement event for the round")]
        async with tls.aio_channel(address, None) as channel:
            stub = table_pb2_grpc.TableStub(channel)
            request = table_pb2.GetRoundRequest(table_id=settlement.table_id, round_id=settlement.round_id)
            try:
                view = await stub.GetRound(request, metadata=auditor, timeout=GET_ROUND_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                return [Finding("recompute", settlement.round_id, f"the table did not answer: {error.code().name}")]
        return recompute(view, evidence)

    return step


def recompute(view: table_pb2.RoundView, evidence: RoundEvidence) -> list[Finding]:
    round_id = view.round_id
    if not view.server_seed:
        return [Finding("recompute", round_id, "the round's seed is not revealed yet")]
    variant = variants.VARIANTS.get(view.variant)
    if variant is None:
        return [Finding("recompute", round_id, f"no recompute for variant {view.variant!r}")]
    config = variant.parse_config(dict(view.config))
    seed = bytes.fromhex(view.server_seed)
    if variant.deck_size == 0:
        return _recompute_envelope(view, evidence, config)
    derived = fair.verify_round(view.commitment, seed, round_id, view.client_seed, deck_size=variant.deck_size)
    findings = [Finding("recompute.commitment", round_id, c.detail) for c in derived.failures]
    if derived.deck is None or findings:
        return findings
    hands = variant.deal(derived.deck, config)
    if evidence.voided is not None:  # voided before or while dealing: only what was revealed is checked
        shown = {revealed.seat for revealed in view.hands}
        hands = {seat: hand for seat, hand in hands.items() if seat in shown}
    findings += _compare_hands(round_id, hands, view)
    if evidence.settlement is not None and not findings:
        record = evidence.settlement
        pool = record.jackpot_pool_minor if record.HasField("jackpot_pool_minor") else None
        bets = _bets(evidence)
        # 百變牛牛: the dealer is the banking player (the house elsewhere).
        funding = Funding(dealer=view.dealer, jackpot_pool_minor=pool or 0)
        try:
            settlement = variant.settle(hands, bets, config, funding)
        except ValueError as error:
            return [Finding("recompute.settlement", round_id, f"the rules refuse the round: {error}")]
        pool_unknown = pool is None and variant.claims_jackpot_pool(hands, bets, config)
        findings += compare_transfers(round_id, settlement, evidence, pool_unknown=pool_unknown)
    return findings


def _recompute_envelope(view: table_pb2.RoundView, evidence: RoundEvidence, config: object) -> list[Finding]:
    round_id = view.round_id
    variant = reb.RED_ENVELOPE_BULL
    assert isinstance(config, reb.EnvelopeTableConfig)
    grabs = sorted(view.grabs, key=lambda g: g.grab_no)
    envelope = reb.envelope_record(
        view.envelope_total_minor, [g.amount_minor for g in grabs], [g.position for g in grabs]
    )
    seed = bytes.fromhex(view.server_seed)
    derived = fair.verify_round(view.commitment, seed, round_id, view.client_seed, envelope=envelope)
    findings = [Finding(f"recompute.{c.name}", round_id, c.detail) for c in derived.failures]
    dealer_grab = next((g.amount_minor for g in grabs if g.dealer), None)
    if evidence.voided is not None:
        if reb.DEALER_VOID in evidence.voided.reason and dealer_grab != 1:
            findings.append(
                Finding("recompute.void", round_id, f"voided for the dealer's 0.01; dealer grabbed {dealer_grab}")
            )
        return findings
    if evidence.settlement is None or findings:
        return findings
    if derived.split is None or dealer_grab is None:
        return [Finding("recompute.envelope", round_id, "a settled round with no grab for the dealer")]
    seats = {g.position: g.bet_id or reb.DEALER_SEAT for g in grabs}
    split = EnvelopeSplit(
        tuple(seats.get(p, "") for p in range(len(grabs))), derived.split.amounts, derived.split.grab_order
    )
    try:
        hands = variant.deal(split, config)
    except ValueError as error:
        return [Finding("recompute.envelope", round_id, str(error))]
    bets = sorted(_bets(evidence), key=lambda b: next((p for p, s in seats.items() if s == b.bet_id), len(seats)))
    missing = [b.bet_id for b in bets if b.bet_id not in hands]
    if missing:
        return [Finding("recompute.envelope", round_id, f"bets with no grab: {', '.join(missing)}")]
    funding = Funding(
        dealer=view.dealer,
        dealer_hold_id="(the dealer's bid)",
        dealer_hold_minor=config.bid_hold_minor(view.dealer_pool_minor),
        dealer_pool_minor=view.dealer_pool_minor,
    )
    try:
        settlement = variant.settle(hands, bets, config, funding)
    except ValueError as error:
        return [Finding("recompute.settlement", round_id, f"the rules refuse the round: {error}")]
    return compare_transfers(round_id, settlement, evidence)


def _compare_hands(round_id: str, hands: Mapping[str, SeatHand], view: table_pb2.RoundView) -> list[Finding]:
    shown: dict[str, Counter[str]] = {}
    opened_whole = any(revealed.group == OPEN for revealed in view.hands)
    for revealed in view.hands:
        if opened_whole and revealed.group != OPEN:
            continue  # 百變牛牛: the face-up part is shown again in the hand's "open" reveal
        shown.setdefault(revealed.seat, Counter()).update(revealed.cards)
    findings = []
    for seat, hand in hands.items():
        expected = Counter(card.code for card in hand.cards)
        if shown.get(seat, Counter()) != expected:
            got = " ".join(sorted(shown.get(seat, Counter()).elements()))
            want = " ".join(sorted(expected.elements()))
            findings.append(
                Finding("recompute.deal", f"{round_id} {seat}", f"revealed [{got}] but the seed deals [{want}]")
            )
    return findings


def _bets(evidence: RoundEvidence) -> list[TableBet]:
    assert evidence.settlement is not None
    return [TableBet(b.bet_id, b.player, b.area, b.stake_minor, b.hold_id) for b in evidence.settlement.bets]


# What a pool payout moves besides the fixed-price prizes: the pool's shares, the house's top-ups
# to the floor (same kind) and the house's seed of the pool.
POOL_DEPENDENT_KINDS = frozenset({TransferKind.JACKPOT_PAYOUT, TransferKind.JACKPOT_SEED})


def transfer_keys(transfers: Iterable[TransferKey], *, pool_unknown: bool = False) -> Counter[TransferKey]:
    return Counter(t for t in transfers if not (pool_unknown and t[2] in POOL_DEPENDENT_KINDS))


def compare_transfers(
    round_id: str, settlement: Settlement, evidence: RoundEvidence, *, pool_unknown: bool = False
) -> list[Finding]:
    """The variant's transfers against the table's, one to one on (payer, payee, kind, bet, amount);
    ``pool_unknown``: a round that paid the jackpot pool whose record does not say what the pool held."""
    assert evidence.settlement is not None
    want = transfer_keys(
        ((t.payer, t.payee, str(t.kind), t.bet_id or "", t.amount_minor) for t in settlement.transfers),
        pool_unknown=pool_unknown,
    )
    got = transfer_keys(
        ((t.payer, t.payee, t.kind, t.bet_id, t.amount_minor) for t in evidence.settlement.transfers),
        pool_unknown=pool_unknown,
    )
    findings = []
    for side, extra in (("the rules give", want - got), ("the table paid", got - want)):
        for (payer, payee, kind, bet_id, amount), count in sorted(extra.items()):
            other = "the table did not pay it" if side == "the rules give" else "the rules do not give it"
            times = f" ({count} times)" if count > 1 else ""
            findings.append(
                Finding(
                    "recompute.settlement",
                    round_id,
                    f"{side} {kind} {payer} -> {payee} {amount} (bet {bet_id or '-'}){times}; {other}",
                )
            )
    return findings
