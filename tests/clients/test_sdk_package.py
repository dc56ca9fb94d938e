"""The SDK as a web team installs it: `npm pack`'s tarball installed into an empty folder.

The folder holds nothing of this repository but the tarball and a Node program written
against the package alone (packaged/play.ts). The program is type-checked with tsc and run
against the real stack through the gateway: it logs in, reads a refusal's reason code, bets
with a client seed, watches the round to its result and seed, and verifies the round with
``verifyRound(roundView)`` and from the stream alone. Its figures are checked against the
services and bull.fairness.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2

from bull import fairness as fair
from tests.clients.frontend_stack import GOLDEN_LIMITS, SDK, Stack, connect, create_table, funded_players, node_env

NODE, NPM = shutil.which("node"), shutil.which("npm")
PROGRAM = Path(__file__).with_name("packaged")
CLIENT_SEED = "sdk-tarball-7"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(NODE is None or NPM is None, reason="node and npm are not installed (scripts/bootstrap)"),
]


def run(args: list[str], cwd: Path, timeout_s: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=node_env(env or {}), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def packed_sdk(into: Path) -> Path:
    """``npm pack``: the ``prepare`` script builds the package (generated code included) first."""
    out = run([str(NPM), "pack", "--json", "--pack-destination", str(into)], SDK, 300)
    (packed,) = json.loads(out[out.index("[") :])
    files = {f["path"] for f in packed["files"]}
    assert {"package.json", "README.md", "dist/src/index.js", "dist/src/index.d.ts"} <= files, files
    assert any(f.startswith("dist/src/gen/niuniu/table/v1/") for f in files), "the generated clients are packed"
    assert not any(f.startswith(("src/", "test/", "dist/test/")) for f in files), files
    return into / str(packed["filename"])


def consumer(folder: Path, tarball: Path) -> Path:
    """An empty project that depends on the tarball, with the program and tsc."""
    folder.mkdir()
    (folder / "package.json").write_text(json.dumps({"name": "sdk-consumer", "private": True, "type": "module"}))
    for name in ("play.ts", "tsconfig.json"):
        shutil.copy(PROGRAM / name, folder / name)
    dev = json.loads((SDK / "package.json").read_text())["devDependencies"]
    tools = [f"typescript@{dev['typescript']}", f"@types/node@{dev['@types/node']}"]
    run([str(NPM), "install", "--prefer-offline", "--no-audit", "--no-fund", str(tarball), *tools], folder, 300)
    installed = folder / "node_modules" / "@niuniu" / "sdk"
    assert not installed.is_symlink() and (installed / "dist" / "src" / "index.js").is_file()
    return folder


async def test_the_packed_sdk_plays_and_verifies_a_round(stack: Stack, gateway: str, tmp_path: Path) -> None:
    async with connect(stack) as c:
        await create_table(c, "sdk-pack", "golden_bull", GOLDEN_LIMITS)
        (player,) = await funded_players(c, ["sdk-packed"])
    folder = consumer(tmp_path / "consumer", packed_sdk(tmp_path))
    run([str(folder / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"], folder, 180)
    env = {
        "NIUNIU_SDK_GATEWAY": gateway,
        "NIUNIU_SDK_TABLE": "sdk-pack",
        "NIUNIU_SDK_USERNAME": player.username,
        "NIUNIU_SDK_PASSWORD": player.password,
        "NIUNIU_SDK_CLIENT_SEED": CLIENT_SEED,
    }
    out = json.loads(run([str(NODE), "dist/play.js"], folder, 150, env).strip().splitlines()[-1])
    print(json.dumps(out, indent=1))

    assert out["refusal"] == "FailedPrecondition BELOW_TABLE_MINIMUM"
    assert out["ok"] is True and out["checks"] == ["commitment", "client_seed", "deck"], out
    # The player's seed counted: the receipt echoes it, GetRound lists it as counted, and the round's
    # client seed is its combination (the only bettor).
    assert out["contributed"] == CLIENT_SEED and out["counted"] == [CLIENT_SEED]
    # The same round verified from the stream alone: the opening's commitment, the hands and seed_revealed.
    assert out["streamOk"] is True and out["streamChecks"] == ["commitment", "client_seed", "deck"], out
    assert out["streamSeeds"] == [CLIENT_SEED]
    assert out["clientSeed"] == fair.combine_client_seeds([CLIENT_SEED])
    async with connect(stack) as c:
        view = await c.table.GetRound(
            table_pb2.GetRoundRequest(table_id="sdk-pack", round_id=out["roundId"]), metadata=player.player.auth
        )
        balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=player.player.auth)
    assert view.client_seed == out["clientSeed"]
    (bet,) = view.my_bets
    assert (bet.stake_minor, bet.net_minor) == (int(out["stakeMinor"]), int(out["netMinor"]))
    assert int(out["holdMinor"]) == 5 * bet.stake_minor  # Golden Bull holds five times the stake
    assert int(out["balanceAfter"]) == int(out["balanceBefore"]) + bet.net_minor == balance.available_minor
