"""``python -m backbone.recover check SERVICE``: is the service's database behind its own topics?

Reads the service's topics (``niuniu.<service>.*`` under ``NIUNIU_TOPIC_PREFIX``) from the
checkpoints in its database and looks every record up in its event store, as the service
does before it starts (``backbone.restorecheck``). Connections as the service's own:
``NIUNIU_<SERVICE>_DSN`` (else ``DATABASE_URL``), ``NIUNIU_DB_SCHEMA``, Kafka as
``NIUNIU_<SERVICE>_KAFKA_USER``.

Exit status: 0 the store holds every event of its topics (the checkpoints advance: the
service will start); 1 it is behind (the reason and the way back are printed; see
docs/runbooks/RestoreBehindKafka.md); 2 bad usage or a dependency unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from backbone import restorecheck
from backbone.config import Settings
from backbone.db import open_pool
from backbone.kafka import use_identity
from backbone.topics import Topics

SERVICES = ("rng", "table", "wallet", "ledger")


def own_topics(service: str, topics: Topics) -> list[str]:
    """The topics ``service``'s relay writes: ``niuniu.<service>.*`` (``backbone.service.published_topics``)."""
    own = f"{topics.prefix}niuniu.{service}."
    return sorted(spec.name for spec in topics.specs() if spec.name.startswith(own))


async def run_check(service: str) -> int:
    settings = Settings.from_env(service, grpc_port=0, metrics_port=0)
    use_identity(service)
    pool = await open_pool(settings.dsn, schema=settings.schema, max_size=2, timeouts=settings.db_timeouts)
    try:
        async with pool.connection() as conn:
            await restorecheck.setup(conn)
        every = Topics.from_env()
        topics = restorecheck.checked_topics(own_topics(service, every), every)
        report = await restorecheck.refuse_if_behind(pool, settings.kafka_bootstrap_servers, topics, service)
    except restorecheck.BehindTopics as behind:
        print(f"{service}: {behind}")
        return 1
    finally:
        await pool.close()
    read = f"{report.records} records read"
    print(f"{service}: its store holds every event of {', '.join(topics)} ({read}): it may start")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backbone.recover", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="is SERVICE's database behind its own topics?")
    check.add_argument("service", choices=SERVICES)
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run_check(args.service))
    except Exception as error:  # a dependency unreachable: exit 2, one line
        print(f"{args.service}: the check could not run: {error!r}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
