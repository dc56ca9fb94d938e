"""The wallet service process: `niuniu-wallet`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import grpc
from argon2 import PasswordHasher
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc

from backbone import service
from backbone.auth import Tokens
from backbone.eventstore import utc_now
from backbone.grpcserver import BackgroundTask
from backbone.handlers import Handler, handling
from backbone.migrations import store_migrations
from backbone.service import ConsumerSpec, ServiceContext, ServiceSpec
from services.wallet.api import WalletServicer
from services.wallet.app import WalletApp
from services.wallet.settlement import ROUND_SETTLED, ROUND_VOIDED, make_handler
from services.wallet.sweeper import SWEEP_INTERVAL_S, sweep_forever
from services.wallet.throttle import Throttle, ThrottlePolicy

SETTLEMENT_CONSUMER = "wallet-settlement"
SETTLEMENTS_IN_PARALLEL = 3
"""Partitions of the table's topic whose settlements the wallet applies at once (of 6 by default):
tables that end their rounds together (created together, same timings) send a burst of them."""
APP_KEY = "wallet.app"


def sweeping(app: WalletApp, interval_s: float) -> BackgroundTask:
    """The background task that sweeps ``app``'s expired holds every ``interval_s``."""

    async def run(stop: asyncio.Event) -> None:
        await sweep_forever(app, stop, interval_s)

    return run


MIGRATIONS = store_migrations(Path(__file__).parent / "migrations")
"""This database's migrations: the event store's, then the wallet's own (niuniu-migrate)."""


def make_spec(
    *,
    clock: Callable[[], datetime] = utc_now,
    tokens: Tokens | None = None,
    hasher: PasswordHasher | None = None,
    sweep_interval_s: float = SWEEP_INTERVAL_S,
    consumer_name: str = SETTLEMENT_CONSUMER,
    throttle: ThrottlePolicy | None = None,
) -> ServiceSpec:
    """The wallet's spec; tests inject the clock, a cheaper hasher and a unique consumer group.

    ``throttle`` defaults to NIUNIU_WALLET_THROTTLE (services/wallet/throttle.py).
    """

    def app_for(ctx: ServiceContext) -> WalletApp:
        """One application per running instance, shared by the servicer, the consumer and the sweeper."""
        app = ctx.extras.get(APP_KEY)
        if app is None:
            app = WalletApp(ctx.pool, ctx.store, tokens or ctx.tokens, clock=clock, hasher=hasher)
            ctx.extras[APP_KEY] = app
        assert isinstance(app, WalletApp)
        return app

    def register(server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        limiter = Throttle(ctx.redis, throttle or ThrottlePolicy.from_env(), prefix=ctx.topics.prefix)
        wallet_pb2_grpc.add_WalletServicer_to_server(WalletServicer(app_for(ctx), limiter), server)
        return [wallet_pb2.DESCRIPTOR.services_by_name["Wallet"].full_name]

    def settlement_handler(ctx: ServiceContext) -> Handler:
        # The table's other events (bets, deals, reveals) are skipped without a transaction.
        return handling((ROUND_SETTLED, ROUND_VOIDED), make_handler(app_for(ctx)))

    def sweeper(ctx: ServiceContext) -> BackgroundTask:
        return sweeping(app_for(ctx), sweep_interval_s)

    return ServiceSpec(
        name="wallet",
        grpc_port=50053,
        metrics_port=9103,
        default_topic=lambda t: t.wallet_events,
        register=register,
        migrations=MIGRATIONS,
        consumers=(
            ConsumerSpec(
                consumer_name,
                lambda t: [t.table_events],
                settlement_handler,
                batch_size=1,
                # Settlements of tables on different partitions side by side: a settlement locks its
                # accounts in name order (the house first), then its holds, as every wallet command does.
                parallel_partitions=SETTLEMENTS_IN_PARALLEL,
            ),
        ),
        background=(sweeper,),
        issues_user_tokens=True,
    )


SPEC = make_spec()


def main() -> None:
    service.run(SPEC)


if __name__ == "__main__":
    main()
