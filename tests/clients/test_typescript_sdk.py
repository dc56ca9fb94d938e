"""The TypeScript SDK's own tests (clients/typescript, node's test runner), run from pytest.

- the unit tests: the docs/fairness.md vectors, money formatting, resume and session logic;
- the integration tests on the real stack through the browser gateway: resume after a
  forced disconnect at every update of a round loses and duplicates nothing; a silent link
  is detected within 10 s by the keepalive and the watch resumes without a gap.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

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
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (scripts/bootstrap installs it)")


def run_node_tests(path: str, env: dict[str, str], timeout_s: float) -> str:
    npm_build(SDK)
    done = subprocess.run(
        # --test-force-exit: the integration tests' frozen proxy connections may keep the
        # process alive for minutes after the last test (its results are in by then).
        [str(NODE), "--test", "--test-force-exit", "--test-reporter=tap", path],
        cwd=SDK,
        env=node_env(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    print(done.stdout[-6000:])
    assert done.returncode == 0, f"node --test {path} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    counts = dict(re.findall(r"^# (pass|fail|skipped|cancelled) (\d+)$", done.stdout, re.M))
    assert counts.get("fail") == "0" and counts.get("cancelled") == "0", counts
    assert counts.get("skipped") == "0", f"node skipped tests: {counts}"
    assert int(counts.get("pass", "0")) > 0, counts
    return done.stdout


def test_sdk_unit_tests() -> None:
    out = run_node_tests("dist/test/unit/", {}, 300)
    assert "# pass" in out


@pytest.mark.integration
@pytest.mark.slow
async def test_sdk_against_the_real_stack(stack: Stack, gateway: str) -> None:
    async with connect(stack) as c:
        await create_table(c, "sdk-gb", "golden_bull", GOLDEN_LIMITS)
        players = await funded_players(c, ["sdk-alice", "sdk-bob"])
    env = {
        "NIUNIU_SDK_GATEWAY": gateway,
        "NIUNIU_SDK_TABLE": "sdk-gb",
        "NIUNIU_SDK_PLAYERS": json.dumps([{"username": p.username, "password": p.password} for p in players]),
    }
    out = run_node_tests("dist/test/integration/", env, 420)
    assert "# resume:" in out and "# keepalive:" in out
