"""Play a Golden Bull (or a 68 NiuNiu) table with a few bot players against the running services.

``niuniu-demo [--rounds N] [--players K] [--variant golden_bull|red_envelope_bull]``
registers the bots through the wallet
(idempotently), has the admin fund them, opens a table, and lets every bot place
random bets each round through the table's gRPC API while watching the table. It
prints each round as it settles: who bet what, the hands, the results and the
balances; then it verifies every round's deal from its revealed seed. At the
red-envelope table one bot bids for the dealer seat each round, the others bet
against the dealer, and each round's envelope split is verified instead. The bots'
choices use ``random`` (they are players, not the house): game randomness comes
only from the rng service.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2, table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc

from backbone import tls
from backbone.auth import bearer
from bull import fairness as fair
from bull.cards import parse_cards
from bull.variants.red_envelope_bull import envelope_record

TABLE_ID = "demo-golden-bull"
ENVELOPE_TABLE_ID = "demo-red-envelope"
FUNDING_MINOR = 1_000_000
ADMIN_USER = "demo-admin"
ADMIN_EMAIL = "demo-admin@example.org"
ADMIN_PASSWORD_FILE = "demo-admin.password"
LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=20_000,
    chips_minor=[100, 500, 1_000],
    betting_seconds=3,
    reveal_interval_ms=250,
    pause_between_rounds_ms=1_000,
)
ENVELOPE_LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=20_000,
    chips_minor=[100, 500, 1_000],
    betting_seconds=3,
    reveal_interval_ms=250,
    pause_between_rounds_ms=1_000,
)
ENVELOPE_CONFIG = {"bidding.seconds": "2", "fees.service_minor": "100"}


@dataclass
class Bot:
    name: str
    token: str
    account: str
    bets: dict[str, list[table_pb2.BetReceipt]] = field(default_factory=dict)


def addr(service: str, port: int) -> str:
    return os.environ.get(f"NIUNIU_{service.upper()}_ADDR", f"127.0.0.1:{port}")


def _admin_password_file() -> Path:
    return Path(os.environ.get("NIUNIU_RUN_DIR") or ".run") / ADMIN_PASSWORD_FILE


def _demo_admin_password() -> tuple[str, bool]:
    """(password, fresh): NIUNIU_ADMIN_PASSWORD, else the stored one, else a new random one stored
    under .run/ (mode 0600) and printed this once. There is no default password."""
    if os.environ.get("NIUNIU_ADMIN_PASSWORD"):
        return os.environ["NIUNIU_ADMIN_PASSWORD"], False
    path = _admin_password_file()
    if path.exists():
        return path.read_text().strip(), False
    password = secrets.token_urlsafe(18)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    print(f"demo admin {ADMIN_USER!r}: password {password} (stored in {path}, mode 0600; shown only this once)")
    return password, True


def _admin_tool(*args: str, password: str) -> subprocess.CompletedProcess[str]:
    """The wallet's own operator tool (python -m services.wallet.admin), next to the wallet's database."""
    env = dict(os.environ, NIUNIU_ADMIN_PASSWORD=password)
    command = [sys.executable, "-m", "services.wallet.admin", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


async def admin_token(wallet: wallet_pb2_grpc.WalletAsyncStub) -> str:
    password, fresh = _demo_admin_password()
    try:
        reply = await wallet.Login(wallet_pb2.LoginRequest(username=ADMIN_USER, password=password))
        return reply.token
    except grpc.aio.AioRpcError as error:
        if error.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise
    made = _admin_tool("create", "--role", "admin", "--username", ADMIN_USER, "--email", ADMIN_EMAIL, password=password)
    if made.returncode != 0 and "USERNAME_TAKEN" in made.stderr and fresh:
        # An earlier demo admin (e.g. from before passwords were random): it gets the new password.
        made = _admin_tool("set-password", "--username", ADMIN_USER, password=password)
    if made.returncode != 0:
        raise SystemExit(
            f"cannot create the demo admin: {made.stderr.strip()[:300]}; if it exists with another password, "
            f"set one with: python -m services.wallet.admin set-password --username {ADMIN_USER}"
        )
    return (await wallet.Login(wallet_pb2.LoginRequest(username=ADMIN_USER, password=password))).token


async def bot(wallet: wallet_pb2_grpc.WalletAsyncStub, admin: str, name: str) -> Bot:
    password = f"{name}-password"
    try:
        await wallet.Register(
            wallet_pb2.RegisterRequest(
                request_id=f"register-{name}", username=name, email=f"{name}@example.org", password=password
            )
        )
    except grpc.aio.AioRpcError as error:
        if error.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise
    login = await wallet.Login(wallet_pb2.LoginRequest(username=name, password=password))
    balance = await wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=bearer(login.token))
    if balance.available_minor < FUNDING_MINOR // 2:
        await wallet.Deposit(
            wallet_pb2.DepositRequest(
                request_id=f"fund-{name}-{random.getrandbits(48):x}", account=login.account, amount_minor=FUNDING_MINOR
            ),
            metadata=bearer(admin),
        )
    return Bot(name, login.token, login.account)


async def place_bets(table: table_pb2_grpc.TableAsyncStub, bots: Sequence[Bot], round_id: str) -> None:
    for b in bots:
        placed = []
        for n in range(random.randint(1, 3)):
            request = table_pb2.PlaceBetRequest(
                command_id=f"{round_id}.{b.name}.{n}",
                table_id=TABLE_ID,
                area=random.choice(["area_1", "area_2", "area_3"]),
                amount_minor=random.choice([100, 500, 1_000]),
                round_id=round_id,
            )
            try:
                placed.append(await table.PlaceBet(request, metadata=bearer(b.token)))
            except grpc.aio.AioRpcError as error:
                print(f"  {b.name}: bet refused: {error.code().name} {error.details()}")
        b.bets[round_id] = placed


def money(minor: int) -> str:
    return f"{minor / 100:,.2f}"


async def wallet_applied(wallet: wallet_pb2_grpc.WalletAsyncStub, admin: str, round_id: str) -> str:
    """Wait until the wallet has applied the round's settlement (it arrives through Kafka)."""
    for _ in range(150):
        try:
            applied = await wallet.GetRoundSettlement(
                wallet_pb2.GetRoundSettlementRequest(round_id=round_id), metadata=bearer(admin)
            )
            return applied.status
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
        await asyncio.sleep(0.1)
    return "not applied yet"


async def report(
    table: table_pb2_grpc.TableAsyncStub,
    wallet: wallet_pb2_grpc.WalletAsyncStub,
    admin: str,
    bots: Sequence[Bot],
    round_id: str,
) -> bool:
    view = await table.GetRound(
        table_pb2.GetRoundRequest(table_id=TABLE_ID, round_id=round_id), metadata=bearer(bots[0].token)
    )
    status = await wallet_applied(wallet, admin, round_id)
    print(f"round {view.round_no} ({round_id}) commitment {view.commitment[:16]}... wallet: {status}")
    for hand in view.hands:
        print(f"  {hand.seat:7} {' '.join(hand.cards):15} {hand.category:10} x{hand.multiplier}")
    for b in bots:
        mine = await table.GetRound(
            table_pb2.GetRoundRequest(table_id=TABLE_ID, round_id=round_id), metadata=bearer(b.token)
        )
        balance = await wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=bearer(b.token))
        bets = ", ".join(f"{o.area} {money(o.stake_minor)} {o.outcome} {o.net_minor / 100:+.2f}" for o in mine.my_bets)
        held = money(balance.held_minor)
        print(f"  {b.name:10} {bets or 'no bets'}  -> balance {money(balance.available_minor)} (held {held})")
    return True


async def revealed_round(
    table: table_pb2_grpc.TableAsyncStub, table_id: str, token: str, round_id: str
) -> table_pb2.RoundView | None:
    """The round once its seed is revealed (None if it is not within 20 s)."""
    for _ in range(100):
        view = await table.GetRound(
            table_pb2.GetRoundRequest(table_id=table_id, round_id=round_id), metadata=bearer(token)
        )
        if view.server_seed:
            return view
        await asyncio.sleep(0.2)
    print(f"  {round_id}: seed not revealed yet")
    return None


def print_verification(round_id: str, result: fair.Verification) -> bool:
    status = "verified" if result.ok else "FAILED: " + "; ".join(c.detail for c in result.failures)
    print(f"  {round_id}: {status}")
    return result.ok


async def verify(table: table_pb2_grpc.TableAsyncStub, token: str, round_id: str) -> bool:
    view = await revealed_round(table, TABLE_ID, token, round_id)
    if view is None:
        return False
    seats = {h.seat: list(h.cards) for h in view.hands}
    dealt = parse_cards([c for seat in ("dealer", "area_1", "area_2", "area_3") for c in seats[seat]])
    result = fair.verify_round(view.commitment, bytes.fromhex(view.server_seed), round_id, view.client_seed, 52, dealt)
    return print_verification(round_id, result)


async def play(rounds: int, players: int) -> int:
    async with (
        tls.aio_channel(addr("wallet", 50053), None) as wallet_channel,
        tls.aio_channel(addr("table", 50052), None) as table_channel,
    ):
        wallet = wallet_pb2_grpc.WalletStub(wallet_channel)
        table = table_pb2_grpc.TableStub(table_channel)
        admin = await admin_token(wallet)
        bots = [await bot(wallet, admin, f"bot{i + 1}") for i in range(players)]
        await table.CreateTable(
            table_pb2.CreateTableRequest(table_id=TABLE_ID, variant="golden_bull", limits=LIMITS),
            metadata=bearer(admin),
        )
        played: list[str] = []
        watch = table.WatchTable(table_pb2.WatchTableRequest(table_id=TABLE_ID), metadata=bearer(bots[0].token))
        async for update in watch:
            kind = update.WhichOneof("update")
            if kind == "round_opened":
                await place_bets(table, bots, update.round_id)
            elif kind == "result" and update.round_id in {r for b in bots for r in b.bets}:
                await report(table, wallet, admin, bots, update.round_id)
                played.append(update.round_id)
                if len(played) >= rounds:
                    break
        watch.cancel()
        print("verifying every round from its revealed seed")
        ok = all([await verify(table, bots[0].token, r) for r in played])
    return 0 if ok else 1


# --------------------------------------------------------------------------- 68 NiuNiu


async def bid_for_dealer(table: table_pb2_grpc.TableAsyncStub, bots: Sequence[Bot], round_id: str) -> None:
    dealer = random.choice(bots)
    amount = random.choice([10_000, 20_000, 30_000])
    request = table_pb2.PlaceBidRequest(
        command_id=f"{round_id}.{dealer.name}.bid", table_id=ENVELOPE_TABLE_ID, amount_minor=amount, round_id=round_id
    )
    try:
        await table.PlaceBid(request, metadata=bearer(dealer.token))
        print(f"round {round_id}: {dealer.name} bids {money(amount)} for the dealer seat")
    except grpc.aio.AioRpcError as error:
        print(f"  {dealer.name}: bid refused: {error.code().name} {error.details()}")


async def bet_against(table: table_pb2_grpc.TableAsyncStub, bots: Sequence[Bot], round_id: str, dealer: str) -> None:
    for b in bots:
        if b.account == dealer:
            continue
        request = table_pb2.PlaceBetRequest(
            command_id=f"{round_id}.{b.name}.bet",
            table_id=ENVELOPE_TABLE_ID,
            area="dealer",
            amount_minor=random.choice([100, 500, 1_000]),
            round_id=round_id,
        )
        try:
            b.bets[round_id] = [await table.PlaceBet(request, metadata=bearer(b.token))]
        except grpc.aio.AioRpcError as error:
            print(f"  {b.name}: bet refused: {error.code().name} {error.details()}")


async def report_envelope(
    table: table_pb2_grpc.TableAsyncStub,
    wallet: wallet_pb2_grpc.WalletAsyncStub,
    admin: str,
    bots: Sequence[Bot],
    round_id: str,
) -> table_pb2.RoundView:
    names = {b.account: b.name for b in bots}
    view = await table.GetRound(
        table_pb2.GetRoundRequest(table_id=ENVELOPE_TABLE_ID, round_id=round_id), metadata=bearer(admin)
    )
    status = await wallet_applied(wallet, admin, round_id)
    dealer = names.get(view.dealer, view.dealer)
    print(f"  dealer {dealer} with a pool of {money(view.dealer_pool_minor)}; wallet: {status}")
    for grab in view.grabs:
        who = names.get(grab.participant, grab.participant) + (" (dealer)" if grab.dealer else "")
        print(f"  grab {grab.grab_no + 1}: {who:14} {grab.amount_text:>6} {grab.category:10} x{grab.multiplier}")
    for bet in view.my_bets:
        who = names.get(bet.player, bet.player)
        print(f"  {who:14} bet {money(bet.stake_minor)}: {bet.outcome} {bet.net_minor / 100:+.2f}")
    if view.phase == "voided":
        print(f"  voided: {view.void_reason}")
    return view


async def verify_envelope(table: table_pb2_grpc.TableAsyncStub, admin: str, round_id: str) -> bool:
    view = await revealed_round(table, ENVELOPE_TABLE_ID, admin, round_id)
    if view is None:
        return False
    grabs = sorted(view.grabs, key=lambda g: g.grab_no)
    envelope = envelope_record(view.envelope_total_minor, [g.amount_minor for g in grabs], [g.position for g in grabs])
    result = fair.verify_round(
        view.commitment, bytes.fromhex(view.server_seed), round_id, view.client_seed, envelope=envelope
    )
    return print_verification(round_id, result)


async def play_envelope(rounds: int, players: int) -> int:
    async with (
        tls.aio_channel(addr("wallet", 50053), None) as wallet_channel,
        tls.aio_channel(addr("table", 50052), None) as table_channel,
    ):
        wallet = wallet_pb2_grpc.WalletStub(wallet_channel)
        table = table_pb2_grpc.TableStub(table_channel)
        admin = await admin_token(wallet)
        bots = [await bot(wallet, admin, f"bot{i + 1}") for i in range(max(players, 2))]
        await table.CreateTable(
            table_pb2.CreateTableRequest(
                table_id=ENVELOPE_TABLE_ID, variant="red_envelope_bull", config=ENVELOPE_CONFIG, limits=ENVELOPE_LIMITS
            ),
            metadata=bearer(admin),
        )
        played: list[str] = []
        watch = table.WatchTable(
            table_pb2.WatchTableRequest(table_id=ENVELOPE_TABLE_ID), metadata=bearer(bots[0].token)
        )
        mine: set[str] = set()
        async for update in watch:
            kind = update.WhichOneof("update")
            if kind == "round_opened":
                mine.add(update.round_id)
                await bid_for_dealer(table, bots, update.round_id)
            elif kind == "dealer_chosen" and update.round_id in mine:
                await bet_against(table, bots, update.round_id, update.dealer_chosen.dealer)
            elif kind == "result" and update.round_id in mine:
                await report_envelope(table, wallet, admin, bots, update.round_id)
                played.append(update.round_id)
                if len(played) >= rounds:
                    break
        watch.cancel()
        print("verifying every round's envelope from its revealed seed")
        ok = all([await verify_envelope(table, admin, r) for r in played])
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--players", type=int, default=3)
    parser.add_argument("--variant", choices=("golden_bull", "red_envelope_bull"), default="golden_bull")
    args = parser.parse_args(argv)
    game = play_envelope if args.variant == "red_envelope_bull" else play
    sys.exit(asyncio.run(game(args.rounds, args.players)))


if __name__ == "__main__":
    main()
