"""The game-integrity metrics as the table moves them: settled rounds in process (real TableApp and store,
fake rng and wallet, fake clock), read back from prometheus_client's registry.

The counters are process-wide, so every check is a difference across the round it is about.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY
from psycopg_pool import AsyncConnectionPool

from backbone.db import open_pool
from bull.money import JACKPOT_POOL
from services.table.common import Phase
from tests.table.table_rig import Rig, player, setup_schema

pytestmark = pytest.mark.integration

BALANCES = {f"player:p{i}": 10_000_000 for i in range(4)} | {"house": 0, JACKPOT_POOL: 50_000}
COUNTERS = ("stake_minor", "won_minor", "lost_minor", "stake_squares")


@pytest.fixture
async def pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(dsn, schema=schema, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    return Rig(pool, await setup_schema(pool), BALANCES)


def counters(variant: str, bet: str, config: str) -> dict[str, float]:
    labels = {"variant": variant, "bet": bet, "config": config}
    out = {}
    for name in COUNTERS:
        value = REGISTRY.get_sample_value(f"niuniu_table_settled_{name}_total", labels)
        assert value is not None, f"{name} {labels} not pre-created"
        out[name] = value
    return out


def gauge(name: str, table: str) -> float | None:
    return REGISTRY.get_sample_value(f"niuniu_table_{name}", {"table": table})


async def test_a_settled_golden_bull_round_counts_its_bets_stakes_and_nets(rig: Rig) -> None:
    await rig.create("gbm", "golden_bull", betting_seconds=12, pause_between_rounds_ms=3_000)
    current = await rig.to_phase("gbm", Phase.BETTING)
    assert gauge("round_wait_seconds", "gbm") == 12 + 3  # betting + pause, no bidding
    before = counters("golden_bull", "area", "default")
    stakes = {"area_1": [1_000, 5_000], "area_2": [500], "area_3": [10_000]}
    for i, (area, amounts) in enumerate(stakes.items()):
        for k, amount in enumerate(amounts):
            await rig.app.place_bet(player(f"p{i}"), f"m{i}-{k}", "gbm", area, amount)
    ended = await rig.finish("gbm")
    assert ended["phase"] == Phase.SETTLED
    settled = await rig.settled(current["round_id"])
    after = counters("golden_bull", "area", "default")
    delta = {name: after[name] - before[name] for name in COUNTERS}
    total = sum(sum(a) for a in stakes.values())
    assert delta["stake_minor"] == total == sum(b.stake_minor for b in settled.bets)
    assert delta["won_minor"] == sum(max(b.net_minor, 0) for b in settled.bets)
    assert delta["lost_minor"] == sum(max(-b.net_minor, 0) for b in settled.bets)
    assert delta["won_minor"] + delta["lost_minor"] > 0  # Golden Bull never ties with suit tie-breaks
    assert delta["stake_squares"] == total**2  # the round is one sample of its whole stake
    assert gauge("last_round_ended_timestamp_seconds", "gbm") == ended["ended_at"].timestamp()


async def test_a_custom_configuration_counts_apart_from_the_default(rig: Rig) -> None:
    await rig.create("gbc", "golden_bull", {"commission_bps": "500"})
    await rig.to_phase("gbc", Phase.BETTING)
    default_before = counters("golden_bull", "area", "default")
    custom_before = counters("golden_bull", "area", "custom")
    await rig.app.place_bet(player("p0"), "c0", "gbc", "area_2", 1_000)
    await rig.finish("gbc")
    assert counters("golden_bull", "area", "default") == default_before
    assert counters("golden_bull", "area", "custom")["stake_minor"] - custom_before["stake_minor"] == 1_000


async def test_a_voided_round_moves_the_last_round_ended_and_counts_no_stake(rig: Rig) -> None:
    config = {"bidding.seconds": "3", "bidding.min_minor": "1000", "bidding.increment_minor": "1000"}
    await rig.create("rem", "red_envelope_bull", config, betting_seconds=20)
    current = await rig.to_phase("rem", Phase.BIDDING)
    assert gauge("round_wait_seconds", "rem") == 3 + 20 + 1  # bidding + betting + the rig's 1 s pause
    before = counters("red_envelope_bull", "player", "default")
    ended = await rig.finish("rem")  # nobody bids: voided (NO_DEALER)
    assert ended["round_id"] == current["round_id"] and ended["phase"] == Phase.VOIDED
    assert gauge("last_round_ended_timestamp_seconds", "rem") == ended["ended_at"].timestamp()
    assert counters("red_envelope_bull", "player", "default") == before
