"""Operator repair of a round whose settlement the wallet refused, run next to the table with its environment.

    python -m services.table.repair void-round ROUND_ID [--reason TEXT] [--wait-s 30]

The wallet applies a round's settlement whole or not at all; one it refuses
(``NiuniuWalletSettlementRejected``) leaves every hold of the round open until it
expires. ``void-round`` asks the wallet what it did with the round and, only when it
rejected the settlement, voids the round at the table: the bets become refunds and a
RoundVoided listing every hold of the round (bets, bids, the banker's) goes on the
table's stream, published by the running service's relay. The wallet accepts a void of
a round whose settlement it rejected and releases every hold. The tool then waits
(``--wait-s``) until the wallet reports the round voided. Run again, it answers the same.

Exit status: 0 voided (or voided before), 1 refused (the wallet did not reject the
round, or the round is not a settled one), 2 a configuration error, 3 the wallet had not
applied the void within the wait (run again to see).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from backbone import tls
from backbone.auth import Tokens
from backbone.config import ConfigError, Settings
from backbone.db import open_pool
from backbone.errors import DomainError, FailedPrecondition
from backbone.eventstore import ConcurrencyError, EventStore
from backbone.topics import Topics
from services.table.app import TableApp
from services.table.common import variant_of
from services.table.ports import GrpcRng, GrpcWallet, WalletPort
from services.table.server import DEFAULT_RNG_ADDR, DEFAULT_WALLET_ADDR

VOID_ATTEMPTS = 5
"""Bound on tries of the void when the table's stream moved meanwhile (the round in play appended)."""
RETRY_S = 0.1
POLL_S = 0.25
DEFAULT_REASON = "REPAIRED: the wallet rejected the round's settlement"


async def void_round(app: TableApp, wallet: WalletPort, round_id: str, reason: str) -> str:
    """Void the round at the table if the wallet rejected its settlement; what the table did ("voided",
    "already voided"). Raises FailedPrecondition when the wallet did not reject it."""
    status = await wallet.settlement_status(round_id)
    if status == "voided":
        return "already voided"
    if status != "rejected":
        raise FailedPrecondition(
            "ROUND_NOT_REJECTED", f"the wallet has {status or 'not seen'} round {round_id}: nothing to repair"
        )
    row = await app.round_row(round_id)
    table, _ = await app.get_table(row["table_id"])
    machine = app.machine_for(variant_of(table["variant"]))
    for attempt in range(1, VOID_ATTEMPTS + 1):
        try:
            voided = await machine.void_rejected(row["table_id"], round_id, reason)
            return "voided" if voided is not None else "already voided"
        except ConcurrencyError:
            if attempt == VOID_ATTEMPTS:
                raise
            await asyncio.sleep(RETRY_S * attempt)
    raise AssertionError("the loop returns or raises")


async def wait_applied(wallet: WalletPort, round_id: str, wait_s: float) -> bool:
    """Has the wallet applied the void within ``wait_s`` seconds?"""
    deadline = time.monotonic() + wait_s
    while await wallet.settlement_status(round_id) != "voided":
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def repair(round_id: str, reason: str, wait_s: float) -> int:
    settings = Settings.from_env("table", grpc_port=0, metrics_port=0)
    tokens = Tokens.from_env("table")
    pool = await open_pool(settings.dsn, min_size=1, max_size=2, schema=settings.schema)
    wallet_channel = tls.aio_channel(os.environ.get("NIUNIU_WALLET_ADDR", DEFAULT_WALLET_ADDR), "table")
    rng_channel = tls.aio_channel(os.environ.get("NIUNIU_RNG_ADDR", DEFAULT_RNG_ADDR), "table")
    try:
        wallet = GrpcWallet(wallet_channel, tokens)
        app = TableApp(pool, EventStore("table", Topics.from_env().table_events), wallet, GrpcRng(rng_channel, tokens))
        outcome = await void_round(app, wallet, round_id, reason)
        print(f"{round_id}: {outcome} at the table")
        if not await wait_applied(wallet, round_id, wait_s):
            print(f"{round_id}: the wallet has not applied the void yet", file=sys.stderr)
            return 3
        print(f"{round_id}: the wallet released every hold of the round")
        return 0
    finally:
        await wallet_channel.close()
        await rng_channel.close()
        await pool.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.table.repair")
    commands = parser.add_subparsers(dest="command", required=True)
    void = commands.add_parser("void-round", help="void a round whose settlement the wallet rejected")
    void.add_argument("round_id")
    void.add_argument("--reason", default=DEFAULT_REASON, help="recorded as the round's void reason")
    void.add_argument("--wait-s", type=float, default=30.0, help="how long to wait for the wallet to apply it")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(repair(args.round_id, args.reason, args.wait_s))
    except ConfigError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 2
    except DomainError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
