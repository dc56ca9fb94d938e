"""Who may hold the gateway's server streams (WatchTable): so many in all, per client address and per caller.

One free account, or one address, must not be able to take every slot of a gateway. A stream counts
against the gateway's total and its client's address from the moment it is opened, and against its
caller (the subject of its token) once the service has sent its first message: by then the service has
checked the token. The gateway holds no key, so it reads the subject without checking the signature;
counting it only after the service has checked it means a token forged in someone else's name never
uses up that person's share (it is refused at once if their share is already used up, which costs
them nothing).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
import jwt

from services.gateway import metrics
from services.gateway.protocol import ProtocolError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
IPV6_CUSTOMER_PREFIX = 64  # one subscriber's IPv6 network: its addresses count as one


def _exhausted(limit: str, reason: str) -> ProtocolError:
    metrics.STREAMS_REFUSED.labels(limit).inc()
    return ProtocolError(grpc.StatusCode.RESOURCE_EXHAUSTED, reason)


@dataclass(slots=True)
class StreamSlots:
    """The streams open through one gateway process, in all, by client address and by caller."""

    total: int
    per_address: int
    per_caller: int
    open: int = 0
    by_address: Counter[str] = field(default_factory=Counter)
    by_caller: Counter[str] = field(default_factory=Counter)

    def take(self, address: str, caller: str | None) -> Slot:
        """A slot for a new stream, or RESOURCE_EXHAUSTED naming the limit it would pass."""
        if self.open >= self.total:
            raise _exhausted("gateway", f"TOO_MANY_STREAMS: the gateway serves at most {self.total} streams")
        if self.by_address[address] >= self.per_address:
            raise _exhausted(
                "address", f"TOO_MANY_STREAMS_PER_ADDRESS: at most {self.per_address} streams from one address"
            )
        if caller is not None:
            self._check_caller(caller)
        self.open += 1
        self.by_address[address] += 1
        return Slot(self, address, caller)

    def _check_caller(self, caller: str) -> None:
        if self.by_caller[caller] >= self.per_caller:
            raise _exhausted("caller", f"TOO_MANY_STREAMS_PER_CALLER: at most {self.per_caller} streams per caller")


@dataclass(slots=True)
class Slot:
    slots: StreamSlots
    address: str
    caller: str | None
    charged: bool = False
    released: bool = False

    def verified(self) -> None:
        """The service has answered, so it accepted the token: from now on the stream counts against its
        caller; RESOURCE_EXHAUSTED if the caller's other streams got there first."""
        if self.charged or self.caller is None:
            return
        self.slots._check_caller(self.caller)
        self.slots.by_caller[self.caller] += 1
        self.charged = True

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.slots.open -= 1
        _decrement(self.slots.by_address, self.address)
        if self.charged and self.caller is not None:
            _decrement(self.slots.by_caller, self.caller)


def _decrement(counts: Counter[str], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]  # a counter of every address ever seen would only grow


def token_subject(authorization: str | None) -> str | None:
    """The subject (``sub``) of a bearer token, read without checking the token: the service checks it."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    try:
        claims = jwt.decode(token.strip(), options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    subject = claims.get("sub")
    return subject[:200] if isinstance(subject, str) and subject else None


def client_address(peer: str | None, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The address a stream counts against: the peer's or, while the hop is a trusted proxy, the address
    it says it forwarded for (``X-Forwarded-For``, read from its right end). An IPv6 client counts by
    its /64, which one subscriber holds whole."""
    address = _ip(peer)
    if address is None:
        return peer or "unknown"
    hops = [hop.strip() for hop in (forwarded_for or "").split(",") if hop.strip()]
    while hops and any(address in network for network in trusted):
        forwarded = _ip(hops.pop())
        if forwarded is None:
            break
        address = forwarded
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/{IPV6_CUSTOMER_PREFIX}", strict=False))
    return str(address)


def _ip(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text or "")
    except ValueError:
        return None


def trusted_networks(raw: str) -> tuple[Network, ...]:
    """``10.0.0.0/8, 192.168.1.7`` -> the networks; ValueError names the entry that is not one."""
    networks = []
    for entry in (part.strip() for part in raw.split(",")):
        if entry:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"not an address or a network: {entry[:60]!r}") from None
    return tuple(networks)
