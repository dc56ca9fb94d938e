"""Mutual TLS for gRPC between the services, where configured.

Off unless ``NIUNIU_TLS_CA_FILE`` names the CA that signed every service's certificate
(``scripts/keys generate --tls`` makes a local CA and the certificates; under Kubernetes
they come from Secrets). Then each service serves TLS with its own certificate
(``NIUNIU_<SERVICE>_TLS_CERT_FILE``, ``NIUNIU_<SERVICE>_TLS_KEY_FILE``) and, by default,
requires a client certificate signed by that CA (``NIUNIU_TLS_CLIENT_AUTH=optional``, or
per service ``NIUNIU_<SERVICE>_TLS_CLIENT_AUTH``, lets clients without one in, e.g. a
wallet or table reached by frontends that hold no certificate). A service calling
another presents its own certificate. Tools (the health check) present
``NIUNIU_TLS_CLIENT_CERT_FILE`` / ``NIUNIU_TLS_CLIENT_KEY_FILE`` when set.

TLS authenticates the transport; who may call what is still decided by the caller's
token (backbone/auth.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import grpc

from backbone import tracing
from backbone.config import ConfigError, GrpcSettings

CA_ENV = "NIUNIU_TLS_CA_FILE"
CLIENT_AUTH_ENV = "NIUNIU_TLS_CLIENT_AUTH"


def _read(path: str, var: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"{var}: cannot read {path}: {error.strerror}") from None


def enabled(env: Mapping[str, str] | None = None) -> bool:
    return bool((os.environ if env is None else env).get(CA_ENV))


def _pair(env: Mapping[str, str], cert_var: str, key_var: str) -> tuple[bytes, bytes] | None:
    cert, key = env.get(cert_var, ""), env.get(key_var, "")
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError(f"{cert_var} and {key_var} go together")
    return _read(key, key_var), _read(cert, cert_var)


def _service_pair(service: str, env: Mapping[str, str]) -> tuple[bytes, bytes]:
    name = service.upper()
    pair = _pair(env, f"NIUNIU_{name}_TLS_CERT_FILE", f"NIUNIU_{name}_TLS_KEY_FILE")
    if pair is None:
        raise ConfigError(
            f"{CA_ENV} is set, so the {service} service needs NIUNIU_{name}_TLS_CERT_FILE and "
            f"NIUNIU_{name}_TLS_KEY_FILE (scripts/keys generate --tls makes local ones)"
        )
    return pair


def server_credentials(service: str, env: Mapping[str, str] | None = None) -> grpc.ServerCredentials | None:
    """TLS for ``service``'s server (client certificates required unless configured optional); None if off."""
    env = os.environ if env is None else env
    if not enabled(env):
        return None
    ca = _read(env[CA_ENV], CA_ENV)
    auth = env.get(f"NIUNIU_{service.upper()}_TLS_CLIENT_AUTH") or env.get(CLIENT_AUTH_ENV) or "require"
    if auth not in ("require", "optional"):
        raise ConfigError(f"{CLIENT_AUTH_ENV} must be 'require' or 'optional', not {auth[:40]!r}")
    return grpc.ssl_server_credentials(
        [_service_pair(service, env)], root_certificates=ca, require_client_auth=auth == "require"
    )


def channel_credentials(service: str | None, env: Mapping[str, str] | None = None) -> grpc.ChannelCredentials | None:
    """TLS for a client: ``service``'s own certificate (or the tool's, with ``service`` None); None if off."""
    env = os.environ if env is None else env
    if not enabled(env):
        return None
    ca = _read(env[CA_ENV], CA_ENV)
    pair = (
        _service_pair(service, env)
        if service
        else _pair(env, "NIUNIU_TLS_CLIENT_CERT_FILE", "NIUNIU_TLS_CLIENT_KEY_FILE")
    )
    key, cert = pair if pair else (None, None)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The largest answer a channel takes, and so the most the system's servers send
(``backbone.grpcserver.MAX_SEND_MESSAGE_BYTES``). gRPC's default is 4 MiB, and a full round's
``Ledger.RoundJournal`` is larger (a Golden Bull round of 2 048 bets measured 2.6 MB, a red-envelope
round carries about twice the entries)."""

CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
)
"""Reconnect at most a second apart: gRPC's default back-off grows to two minutes, so a channel whose
server was down for a while kept failing calls for tens of seconds after the server was back. Take
answers up to ``MAX_ANSWER_BYTES``."""


def channel_options(env: Mapping[str, str] | None = None) -> tuple[tuple[str, int | str], ...]:
    """``CHANNEL_OPTIONS`` and the load-balancing policy (``NIUNIU_GRPC_LB_POLICY``, backbone/config.py).

    gRPC's default, ``pick_first``, sends every call of a channel to the first address its target
    resolves to: a headless Service's other pods got none. ``round_robin`` keeps a connection to
    each address and takes them in turn (a ClusterIP name resolves to one address: no change).
    """
    policy = GrpcSettings.from_env(env).lb_policy
    config = json.dumps({"loadBalancingConfig": [{policy: {}}]})
    return (*CHANNEL_OPTIONS, ("grpc.service_config", config))


def aio_channel(target: str, service: str | None, env: Mapping[str, str] | None = None) -> grpc.aio.Channel:
    """A channel from ``service`` to ``target``: mutual TLS when configured, plaintext otherwise."""
    credentials = channel_credentials(service, env)
    options = channel_options(env)
    interceptors = tracing.client_interceptors() or None  # a CLIENT span and its traceparent, when on
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)
