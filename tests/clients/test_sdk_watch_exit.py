"""A Node program that stops watching a table exits: the SDK's watch aborts its fetch.

The program (exit/watch_stops.mjs) logs in through the gateway, watches a table whose
rounds keep going, stops in one of the ways a consumer does (leaving a for-await loop,
calling ``return()`` or aborting its signal while a ``next()`` waits) and then does nothing
more. The table's betting window is long, so after its opening the stream carries only
heartbeats for minutes: a fetch left open keeps Node alive, and a ``next()`` left waiting
for the next update holds a ``return()`` behind it, for as long as the test would wait.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from niuniu.table.v1 import events_pb2 as ev

from tests.clients.frontend_stack import (
    GOLDEN_LIMITS,
    SDK,
    Stack,
    connect,
    create_table,
    funded_players,
    node_env,
    npm_build,
)

NODE = shutil.which("node")
PROGRAM = Path(__file__).with_name("exit") / "watch_stops.mjs"
EXIT_WITHIN_S = 30  # the program's own work is a login and one update
QUIET = ev.TableLimits()
QUIET.CopyFrom(GOLDEN_LIMITS)
QUIET.betting_seconds = 300  # no update but heartbeats after the window opens
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(NODE is None, reason="node is not installed (scripts/bootstrap installs it)"),
]


@pytest.mark.parametrize("how", ["break", "return", "abort"])
async def test_a_program_that_stops_watching_exits(stack: Stack, gateway: str, how: str) -> None:
    npm_build(SDK)
    table_id = f"sdk-exit-{how}"
    async with connect(stack) as c:
        await create_table(c, table_id, "golden_bull", QUIET)
        (player,) = await funded_players(c, [f"sdk-exit-{how}"])
    env = {
        "NIUNIU_SDK_GATEWAY": gateway,
        "NIUNIU_SDK_TABLE": table_id,
        "NIUNIU_SDK_USERNAME": player.username,
        "NIUNIU_SDK_PASSWORD": player.password,
        "NIUNIU_SDK_STOP": how,
    }
    try:
        done = subprocess.run(
            [str(NODE), str(PROGRAM)],
            env=node_env(env),
            capture_output=True,
            text=True,
            timeout=EXIT_WITHIN_S,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"the program did not exit after it stopped watching: {expired.stdout!r}") from None
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["how"] == how and out["first"], out
