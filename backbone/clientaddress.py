"""The address of the client behind the browser gateway, and who may vouch for it.

Behind the gateway every call reaches the wallet from the gateway's pod, so ``context.peer()``
names the pod, not the browser. The gateway works out the client's address (the connection's
peer, or ``X-Forwarded-For`` read from its right end while the hop is a trusted proxy) and sends
it as ``niuniu-client-address`` metadata, together with its own service token in
``niuniu-gateway-authorization`` (``service:gateway``, signed with the gateway's key; the caller's
``authorization`` stays the player's). A service takes the address only when that token verifies
as the gateway's: anyone else claiming an address is counted by its own peer address.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grpc

from backbone.auth import DEVELOPMENT, ENV_MODE, GATEWAY, Role, ServiceCredentials, Tokens
from backbone.errors import Unauthenticated

log = logging.getLogger(__name__)

CLIENT_ADDRESS_METADATA_KEY = "niuniu-client-address"
GATEWAY_TOKEN_METADATA_KEY = "niuniu-gateway-authorization"
GATEWAY_KEY_ENV = "NIUNIU_GATEWAY_KEY_FILE"
MAX_ADDRESS_CHARS = 64  # the longest IPv6 network text is 43 characters


def gateway_credentials(env: Mapping[str, str]) -> ServiceCredentials | None:
    """The gateway's own token source (its key, ``NIUNIU_GATEWAY_KEY_FILE``, published in the JWKS);
    the development key with ``NIUNIU_ENV=development``. None without a key: the services then count
    every browser by the gateway's address, and this is logged."""
    if not env.get(GATEWAY_KEY_ENV) and env.get(ENV_MODE) != DEVELOPMENT:
        log.warning(
            "%s is not set: client addresses are not vouched for, so the wallet throttles log-ins "
            "per gateway address instead of per client",
            GATEWAY_KEY_ENV,
        )
        return None
    return Tokens.from_env(GATEWAY, env=env).service_credentials(GATEWAY)


def forwarding_metadata(credentials: ServiceCredentials | None, address: str) -> list[tuple[str, str]]:
    """What the gateway adds to a call it forwards: the client's address and its own token."""
    if credentials is None:
        return []
    return [
        (CLIENT_ADDRESS_METADATA_KEY, address[:MAX_ADDRESS_CHARS]),
        (GATEWAY_TOKEN_METADATA_KEY, f"Bearer {credentials.token()}"),
    ]


def vouched_address(tokens: Tokens, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The client address the gateway vouches for on this call; None when the call carries none, or
    when whoever claims one is not the gateway (no token, an invalid one, another identity's)."""
    metadata = {key: str(value) for key, value in context.invocation_metadata() or ()}
    address = metadata.get(CLIENT_ADDRESS_METADATA_KEY, "")
    scheme, _, token = metadata.get(GATEWAY_TOKEN_METADATA_KEY, "").partition(" ")
    if not address or scheme.lower() != "bearer" or not token:
        return None
    try:
        caller = tokens.verify(token)
    except Unauthenticated:
        return None
    if caller.role is not Role.SERVICE or caller.service_name != GATEWAY:
        return None
    return address[:MAX_ADDRESS_CHARS]
