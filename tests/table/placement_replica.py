"""One table replica in a process of its own, for the placement tests (which kill it).

    python -m tests.table.placement_replica SCHEMA LEASE_PREFIX NAME

The real supervisor over the test's schema, with the rig's fake rng, wallet and clock;
``DATABASE_URL`` and ``REDIS_URL`` from the environment. Prints ``ready`` once it runs.
"""

from __future__ import annotations

import asyncio
import os
import sys

from redis.asyncio import Redis

from backbone.db import open_pool
from services.table.runner import TableSupervisor
from tests.table.table_rig import Rig, event_store


async def main(schema: str, prefix: str, name: str) -> None:
    pool = await open_pool(os.environ["DATABASE_URL"], schema=schema, min_size=1, max_size=4)
    redis = Redis.from_url(os.environ["REDIS_URL"])
    rig = Rig(pool, event_store(), {})
    print("ready", flush=True)
    await TableSupervisor(rig.app, redis, name, lease_prefix=prefix).run(asyncio.Event())


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
