"""The wallet service process: `niuniu-wallet`."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from backbone import service
from backbone.service import ServiceContext, ServiceSpec


def register(server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
    return []


SPEC = ServiceSpec(
    name="wallet",
    grpc_port=50053,
    metrics_port=9103,
    default_topic=lambda t: t.wallet_events,
    register=register,
)


def main() -> None:
    service.run(SPEC)


if __name__ == "__main__":
    main()
