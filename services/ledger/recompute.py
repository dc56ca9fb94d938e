"""The recompute step of ``niuniu-audit verify-round``: re-deal and re-settle a round.

From the table's public record of the round (commitment, revealed seed, client seed,
the variant and the configuration snapshot, the revealed hands and the bets) it
checks, with nothing but the published derivation and the rules engine:

- the revealed seed hashes to the commitment published before betting opened;
- the deck derived from the seed deals exactly the hands the table revealed;
- settling the round's bets on those hands gives exactly the transfers of the
  table's RoundSettled event, which the journal check then ties to the money moved.

A 百變牛牛 round is settled against its banking player (the table's RoundView names
them as ``dealer``); its hands are compared as opened whole. A red-envelope round
(``red_envelope_bull``) has no deck: its envelope split and grab
order are derived from the seed and checked against the grabs the table revealed, and
its bets are re-settled with the dealer, the dealer pool and the grabbed amounts. The
table pays the dealer's part first from the pool's hold and then from the round's
credits, which can split one payment in two: transfers are compared as totals per
(payer, payee, kind, bet).

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
from bull import fairness as fair
from bull.rules import baibian_bull as bb
from bull.rules import red_envelope as re_
from services.ledger.verify import Finding, RecomputeStep, RoundEvidence
from services.table.baibian import BANKER_PARTY, OPEN
from services.table.envelope import EnvelopeTableConfig, envelope_record
from services.table.variants import VARIANTS, SeatHand, TableBet

DEFAULT_TABLE_ADDR = "127.0.0.1:50052"
RECOMPUTABLE = ("golden_bull", "bai_buu", bb.VARIANT_ID, re_.VARIANT_ID)
DEALER_VOID = "DEALER_GRABBED_0.01"

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
    if view.variant == re_.VARIANT_ID:
        return _recompute_envelope(view, evidence)
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
        parties = {}
        if view.variant == bb.VARIANT_ID:  # the rules' banker party is the round's banking player
            if not view.dealer:
                return [Finding("recompute.settlement", round_id, "a settled 百變牛牛 round with no banker")]
            parties[BANKER_PARTY] = view.dealer
        settlement = variant.settle(hands, _bets(evidence), config)
        findings += _compare_settlement(round_id, settlement, evidence, parties)
    return findings


def _recompute_envelope(view: table_pb2.RoundView, evidence: RoundEvidence) -> list[Finding]:
    round_id = view.round_id
    grabs = view.grabs
    envelope = envelope_record(view.envelope_total_minor, grabs)
    seed = bytes.fromhex(view.server_seed)
    derived = fair.verify_round(view.commitment, seed, round_id, view.client_seed, envelope=envelope)
    findings = [Finding(f"recompute.{c.name}", round_id, c.detail) for c in derived.failures]
    dealer_grab = next((g.amount_minor for g in grabs if g.dealer), None)
    if evidence.voided is not None:
        if DEALER_VOID in evidence.voided.reason and dealer_grab != re_.VOID_AMOUNT_MINOR:
            findings.append(
                Finding("recompute.void", round_id, f"voided for the dealer's 0.01; dealer grabbed {dealer_grab}")
            )
        return findings
    if evidence.settlement is None or findings:
        return findings
    if dealer_grab is None:
        return [Finding("recompute.envelope", round_id, "a settled round with no grab for the dealer")]
    config = EnvelopeTableConfig.from_settings(dict(view.config))
    amounts = {g.bet_id: g.amount_minor for g in grabs if g.bet_id}
    missing = [b.bet_id for b in evidence.settlement.bets if b.bet_id not in amounts]
    if missing:
        return [Finding("recompute.envelope", round_id, f"bets with no grab: {', '.join(missing)}")]
    rnd = re_.EnvelopeRound(
        view.dealer,
        view.dealer_pool_minor,
        dealer_grab,
        tuple(re_.EnvelopeBet(b.bet_id, b.player, b.stake_minor, amounts[b.bet_id]) for b in evidence.settlement.bets),
    )
    try:
        settlement = re_.settle(rnd, config.rules)
    except (re_.BetError, re_.AmountError) as error:
        return [Finding("recompute.settlement", round_id, f"the rules refuse the round: {error}")]
    return _compare_settlement(round_id, settlement, evidence)


def _compare_hands(round_id: str, hands: dict[str, SeatHand], view: table_pb2.RoundView) -> list[Finding]:
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
    return [TableBet(b.bet_id, b.player, b.area, b.stake_minor) for b in evidence.settlement.bets]


def _compare_settlement(
    round_id: str, settlement: object, evidence: RoundEvidence, parties: dict[str, str] | None = None
) -> list[Finding]:
    """The rules' transfers against the table's, as totals per (payer, payee, kind, bet); ``parties``
    renames the rules' party names (百變牛牛's "banker") to the accounts the table paid."""
    assert evidence.settlement is not None
    name = (parties or {}).get
    transfers: Sequence[object] = getattr(settlement, "transfers", ())
    want: Counter[tuple[str, str, str, str]] = Counter()
    for t in transfers:
        if str(t.kind) not in POOL_DEPENDENT_KINDS:  # type: ignore[attr-defined]
            payer, payee = t.payer, t.payee  # type: ignore[attr-defined]
            key = (name(payer, payer), name(payee, payee), str(t.kind), t.bet_id or "")  # type: ignore[attr-defined]
            want[key] += t.amount_minor  # type: ignore[attr-defined]
    got: Counter[tuple[str, str, str, str]] = Counter()
    for t in evidence.settlement.transfers:
        if t.kind not in POOL_DEPENDENT_KINDS:
            got[(t.payer, t.payee, t.kind, t.bet_id)] += t.amount_minor
    findings = []
    for key in sorted(want.keys() | got.keys()):
        if want[key] != got[key]:
            payer, payee, kind, bet_id = key
            findings.append(
                Finding(
                    "recompute.settlement",
                    round_id,
                    f"{kind} {payer} -> {payee} (bet {bet_id or '-'}): the rules give {want[key]},"
                    f" the table paid {got[key]}",
                )
            )
    return findings
