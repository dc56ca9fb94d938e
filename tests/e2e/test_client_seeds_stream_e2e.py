"""A round verified from the stream alone, with players' client seeds, at each variant.

On the real stack (four service processes, real Kafka, PostgreSQL and Redis), one round
of each variant: two players bet with client seeds, a third player's bet with a seed is
cancelled, and the second player's bet is changed (68 NiuNiu: ``ChangeBet``, which keeps
the bet's seed; elsewhere: cancelled and placed again with a new seed, as those tables
have no ChangeBet). Then, from the first player's WatchTable updates alone (the opening's
commitment, the hands or grabs, and ``seed_revealed``): their seed is among the
contributions, the contributions combine into the round's client seed and the deal
derives from it. The same facts agree with GetRound and with ``niuniu-verify``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from play import Watcher, connect, expect_refused, kind, revealed_round, update_is
from players import Clients, Player, register
from stack import BIN, Stack, running_stack

from bull import fairness as fair
from bull.cards import parse_cards
from bull.variants import get as variant_by_id
from bull.variants.baibian_bull import dealt_prefix

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ALICE, BOB_FIRST, BOB_AGAIN, CAROL = "alice-42", "b0b", "b0b-2", "c4r0l"
LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=100_000,
    chips_minor=[100],
    betting_seconds=3,
    reveal_interval_ms=10,
    pause_between_rounds_ms=50,
)


@dataclass(frozen=True)
class Setup:
    """A variant's table: its areas for the three bettors, its configuration, and who must act first."""

    areas: tuple[str, str, str]
    config: dict[str, str] = field(default_factory=dict)
    banker: bool = False  # 百變牛牛: a player banks the round
    bidder: bool = False  # 68 NiuNiu: a player bids for the dealer seat


SETUPS = {
    "golden_bull": Setup(("area_1", "area_2", "area_3")),
    "bai_buu": Setup(("player_01", "banker_02", "player_03")),
    "baibian_bull": Setup(("heaven", "earth", "mystic"), banker=True),
    "red_envelope_bull": Setup(("dealer", "dealer", "dealer"), {"bidding.seconds": "2"}, bidder=True),
}


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    with running_stack(infra, uuid.uuid4().hex[:8]) as system:
        yield system


def bet(
    round_id: str, table_id: str, area: str, name: str, client_seed: str, amount: int = 200
) -> table_pb2.PlaceBetRequest:
    return table_pb2.PlaceBetRequest(
        command_id=f"{round_id}.{name}",
        table_id=table_id,
        area=area,
        amount_minor=amount,
        round_id=round_id,
        client_seed=client_seed,
    )


async def betting_round(c: Clients, watcher: Watcher, setup: Setup, dealer: Player, table_id: str) -> str:
    """A round with its betting window open for a while yet (after the banker's seat or the dealer's bid)."""
    opened: Callable[[table_pb2.TableUpdate], bool] = lambda u: kind(u) == "round_opened"  # noqa: E731
    if setup.bidder:
        bidding = (await watcher.wait_for(opened)).round_id
        bid = table_pb2.PlaceBidRequest(
            command_id=f"{bidding}.bid", table_id=table_id, amount_minor=10_000, round_id=bidding
        )
        await c.table.PlaceBid(bid, metadata=dealer.auth)
    elif setup.banker:  # the seat is taken at a round's opening
        await c.table.ApplyBanker(table_pb2.ApplyBankerRequest(table_id=table_id), metadata=dealer.auth)
        opened = lambda u: kind(u) == "round_opened" and u.round_opened.banker == dealer.account  # noqa: E731
    round_id = (await watcher.wait_for(opened)).round_id
    betting = await watcher.wait_for(
        lambda u: (
            update_is("phase_changed", round_id)(u)
            and u.phase_changed.phase == "betting"
            and u.phase_changed.deadline_unix_ms - u.server_time_unix_ms > 2_000
        )
    )
    return betting.round_id


async def place_the_bets(c: Clients, table_id: str, round_id: str, setup: Setup, players: Sequence[Player]) -> None:
    """Alice's bet; Bob's bet, changed; Carol's bet, cancelled. Receipts echo each contribution."""
    alice, bob, carol = players
    first = await c.table.PlaceBet(bet(round_id, table_id, setup.areas[0], "alice", ALICE), metadata=alice.auth)
    assert first.client_seed == ALICE
    # A repeat of the command is answered with the first receipt: the contribution stays the first one's.
    again = await c.table.PlaceBet(bet(round_id, table_id, setup.areas[0], "alice", "other"), metadata=alice.auth)
    assert (again.replayed, again.client_seed) == (True, ALICE)
    bobs = await c.table.PlaceBet(bet(round_id, table_id, setup.areas[1], "bob", BOB_FIRST), metadata=bob.auth)
    assert bobs.client_seed == BOB_FIRST
    if setup.bidder:  # ChangeBet: the stake changes, the contribution stays
        change = table_pb2.ChangeBetRequest(
            command_id=f"{round_id}.bob.change", table_id=table_id, bet_id=bobs.bet_id, amount_minor=300
        )
        changed = await c.table.ChangeBet(change, metadata=bob.auth)
        assert (changed.stake_minor, changed.client_seed) == (300, BOB_FIRST)
    else:  # no ChangeBet here: cancel and bet again, with a new contribution
        change = table_pb2.ChangeBetRequest(
            command_id=f"{round_id}.bob.change", table_id=table_id, bet_id=bobs.bet_id, amount_minor=300
        )
        await expect_refused(
            c.table.ChangeBet(change, metadata=bob.auth), grpc.StatusCode.FAILED_PRECONDITION, "CHANGE_NOT_SUPPORTED"
        )
        await c.table.CancelBet(table_pb2.CancelBetRequest(table_id=table_id, bet_id=bobs.bet_id), metadata=bob.auth)
        placed = await c.table.PlaceBet(
            bet(round_id, table_id, setup.areas[1], "bob2", BOB_AGAIN, 300), metadata=bob.auth
        )
        assert placed.client_seed == BOB_AGAIN
    carols = await c.table.PlaceBet(bet(round_id, table_id, setup.areas[2], "carol", CAROL), metadata=carol.auth)
    cancelled = await c.table.CancelBet(
        table_pb2.CancelBetRequest(table_id=table_id, bet_id=carols.bet_id), metadata=carol.auth
    )
    assert (cancelled.status, cancelled.client_seed) == ("cancelled", CAROL)


@dataclass
class FromStream:
    """What a player rebuilds of a round from their WatchTable updates alone."""

    commitment: str
    revealed: ev.SeedRevealed
    mine: list[str]  # the contributions of the watcher's own bets (my_bet_placed)
    hands: dict[str, list[str]]  # each seat's cards, in deal order, as revealed
    drawn_card: str
    sent: ev.EnvelopeSent
    grabs: list[ev.EnvelopeGrabbed]


def from_stream(updates: Sequence[table_pb2.TableUpdate], round_id: str, variant: str) -> FromStream:
    ours = [u for u in updates if u.round_id == round_id]

    def only(name: str) -> Any:
        """The round's one update of this kind (its message)."""
        (found,) = [getattr(u, name) for u in ours if kind(u) == name]
        return found

    seats = getattr(variant_by_id(variant), "deal_order", ())
    hands: dict[str, list[str]] = {seat: [] for seat in seats}
    for u in ours:
        if kind(u) == "hand_revealed" and u.hand_revealed.group in ("", "head", "last", "open"):
            hands[u.hand_revealed.seat].extend(u.hand_revealed.cards)
    dealt = [u.dealt for u in ours if kind(u) == "dealt"]
    sent = [u.envelope_sent for u in ours if kind(u) == "envelope_sent"]
    return FromStream(
        commitment=only("round_opened").commitment,
        revealed=only("seed_revealed"),
        mine=[u.my_bet_placed.client_seed for u in ours if kind(u) == "my_bet_placed"],
        hands=hands,
        drawn_card=dealt[0].drawn_card if dealt else "",
        sent=sent[0] if sent else ev.EnvelopeSent(),
        grabs=sorted((u.envelope_grabbed for u in ours if kind(u) == "envelope_grabbed"), key=lambda g: g.grab_no),
    )


def dealt_cards(seen: FromStream, variant: str) -> list[str]:
    if variant == "baibian_bull":
        return dealt_prefix(seen.drawn_card, seen.hands)
    return [card for cards in seen.hands.values() for card in cards]


def verify_from_stream(seen: FromStream, round_id: str, variant: str) -> fair.Verification:
    """The player's own check: their seed counted, the contributions make the client seed, the deal follows."""
    revealed = seen.revealed
    assert seen.mine and set(seen.mine) <= set(revealed.client_seeds), (seen.mine, revealed.client_seeds)
    assert fair.combine_client_seeds(revealed.client_seeds) == revealed.client_seed
    assert revealed.commitment == seen.commitment
    seed = bytes.fromhex(revealed.server_seed)
    if variant == "red_envelope_bull":
        envelope = fair.EnvelopeRecord(
            seen.sent.total_minor,
            len(seen.grabs),
            seen.sent.min_minor,
            tuple(g.amount_minor for g in seen.grabs),
            tuple(g.position for g in seen.grabs),
        )
        return fair.verify_round(seen.commitment, seed, round_id, revealed.client_seed, envelope=envelope)
    size = variant_by_id(variant).deck_size
    cards = parse_cards(dealt_cards(seen, variant))
    return fair.verify_round(seen.commitment, seed, round_id, revealed.client_seed, size, cards)


async def niuniu_verify(seen: FromStream, round_id: str, variant: str) -> dict[str, Any]:
    """The command-line verifier on the stream's facts (JSON report)."""
    revealed = seen.revealed
    argv = ["--commitment", seen.commitment, "--seed", revealed.server_seed, "--round", round_id]
    argv += ["--client-seed", revealed.client_seed, "--client-seeds", ",".join(revealed.client_seeds)]
    if variant == "red_envelope_bull":
        argv += ["--envelope", f"{seen.sent.total_minor}:{len(seen.grabs)}:{seen.sent.min_minor}"]
        argv += ["--split", ",".join(str(g.amount_minor) for g in seen.grabs)]
        argv += ["--grab-order", ",".join(str(g.position) for g in seen.grabs)]
    else:
        argv += ["--deck", str(variant_by_id(variant).deck_size), "--dealt", " ".join(dealt_cards(seen, variant))]
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "niuniu-verify"), *argv, "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out.decode(), err.decode())
    report: dict[str, Any] = json.loads(out)
    return report


def agrees_with_get_round(view: table_pb2.RoundView, seen: FromStream, variant: str, counted: list[str]) -> None:
    revealed = seen.revealed
    assert (view.commitment, view.server_seed, view.client_seed) == (
        seen.commitment,
        revealed.server_seed,
        revealed.client_seed,
    )
    listed = sorted((c.client_seed, c.counted, c.mine) for c in view.client_seeds)
    withdrawn = [(CAROL, False, False)] + ([] if variant == "red_envelope_bull" else [(BOB_FIRST, False, False)])
    assert listed == sorted([(ALICE, True, True), *[(s, True, False) for s in counted if s != ALICE], *withdrawn])
    if variant == "red_envelope_bull":
        assert (view.envelope_total_minor, view.envelope_min_minor) == (seen.sent.total_minor, seen.sent.min_minor)
        assert sorted(view.grabs, key=lambda g: g.grab_no) == seen.grabs
        return
    assert view.envelope_min_minor == 0
    from_view: dict[str, list[str]] = {}
    for hand in view.hands:
        if hand.group in ("", "head", "last", "open"):
            from_view.setdefault(hand.seat, []).extend(hand.cards)
    assert from_view == seen.hands


@pytest.mark.parametrize("variant", sorted(SETUPS))
async def test_a_round_verifies_from_the_stream_alone(stack: Stack, variant: str) -> None:
    setup = SETUPS[variant]
    table_id = f"cs-{variant.replace('_', '-')}"
    run = f"{stack.run_id}{variant[:4]}"
    async with connect(stack) as c:
        alice, bob, carol, dealer = [await register(c, f"{n}{run}", 1_000_000) for n in ("al", "bo", "ca", "de")]
        request = table_pb2.CreateTableRequest(table_id=table_id, variant=variant, config=setup.config, limits=LIMITS)
        await c.table.CreateTable(request, metadata=c.admin)
        watcher = Watcher(c, alice, table_id)
        round_id = await betting_round(c, watcher, setup, dealer, table_id)
        await place_the_bets(c, table_id, round_id, setup, (alice, bob, carol))
        await watcher.wait_for(update_is("seed_revealed", round_id))
        await watcher.stop()
        view = await revealed_round(c, table_id, round_id, alice.auth)

    counted = sorted([ALICE, BOB_FIRST if setup.bidder else BOB_AGAIN])
    seen = from_stream(watcher.updates, round_id, variant)
    assert list(seen.revealed.client_seeds) == counted and seen.mine[0] == ALICE
    assert seen.revealed.client_seed == fair.combine_client_seeds(counted)
    verdict = verify_from_stream(seen, round_id, variant)
    assert verdict.ok, verdict
    report = await niuniu_verify(seen, round_id, variant)
    assert report["ok"] is True
    checks = [check["name"] for check in report["checks"]]
    assert checks == ["commitment", "client_seed", *(c.name for c in verdict.checks[1:])], checks
    agrees_with_get_round(view, seen, variant, counted)
