"""A Hypothesis state machine over the pure round core (``services/table/core``): one per variant.

Each step sends the round a command (a bet, a cancel, a bid, a change, time passing, the rng's
deck or split or failure, a settle) through ``decide`` and folds what it decides with
``evolve``; after every step the invariants hold: phases only move forward and an ended round
takes nothing more, no card or envelope share is in a public event before its reveal, reveals
follow the variant's plan, and a settled round's money balances (every bet settled once, no hold
pays more than it holds, a bet's net is what its transfers move). No database, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import ClassVar

from google.protobuf.message import Message
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from niuniu.table.v1 import events_pb2 as ev

from bull.cards import deck
from bull.variants import RoundShape, get
from services.table.core import commands as cmd
from services.table.core.decide import decide
from services.table.core.evolve import Event, evolve, with_bets
from services.table.core.settlement import hands_of
from services.table.core.state import PHASE_ORDER, Bet, Bid, Phase, RoundState

PLAYERS = ("player:ann", "player:bob", "player:cat", "player:dan")
BANKER = "player:bank"
BANKER_CAPITAL = 5_000_000
START_MS = 1_767_225_600_000
LIMITS = ev.TableLimits(betting_seconds=10, reveal_interval_ms=500, chips_minor=[100, 500, 1_000])


class RoundCore(RuleBasedStateMachine):
    variant_id: ClassVar[str] = ""
    steps: ClassVar[int] = 0
    """Hypothesis steps (rules) run by every machine of this class (the test asserts how many)."""
    decisions: ClassVar[int] = 0
    """``decide`` calls they made (a rule may make several)."""

    def __init__(self) -> None:
        super().__init__()
        self.variant = get(self.variant_id)
        self.config = self.variant.parse_config({})
        self.settings = tuple(sorted(self.variant.config_settings(self.config).items()))
        self.now = START_MS
        self.round_no = 0
        self.serial = 0
        type(self).steps -= 1  # ``count_steps`` runs once before the first step too
        self.open_round()

    # ------------------------------------------------------------------ driving the round

    def open_round(self) -> None:
        self.round_no += 1
        round_id = f"t-r{self.round_no}"
        opened = ev.RoundOpened(table_id="t", round_id=round_id, round_no=self.round_no, commitment="c" * 64,
                                betting_closes_at_unix_ms=self.now + 10_000)  # fmt: skip
        if self.variant.shape is RoundShape.BIDDING_DEALER:
            opened.bidding_closes_at_unix_ms = self.now + 5_000
            opened.betting_closes_at_unix_ms = self.now + 15_000
        elif self.variant.shape is RoundShape.BANKER_SEAT:
            opened.banker, opened.banker_capital_minor = BANKER, BANKER_CAPITAL
            opened.banker_hold_id = f"banker.{round_id}"
            opened.table_cap_minor = self.config.cap_minor(BANKER_CAPITAL)
        self.state = evolve(RoundState("t", round_id, self.variant_id, self.settings, LIMITS), opened)
        self.public: list[Message] = [opened]
        self.rank = PHASE_ORDER[self.state.phase]

    def send(self, command: cmd.Command) -> list[Event]:
        type(self).decisions += 1
        ended = self.state.phase in Phase.ENDED
        events = decide(self.state, command, self.now)
        if ended:
            assert events == [], "an ended round takes no command"
        for event in events:
            self.state = evolve(self.state, event)
            if isinstance(event, Message):
                self.public.append(event)
            rank = PHASE_ORDER[self.state.phase]
            assert rank >= self.rank, f"the phase went back to {self.state.phase}"
            self.rank = rank
        return events

    def next_id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: self.state.phase in Phase.ENDED)
    @rule()
    def next_round(self) -> None:
        self.send(cmd.Tick())
        self.open_round()

    @rule(ms=st.integers(0, 4_000))
    def tick(self, ms: int) -> None:
        self.now += ms
        self.send(cmd.Tick())

    @rule()
    def play_on(self) -> None:
        """Time runs to each deadline in turn until the round waits for the rng (or for a bid or a bet)."""
        for _ in range(64):
            state = self.state
            if (state.phase == Phase.BIDDING and not state.bids) or (state.phase == Phase.BETTING and not state.placed):
                return
            due = {Phase.BIDDING: state.bidding_closes_at_ms, Phase.BETTING: state.betting_closes_at_ms,
                   Phase.REVEALING: state.next_step_at_ms}.get(state.phase)  # fmt: skip
            if due is None:
                return
            self.now = max(self.now, due)
            self.send(cmd.Tick())

    @rule(data=st.data())
    def play_round(self, data: st.DataObject) -> None:
        """A whole round at once: a bid or two, a few bets, the rng's answer, the reveals, the settlement."""
        for _ in range(data.draw(st.integers(1, 2))):
            self.place_bid(data.draw(st.sampled_from(PLAYERS)), data.draw(st.integers(100, 100_000)))
        self.play_on()
        for _ in range(data.draw(st.integers(1, 4))):
            self.place_bet(data.draw(st.sampled_from(PLAYERS)), data.draw(st.sampled_from((1, 5, 10))), True, data)
        self.play_on()
        self.rng_answers(data)
        self.play_on()
        self.settle(data.draw(st.integers(0, 10**9)))

    @rule(player=st.sampled_from(PLAYERS), chip=st.sampled_from((1, 5, 10, 50)), seed=st.booleans(), data=st.data())
    def place_bet(self, player: str, chip: int, seed: bool, data: st.DataObject) -> None:
        area = data.draw(st.sampled_from(self.variant.areas))
        stake = self.variant.fixed_stake_minor(area, self.config) or chip * self.min_chip()
        if not self.admitted(player, stake):
            return
        hold = self.variant.hold_minor(stake, self.config)
        bet_id = self.next_id("bet")
        client_seed = f"{bet_id:0>16}" if seed else ""
        self.send(cmd.PlaceBet(Bet(bet_id, player, area, stake, hold, f"bet.{bet_id}", client_seed)))

    @rule(data=st.data())
    def cancel_bet(self, data: st.DataObject) -> None:
        if self.state.placed:
            bet = data.draw(st.sampled_from(self.state.placed))
            self.send(cmd.CancelBet(bet.bet_id))

    @rule(data=st.data(), chip=st.sampled_from((1, 2, 5)))
    def change_bet(self, data: st.DataObject, chip: int) -> None:
        if self.state.placed:
            bet = data.draw(st.sampled_from(self.state.placed))
            stake = chip * self.min_chip()
            hold = self.variant.hold_minor(stake, self.config)
            self.send(cmd.ChangeBet(bet.bet_id, stake, hold, f"bet.{bet.bet_id}.{self.serial}"))

    @rule(player=st.sampled_from(PLAYERS), amount=st.integers(100, 100_000))
    def place_bid(self, player: str, amount: int) -> None:
        bid_id = self.next_id("bid")
        self.send(cmd.PlaceBid(Bid(bid_id, player, amount, amount * 2, f"bid.{bid_id}")))

    @rule(data=st.data())
    def rng_answers(self, data: st.DataObject) -> None:
        if self.variant.deck_size:
            cards = data.draw(st.permutations([c.code for c in deck(self.variant.deck_size)]))
            self.send(cmd.Deal(tuple(cards)))
            return
        shares = 1 + len(self.state.placed) + data.draw(st.sampled_from((0, 0, 0, 1)))  # now and then a bad split
        total = self.config.rules.envelope_total_minor
        cuts = sorted(data.draw(st.sets(st.integers(1, total - 1), min_size=shares - 1, max_size=shares - 1)))
        amounts = tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True))
        order = tuple(data.draw(st.permutations(range(shares))))
        self.send(cmd.Split(amounts, order))

    @rule(ms=st.integers(0, 8_000), refused=st.sampled_from((False, False, False, True)))
    def rng_fails(self, ms: int, refused: bool) -> None:
        self.now += ms
        self.send(cmd.RngFailed(refused=refused))  # refused: an envelope error at once (a card round waits)

    @rule(pool=st.integers(0, 10**9))
    def settle(self, pool: int) -> None:
        self.send(cmd.Settle(pool_minor=pool))

    # ------------------------------------------------------------------ what a bet may be (the admission's part)

    def min_chip(self) -> int:
        return int(getattr(self.config, "min_chip_minor", 100))

    def admitted(self, player: str, stake: int) -> bool:
        """The admission (``verify_bet``) in the small: the core records what it is told was admitted."""
        state = self.state
        if self.variant.shape is RoundShape.BANKER_SEAT:
            return sum(b.stake_minor for b in state.placed) + stake <= state.table_cap_minor
        if self.variant.shape is RoundShape.BIDDING_DEALER:
            return player != state.dealer and all(b.player != player for b in state.placed)
        return True

    # ------------------------------------------------------------------ invariants

    @invariant()
    def count_steps(self) -> None:
        type(self).steps += 1

    @invariant()
    def reveals_follow_the_plan(self) -> None:
        state = self.state
        assert state.reveals_done <= state.reveals_planned
        if state.phase == Phase.SETTLING:
            assert state.reveals_done == state.reveals_planned
        hands_shown = [e for e in self.public if isinstance(e, ev.HandRevealed)]
        grabs_shown = [e for e in self.public if isinstance(e, ev.EnvelopeGrabbed)]
        assert len(hands_shown) + len(grabs_shown) == state.reveals_done
        if hands_shown:
            hands = hands_of(state)
            plan = self.variant.reveal_plan(hands)
            for event, (seat, group) in zip(hands_shown, plan, strict=False):
                part = self.variant.reveal_part(hands[seat], group, self.config)
                assert (event.seat, list(event.cards)) == (seat, [c.code for c in part.cards])
        for grabbed, grab in zip(grabs_shown, state.sealed.grabs, strict=False):
            assert (grabbed.position, grabbed.amount_minor) == (grab.position, grab.amount_minor)

    @invariant()
    def nothing_shown_before_its_reveal(self) -> None:
        """The cards in public events are the revealed parts' (and the burned card); the shares are the
        grabbed ones'; no public event carries the sealed deck or grabs."""
        state = self.state
        shown = {c for e in self.public if isinstance(e, ev.HandRevealed) for c in e.cards}
        burned = {e.drawn_card for e in self.public if isinstance(e, ev.Dealt) and e.drawn_card}
        if state.sealed.deck:
            hands = hands_of(state)
            plan = self.variant.reveal_plan(hands)[: state.reveals_done]
            revealed = {c.code for s, g in plan for c in self.variant.reveal_part(hands[s], g, self.config).cards}
            assert shown == revealed, "a card was shown before its reveal"
            unrevealed = {c.code for hand in hands.values() for c in hand.cards} - revealed
            assert not (shown | burned) & unrevealed, "a hand's card is in a public event before its reveal"
        grabbed = [e for e in self.public if isinstance(e, ev.EnvelopeGrabbed)]
        assert [(g.position, g.amount_minor) for g in grabbed] == [
            (g.position, g.amount_minor) for g in state.sealed.grabs[: len(grabbed)]
        ]
        for event in self.public:
            assert not any(f.name in ("deck", "amounts", "grab_order") for f, _ in event.ListFields())

    @invariant()
    def the_kept_area_stakes_add_up(self) -> None:
        """``staked`` and ``live_bets``, kept by ``evolve`` as bets move, are what the bets add up to, as
        ``with_bets`` counts them."""
        state, totals = self.state, dict[str, int]()
        for bet in state.bets:
            totals.setdefault(bet.area, 0)
            totals[bet.area] += bet.stake_minor if bet.status != "cancelled" else 0
        assert dict(state.staked) == totals
        assert state.live_bets == sum(bet.status != "cancelled" for bet in state.bets)
        rebuilt = with_bets(replace(state, staked=(), live_bets=0), state.bets)  # as a machine loads its bets
        assert (rebuilt.staked, rebuilt.live_bets) == (state.staked, state.live_bets)

    @invariant()
    def a_settled_round_balances(self) -> None:
        state = self.state
        if state.phase != Phase.SETTLED:
            if state.phase == Phase.VOIDED:
                voided = next(e for e in self.public if isinstance(e, ev.RoundVoided))
                assert {b.hold_id for b in state.bets} <= set(voided.hold_ids)
            return
        settled = state.settled
        assert settled is not None
        check_money(state, settled)


def check_money(state: RoundState, settled: ev.RoundSettled) -> None:
    """Every bet in play settled once; no hold pays more than it holds, nor for anyone but its owner;
    a bet's net is what the transfers naming it move; every hold of the round is listed."""
    bets = {b.bet_id: b for b in state.bets}
    assert sorted(o.bet_id for o in settled.bets) == sorted(b.bet_id for b in state.bets if b.status == "settled")
    assert all(b.status != "placed" for b in state.bets)
    holds: dict[str, tuple[str, int]] = {b.hold_id: (b.player, b.hold_minor) for b in state.bets}
    if state.dealer_hold_id:
        holds[state.dealer_hold_id] = (state.dealer, state.dealer_hold_minor)
    paid: dict[str, int] = defaultdict(int)
    moved: dict[str, int] = defaultdict(int)
    for t in settled.transfers:
        assert t.amount_minor > 0
        if t.hold_id:
            owner, _ = holds[t.hold_id]
            assert owner == t.payer, f"{t.payer} pays from {owner}'s hold"
            paid[t.hold_id] += t.amount_minor
        if t.bet_id and t.bet_id in bets:
            player = bets[t.bet_id].player
            moved[t.bet_id] += t.amount_minor * ((t.payee == player) - (t.payer == player))
    for hold_id, amount in paid.items():
        assert amount <= holds[hold_id][1], f"hold {hold_id} pays {amount}, more than it holds"
    for outcome in settled.bets:
        assert outcome.net_minor == moved[outcome.bet_id], f"bet {outcome.bet_id} nets what its transfers move"
        assert -outcome.net_minor <= bets[outcome.bet_id].hold_minor
    assert set(holds) <= set(settled.hold_ids)


def machine_for(variant_id: str) -> type[RoundCore]:
    return type(f"RoundCore_{variant_id}", (RoundCore,), {"variant_id": variant_id, "steps": 0, "decisions": 0})
