"""The table service process: `niuniu-table`."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path

import grpc
from niuniu.table.v1 import table_pb2, table_pb2_grpc

from backbone import service, tls
from backbone.grpcserver import BackgroundTask
from backbone.migrations import store_migrations
from backbone.service import ServiceContext, ServiceSpec
from services.table.api import TableServicer
from services.table.app import TableApp
from services.table.ports import GrpcRng, GrpcWallet
from services.table.runner import TableSupervisor
from services.table.watch import Notifier

DEFAULT_RNG_ADDR = "127.0.0.1:50051"
DEFAULT_WALLET_ADDR = "127.0.0.1:50053"


def app_for(ctx: ServiceContext) -> TableApp:
    """The one TableApp of this service instance (shared by the servicer and the round runner)."""
    app = ctx.extras.get("app")
    if isinstance(app, TableApp):
        return app
    tokens = ctx.tokens
    # Mutual TLS with the table's own certificate where configured (backbone/tls.py).
    rng_channel = tls.aio_channel(os.environ.get("NIUNIU_RNG_ADDR", DEFAULT_RNG_ADDR), "table")
    wallet_channel = tls.aio_channel(os.environ.get("NIUNIU_WALLET_ADDR", DEFAULT_WALLET_ADDR), "table")
    notifier = Notifier(ctx.redis, ctx.topics.prefix)
    app = TableApp(
        ctx.pool,
        ctx.store,
        GrpcWallet(wallet_channel, tokens),
        GrpcRng(rng_channel, tokens),
        notify=notifier.publish,
    )
    ctx.extras.update(app=app, notifier=notifier, tokens=tokens)
    return app


def register(server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
    app = app_for(ctx)
    servicer = TableServicer(app, ctx.store, ctx.extras["tokens"], ctx.extras["notifier"])
    table_pb2_grpc.add_TableServicer_to_server(servicer, server)
    return [table_pb2.DESCRIPTOR.services_by_name["Table"].full_name]


def supervisor(ctx: ServiceContext) -> BackgroundTask:
    owner = f"{socket.gethostname()}-{os.getpid()}-{id(ctx)}"
    app = app_for(ctx)
    moves = ctx.extras["notifier"].next_move
    return TableSupervisor(app, ctx.redis, owner, lease_prefix=ctx.topics.prefix, moves=moves).run


def notifier(ctx: ServiceContext) -> BackgroundTask:
    app_for(ctx)
    run: BackgroundTask = ctx.extras["notifier"].run
    return run


MIGRATIONS = store_migrations(Path(__file__).parent / "migrations", family_reads=True)
"""This database's migrations: the event store's, with the index WatchTable reads a table's stream and its
bets' by, then the table's own (niuniu-migrate)."""


SPEC = ServiceSpec(
    name="table",
    grpc_port=50052,
    metrics_port=9102,
    default_topic=lambda t: t.table_events,
    register=register,
    migrations=MIGRATIONS,
    background=(supervisor, notifier),
)


def main() -> None:
    service.run(SPEC)


if __name__ == "__main__":
    main()
