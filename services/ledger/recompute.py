"""The recompute step of ``niuniu-audit verify-round``: re-deal and re-settle a round.

From the table's public record of the round (commitment, revealed seed, client seed,
the variant and the configuration snapshot, the revealed hands and the bets) it
checks, with nothing but the published derivation and the rules engine:

- the revealed seed hashes to the commitment published before betting opened;
- the deck derived from the seed deals exactly the hands the table revealed;
- settling the round's bets on those hands gives exactly the transfers of the
  table's RoundSettled event, which the journal check then ties to the money moved.

Jackpot pool payouts depend on the pool's balance when the round settled, which the
round's own record does not carry; they are left to the journal checks.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

import grpc
from niuniu.table.v1 import table_pb2, table_pb2_grpc

from backbone.auth import Role, Tokens, bearer, secret_from_env
from services.ledger.verify import Finding, RecomputeStep, RoundEvidence
from services.rng import fair
from services.table.variants import VARIANTS, SeatHand, TableBet

DEFAULT_TABLE_ADDR = "127.0.0.1:50052"
RECOMPUTABLE = ("golden_bull", "bai_buu")
POOL_DEPENDENT_KINDS = frozenset({"jackpot_payout"})


def table_address() -> str:
    return os.environ.get("NIUNIU_TABLE_ADDR", DEFAULT_TABLE_ADDR)


def recompute_via_table(address: str) -> RecomputeStep:
    """A RecomputeStep that reads the round's public record from the table service as an auditor."""
    auditor = bearer(Tokens(secret_from_env()).issue("audit", Role.AUDITOR))

    async def step(evidence: RoundEvidence) -> list[Finding]:
        settlement = evidence.settlement or evidence.voided
        if settlement is None:
            return [Finding("recompute", evidence.record.round_id, "no table settlement event for the round")]
        async with grpc.aio.insecure_channel(address) as channel:
            stub = table_pb2_grpc.TableStub(channel)
            request = table_pb2.GetRoundRequest(table_id=settlement.table_id, round_id=settlement.round_id)
            try:
                view = await stub.GetRound(request, metadata=auditor)
            except grpc.aio.AioRpcError as error:
                return [Finding("recompute", settlement.round_id, f"the table did not answer: {error.code().name}")]
        return recompute(view, evidence)

    return step


def recompute(view: table_pb2.RoundView, evidence: RoundEvidence) -> list[Finding]:
    round_id = view.round_id
    if not view.server_seed:
        return [Finding("recompute", round_id, "the round's seed is not revealed yet")]
    if view.variant not in RECOMPUTABLE or view.variant not in VARIANTS:
        return [Finding("recompute", round_id, f"no recompute for variant {view.variant!r} yet")]
    variant = VARIANTS[view.variant]
    config = variant.parse_config(dict(view.config))
    seed = bytes.fromhex(view.server_seed)
    derived = fair.verify_round(view.commitment, seed, round_id, view.client_seed, deck_size=variant.deck_size)
    findings = [Finding("recompute.commitment", round_id, c.detail) for c in derived.failures]
    if derived.deck is None or findings:
        return findings
    hands = variant.deal(derived.deck, config)
    findings += _compare_hands(round_id, hands, view)
    if evidence.settlement is not None and not findings:
        findings += _compare_settlement(round_id, variant.settle(hands, _bets(evidence), config), evidence)
    return findings


def _compare_hands(round_id: str, hands: dict[str, SeatHand], view: table_pb2.RoundView) -> list[Finding]:
    shown: dict[str, Counter[str]] = {}
    for revealed in view.hands:
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
    return [TableBet(b.bet_id, b.player, b.area, b.stake_minor) for b in evidence.settlement.bets]


def _compare_settlement(round_id: str, settlement: object, evidence: RoundEvidence) -> list[Finding]:
    assert evidence.settlement is not None
    transfers: Sequence[object] = getattr(settlement, "transfers", ())
    want = Counter(
        (t.payer, t.payee, t.amount_minor, str(t.kind), t.bet_id or "")  # type: ignore[attr-defined]
        for t in transfers
        if str(t.kind) not in POOL_DEPENDENT_KINDS  # type: ignore[attr-defined]
    )
    got = Counter(
        (t.payer, t.payee, t.amount_minor, t.kind, t.bet_id)
        for t in evidence.settlement.transfers
        if t.kind not in POOL_DEPENDENT_KINDS
    )
    findings = []
    for key in sorted((want - got).keys()):
        findings.append(
            Finding("recompute.settlement", round_id, f"the rules give transfer {key} the table did not make")
        )
    for key in sorted((got - want).keys()):
        findings.append(
            Finding("recompute.settlement", round_id, f"the table made transfer {key} the rules do not give")
        )
    return findings
