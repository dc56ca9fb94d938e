"""The wallet's gRPC servicer: who is calling, proto -> command -> application -> proto.

Who may call what is decided here, in one place per RPC (see wallet.proto):
players reach only their own account; admin and auditor any account (auditor only
reads); a cashier (an operator's payment integration) only Deposit and Withdraw, and
only on player accounts, with no reads; holds are placed, resized and resolved only by
the table service (or an admin).
Domain errors become status codes in backbone.grpcserver's interceptor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from niuniu.wallet.v1 import wallet_pb2 as pb
from niuniu.wallet.v1 import wallet_pb2_grpc

from backbone.auth import Principal, Role, require
from backbone.clientaddress import vouched_address
from backbone.errors import REASON_METADATA_KEY, DomainError, InvalidArgument, NotFound, PermissionDenied
from services.wallet import domain, domain_play, repo_users
from services.wallet.app import WalletApp
from services.wallet.domain import AccountState
from services.wallet.domain_holds import Decision, Hold, HoldRequest, ResizeRequest
from services.wallet.domain_play import LimitKind, ResponsiblePlay
from services.wallet.throttle import RETRY_AFTER_METADATA_KEY, Throttle, TooManyAttempts, client_address

Context = grpc.aio.ServicerContext[Any, Any]

TABLE = "table"
LEDGER = "ledger"

_HOLD_STATUS = {
    domain.HoldStatus.OPEN: pb.HOLD_STATUS_OPEN,
    domain.HoldStatus.POSTED: pb.HOLD_STATUS_POSTED,
    domain.HoldStatus.VOIDED: pb.HOLD_STATUS_VOIDED,
    domain.HoldStatus.EXPIRED: pb.HOLD_STATUS_EXPIRED,
}
_LIMIT_KINDS = {
    pb.LIMIT_KIND_DAILY_DEPOSIT: LimitKind.DAILY_DEPOSIT,
    pb.LIMIT_KIND_WEEKLY_DEPOSIT: LimitKind.WEEKLY_DEPOSIT,
    pb.LIMIT_KIND_DAILY_LOSS: LimitKind.DAILY_LOSS,
    pb.LIMIT_KIND_WEEKLY_LOSS: LimitKind.WEEKLY_LOSS,
    pb.LIMIT_KIND_REALITY_CHECK_MINUTES: LimitKind.REALITY_CHECK_MINUTES,
}
_LIMIT_PROTOS = {v: k for k, v in _LIMIT_KINDS.items()}


def _account_for(caller: Principal, account: str, *, staff: tuple[Role, ...], services: tuple[str, ...] = ()) -> str:
    """The account a call is about: a player's own (empty means own), or any for the allowed roles."""
    if caller.role is Role.PLAYER:
        own = domain.player_account(caller.subject)
        if account not in ("", own):
            raise PermissionDenied("NOT_YOUR_ACCOUNT", "players may only reach their own account")
        return own
    allowed = caller.role in staff or (caller.role is Role.SERVICE and caller.service_name in services)
    if not allowed:
        raise PermissionDenied("ROLE_NOT_ALLOWED", f"{caller.role.value} {caller.subject} may not do this")
    if not account:
        raise InvalidArgument("ACCOUNT_REQUIRED", "name the account")
    return account


def _cash_caller(caller: Principal, account: str) -> Principal:
    """Deposit/Withdraw: an admin on any account, a cashier on player accounts only."""
    require(caller, Role.ADMIN, Role.CASHIER)
    if caller.role is Role.CASHIER and domain.account_kind(account) is not domain.AccountKind.PLAYER:
        raise PermissionDenied("PLAYER_ACCOUNTS_ONLY", "a cashier may only move money to and from player accounts")
    return caller


def _require_one_of(caller: Principal, roles: tuple[Role, ...], services: tuple[str, ...]) -> None:
    if caller.role in roles or (caller.role is Role.SERVICE and caller.service_name in services):
        return
    raise PermissionDenied("ROLE_NOT_ALLOWED", f"{caller.role.value} {caller.subject} may not do this")


def balance_pb(a: AccountState) -> pb.AccountBalance:
    return pb.AccountBalance(account=a.account, available_minor=a.available_minor, held_minor=a.held_minor)


def hold_request(h: pb.PlaceHoldRequest) -> HoldRequest:
    return HoldRequest(h.hold_id, h.account, h.amount_minor, h.reason, h.round_id, h.expires_at_unix_ms)


def refusal_pb(error: DomainError) -> pb.Refusal:
    code: int = error.code.value[0]
    return pb.Refusal(code=code, reason=error.reason, message=error.message)


def _hold_outcome(outcome: Decision | DomainError) -> pb.PlaceHoldOutcome:
    if isinstance(outcome, DomainError):
        return pb.PlaceHoldOutcome(refused=refusal_pb(outcome))
    return pb.PlaceHoldOutcome(placed=pb.HoldResult(hold=hold_pb(outcome.hold), replayed=outcome.replayed))


def hold_pb(h: Hold) -> pb.Hold:
    q = h.request
    return pb.Hold(
        hold_id=q.hold_id,
        account=q.account,
        amount_minor=h.amount_minor,
        reason=q.reason,
        round_id=q.round_id,
        expires_at_unix_ms=domain.to_ms(h.expires_at),
        placed_at_unix_ms=domain.to_ms(h.placed_at),
        status=_HOLD_STATUS[h.status],
        posted_minor=h.posted_minor,
        released_minor=h.released_minor,
        resolved_at_unix_ms=domain.to_ms(h.resolved_at) if h.resolved_at else 0,
        resolved_by=h.resolved_by,
        postings=[pb.Posting(payee=p, amount_minor=a) for p, a in h.postings],
    )


def play_pb(account: str, play: ResponsiblePlay, now: Any) -> pb.ResponsiblePlay:
    limits = []
    for kind in domain_play.MONEY_LIMITS:
        setting = play.setting(kind).settled(now)
        limits.append(
            pb.Limit(
                kind=_LIMIT_PROTOS[kind],
                value=setting.value,
                has_pending=setting.pending_value is not None,
                pending_value=setting.pending_value or 0,
                pending_effective_at_unix_ms=(
                    domain.to_ms(setting.pending_effective_at) if setting.pending_effective_at else 0
                ),
                used_minor=play.used_minor.get(kind, 0),
            )
        )
    exclusion = play.exclusion
    active = exclusion.active(now)
    return pb.ResponsiblePlay(
        account=account,
        limits=limits,
        reality_check_minutes=play.setting(LimitKind.REALITY_CHECK_MINUTES).in_force(now),
        self_excluded=active,
        self_excluded_permanently=exclusion.permanent,
        self_excluded_until_unix_ms=domain.to_ms(exclusion.until) if active and exclusion.until else 0,
    )


def profile_pb(u: repo_users.User) -> pb.Profile:
    return pb.Profile(
        account_id=u.account_id,
        username=u.username,
        email=u.email,
        role=u.role,
        account=domain.player_account(u.account_id) if u.role == Role.PLAYER.value else "",
        created_at_unix_ms=domain.to_ms(u.created_at),
    )


class WalletServicer(wallet_pb2_grpc.WalletServicer):
    def __init__(self, app: WalletApp, throttle: Throttle | None = None) -> None:
        self._app = app
        self._throttle = throttle or Throttle(None)

    def _caller(self, context: Context) -> Principal:
        return self._app.tokens.authenticate(context)

    # ------------------------------------------------------------------- accounts

    async def _throttled(self, username: str, context: Context) -> str:
        """Admits a Login/Register (RESOURCE_EXHAUSTED with retry-after past a limit); the caller's address:
        the client's as the gateway vouches for it (backbone/clientaddress.py), else the connection's peer."""
        address = vouched_address(self._app.tokens, context) or client_address(context.peer() or "")
        try:
            await self._throttle.admit(username, address)
        except TooManyAttempts as error:
            await context.abort(
                error.code,
                str(error),
                trailing_metadata=(
                    (REASON_METADATA_KEY, error.reason),
                    (RETRY_AFTER_METADATA_KEY, str(error.retry_after_s)),
                ),
            )
        return address

    async def Register(self, request: pb.RegisterRequest, context: Context) -> pb.RegisterResponse:
        address = await self._throttled(request.username, context)
        try:
            user = await self._app.register(request.request_id, request.username, request.email, request.password)
        except DomainError:
            await self._throttle.failed(request.username, address)
            raise
        return pb.RegisterResponse(account_id=user.account_id, account=domain.player_account(user.account_id))

    async def Login(self, request: pb.LoginRequest, context: Context) -> pb.LoginResponse:
        address = await self._throttled(request.username, context)
        try:
            result = await self._app.login(request.username, request.password)
        except DomainError:
            await self._throttle.failed(request.username, address)
            raise
        user = result.user
        return pb.LoginResponse(
            token=result.token,
            role=user.role,
            account_id=user.account_id,
            account=domain.player_account(user.account_id) if user.role == Role.PLAYER.value else "",
            expires_at_unix_ms=result.expires_at_unix_ms,
        )

    async def GetProfile(self, request: pb.GetProfileRequest, context: Context) -> pb.Profile:
        caller = require(self._caller(context), Role.PLAYER, Role.ADMIN, Role.AUDITOR)
        target = request.account_id or caller.subject
        if caller.role is Role.PLAYER and target != caller.subject:
            raise PermissionDenied("NOT_YOUR_ACCOUNT", "players may only read their own profile")
        return profile_pb(await self._app.user(target))

    # ------------------------------------------------------------------- cash

    async def Deposit(self, request: pb.DepositRequest, context: Context) -> pb.MovementResult:
        caller = _cash_caller(self._caller(context), request.account)
        result = await self._app.deposit(caller.subject, request.request_id, request.account, request.amount_minor)
        return pb.MovementResult(
            movement_id=result.movement_id, balance=balance_pb(result.balance), replayed=result.replayed
        )

    async def Withdraw(self, request: pb.WithdrawRequest, context: Context) -> pb.MovementResult:
        caller = _cash_caller(self._caller(context), request.account)
        result = await self._app.withdraw(caller.subject, request.request_id, request.account, request.amount_minor)
        return pb.MovementResult(
            movement_id=result.movement_id, balance=balance_pb(result.balance), replayed=result.replayed
        )

    # ------------------------------------------------------------------- holds

    def _hold_caller(self, context: Context) -> None:
        require(self._caller(context), Role.SERVICE, Role.ADMIN, service=TABLE)

    async def PlaceHold(self, request: pb.PlaceHoldRequest, context: Context) -> pb.HoldResult:
        self._hold_caller(context)
        decision = await self._app.place_hold(hold_request(request))
        return pb.HoldResult(hold=hold_pb(decision.hold), replayed=decision.replayed)

    async def PlaceHolds(self, request: pb.PlaceHoldsRequest, context: Context) -> pb.PlaceHoldsResponse:
        self._hold_caller(context)
        outcomes = await self._app.place_holds([hold_request(h) for h in request.holds])
        return pb.PlaceHoldsResponse(outcomes=[_hold_outcome(o) for o in outcomes])

    async def PostHold(self, request: pb.PostHoldRequest, context: Context) -> pb.HoldResult:
        self._hold_caller(context)
        postings = [(p.payee, p.amount_minor) for p in request.postings]
        decision = await self._app.post_hold(request.hold_id, postings)
        return pb.HoldResult(hold=hold_pb(decision.hold), replayed=decision.replayed)

    async def VoidHold(self, request: pb.VoidHoldRequest, context: Context) -> pb.HoldResult:
        self._hold_caller(context)
        decision = await self._app.void_hold(request.hold_id)
        return pb.HoldResult(hold=hold_pb(decision.hold), replayed=decision.replayed)

    async def ResizeHold(self, request: pb.ResizeHoldRequest, context: Context) -> pb.HoldResult:
        self._hold_caller(context)
        decision = await self._app.resize_hold(
            ResizeRequest(request.resize_id, request.hold_id, request.amount_minor, request.expected_minor)
        )
        return pb.HoldResult(hold=hold_pb(decision.hold), replayed=decision.replayed)

    async def GetHold(self, request: pb.GetHoldRequest, context: Context) -> pb.Hold:
        """A hold the caller may read (``_hold_reader``); any other is answered exactly as one that does
        not exist, so hold ids cannot be probed for existence."""
        readable = self._hold_reader(context)
        hold = await self._app.hold(request.hold_id)
        if not readable(hold):
            raise NotFound("HOLD_NOT_FOUND", f"no hold {request.hold_id}")
        return hold_pb(hold)

    async def GetHolds(self, request: pb.GetHoldsRequest, context: Context) -> pb.GetHoldsResponse:
        """GetHold for many ids at once: the holds the caller may read, any other left out as an unknown
        one is."""
        readable = self._hold_reader(context)
        holds = await self._app.holds_by_id(request.hold_ids)
        return pb.GetHoldsResponse(holds=[hold_pb(h) for h in holds if readable(h)])

    def _hold_reader(self, context: Context) -> Callable[[Hold], bool]:
        """Which holds the caller may read: a player their own; staff and the table any (others refused)."""
        caller = self._caller(context)
        if caller.role is not Role.PLAYER:
            _require_one_of(caller, (Role.ADMIN, Role.AUDITOR), (TABLE,))
            return lambda hold: True
        own = domain.player_account(caller.subject)
        return lambda hold: hold.account == own

    # ------------------------------------------------------------------- queries

    def _readable(self, context: Context, account: str) -> str:
        return _account_for(self._caller(context), account, staff=(Role.ADMIN, Role.AUDITOR), services=(TABLE,))

    async def GetBalance(self, request: pb.GetBalanceRequest, context: Context) -> pb.AccountBalance:
        return balance_pb(await self._app.balance(self._readable(context, request.account)))

    async def ListHolds(self, request: pb.ListHoldsRequest, context: Context) -> pb.ListHoldsResponse:
        account = self._readable(context, request.account)
        page = await self._app.holds(account, request.include_resolved, request.page_token, request.page_size)
        return pb.ListHoldsResponse(holds=[hold_pb(h) for h in page.items], next_page_token=page.next_page_token)

    async def ListMovements(self, request: pb.ListMovementsRequest, context: Context) -> pb.ListMovementsResponse:
        account = self._readable(context, request.account)
        page = await self._app.movements(account, request.page_token, request.page_size)
        movements = [
            pb.AccountMovement(
                movement_id=e.movement_id,
                kind=e.kind,
                available_delta_minor=e.available_delta,
                held_delta_minor=e.held_delta,
                round_id=e.round_id,
                hold_id=e.hold_id,
                bet_id=e.bet_id,
                occurred_at_unix_ms=domain.to_ms(e.occurred_at),
            )
            for e in page.items
        ]
        return pb.ListMovementsResponse(movements=movements, next_page_token=page.next_page_token)

    async def ListBalances(self, request: pb.ListBalancesRequest, context: Context) -> pb.ListBalancesResponse:
        _require_one_of(self._caller(context), (Role.ADMIN, Role.AUDITOR), (LEDGER,))
        page, position, published_below = await self._app.balances(request.page_token, request.page_size)
        return pb.ListBalancesResponse(
            balances=[balance_pb(a) for a in page.items],
            next_page_token=page.next_page_token,
            store_position=position,
            published_below=published_below,
        )

    # ------------------------------------------------------------------- responsible play

    async def GetResponsiblePlay(self, request: pb.GetResponsiblePlayRequest, context: Context) -> pb.ResponsiblePlay:
        account = _account_for(self._caller(context), request.account, staff=(Role.ADMIN, Role.AUDITOR))
        play, now = await self._app.responsible_play(account)
        return play_pb(account, play, now)

    async def SetLimit(self, request: pb.SetLimitRequest, context: Context) -> pb.ResponsiblePlay:
        account = _account_for(self._caller(context), request.account, staff=(Role.ADMIN,))
        kind = _LIMIT_KINDS.get(request.kind)
        if kind is None:
            raise InvalidArgument("LIMIT_KIND_INVALID", "name the limit to set")
        play, now = await self._app.set_limit(account, kind, request.value)
        return play_pb(account, play, now)

    async def SelfExclude(self, request: pb.SelfExcludeRequest, context: Context) -> pb.ResponsiblePlay:
        account = _account_for(self._caller(context), request.account, staff=(Role.ADMIN,))
        play, now = await self._app.self_exclude(account, request.days, request.permanent)
        return play_pb(account, play, now)

    # ------------------------------------------------------------------- settlement

    async def GetRoundSettlement(self, request: pb.GetRoundSettlementRequest, context: Context) -> pb.RoundSettlement:
        _require_one_of(self._caller(context), (Role.ADMIN, Role.AUDITOR), (TABLE, LEDGER))
        r = await self._app.round_settlement(request.round_id)
        return pb.RoundSettlement(
            round_id=r.round_id,
            table_id=r.table_id,
            status=r.status,
            reason=r.reason,
            detail=r.detail,
            updated_at_unix_ms=domain.to_ms(r.updated_at),
        )
