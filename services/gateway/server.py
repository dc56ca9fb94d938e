"""The gateway process: `niuniu-gateway` serves gRPC-web and Connect on HTTP/1.1 for browsers.

Settings (environment):
- NIUNIU_GATEWAY_HOST (default loopback; NIUNIU_BIND_HOST also applies) and NIUNIU_GATEWAY_PORT (8080);
- NIUNIU_GATEWAY_METRICS_PORT (9105): Prometheus /metrics (services/gateway/metrics.py) on the same
  host; 0 serves none;
- NIUNIU_TABLE_ADDR, NIUNIU_WALLET_ADDR: the services (127.0.0.1:50052, 127.0.0.1:50053), reached
  with mutual TLS when configured (backbone/tls.py, the tool's client certificate);
- NIUNIU_GATEWAY_CORS_ORIGINS: comma-separated origins a browser page may call from (exact
  "https://play.example.com", any port "http://127.0.0.1:*", or "*"). Unset: none, except
  with NIUNIU_ENV=development, where pages on http://127.0.0.1:* and http://localhost:* may;
- NIUNIU_GATEWAY_MAX_BODY_BYTES (65536), NIUNIU_GATEWAY_MAX_STREAMS (1000),
  NIUNIU_GATEWAY_UNARY_TIMEOUT_S (30);
- NIUNIU_GATEWAY_MAX_STREAMS_PER_ADDRESS (100), NIUNIU_GATEWAY_MAX_STREAMS_PER_CALLER (8): streams
  one client address, and one token's subject, may hold (services/gateway/limits.py);
- NIUNIU_GATEWAY_TRUSTED_PROXIES: comma-separated addresses or networks of the proxies in front
  (an Ingress) whose X-Forwarded-For names the client; unset: the peer is the client;
- NIUNIU_GATEWAY_KEY_FILE (with NIUNIU_JWKS_FILE publishing its public key): the gateway's own
  signing key, with which it vouches for the client address it forwards (backbone/clientaddress.py);
- NIUNIU_GATEWAY_READ_TIMEOUT_S (10): a request's body must arrive this long after its headers (else
  HTTP 408 and the connection closed); NIUNIU_GATEWAY_IDLE_TIMEOUT_S (65): a connection with no
  request's headers this long after it opened or after its last answer is closed;
- NIUNIU_GATEWAY_TLS_CERT_FILE, NIUNIU_GATEWAY_TLS_KEY_FILE: serve HTTPS with this certificate
  (PEM; both or neither). Unset: plain HTTP (behind an Ingress that terminates TLS, or on loopback);
- NIUNIU_GATEWAY_STATIC_DIR: static files served at GET / and GET /<file> (the reference web
  table, same origin as the API). Unset: with NIUNIU_ENV=development, clients/web/dist of the
  repository when it exists; otherwise none. Empty: none.

`niuniu-gateway check [URL]` waits until a gateway answers /healthz (for scripts); an https URL's
certificate is checked against NIUNIU_TLS_CA_FILE when set (else the system's trust store).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from backbone import logs, tls, tracing
from backbone.auth import DEVELOPMENT, ENV_MODE
from backbone.clientaddress import gateway_credentials
from backbone.config import DEFAULT_BIND_HOST, ConfigError
from backbone.metrics import serve_metrics
from services.gateway.app import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_STREAMS_PER_ADDRESS,
    DEFAULT_MAX_STREAMS_PER_CALLER,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_UNARY_TIMEOUT_S,
    Gateway,
    GatewayConfig,
    close_quietly,
)
from services.gateway.limits import trusted_networks
from services.gateway.methods import TABLE, WALLET

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080
DEFAULT_METRICS_PORT = 9105
DEFAULT_TABLE_ADDR = "127.0.0.1:50052"
DEFAULT_WALLET_ADDR = "127.0.0.1:50053"
DEVELOPMENT_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*")
DEVELOPMENT_STATIC_DIR = Path(__file__).resolve().parents[2] / "clients" / "web" / "dist"
SHUTDOWN_GRACE_S = 5.0


def _int(env: Mapping[str, str], name: str, default: int, *, zero: bool = False) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    if not raw.isdigit() or (int(raw) == 0 and not zero) or int(raw) > (65_535 if zero else 10**9):
        kind = "a port (0 for none)" if zero else "a positive integer"
        raise ConfigError(f"{name} must be {kind}, not {raw[:40]!r}")
    return int(raw)


def config_from_env(env: Mapping[str, str]) -> GatewayConfig:
    raw = env.get("NIUNIU_GATEWAY_CORS_ORIGINS")
    if raw is None:
        origins: tuple[str, ...] = DEVELOPMENT_ORIGINS if env.get(ENV_MODE) == DEVELOPMENT else ()
    else:
        origins = tuple(o.strip().rstrip("/") for o in raw.split(",") if o.strip())
    static = env.get("NIUNIU_GATEWAY_STATIC_DIR")
    if static is None and env.get(ENV_MODE) == DEVELOPMENT and DEVELOPMENT_STATIC_DIR.is_dir():
        static = str(DEVELOPMENT_STATIC_DIR)
    if static and not Path(static).is_dir():
        raise ConfigError(f"NIUNIU_GATEWAY_STATIC_DIR: {static[:80]} is not a directory")
    try:
        proxies = trusted_networks(env.get("NIUNIU_GATEWAY_TRUSTED_PROXIES", ""))
    except ValueError as error:
        raise ConfigError(f"NIUNIU_GATEWAY_TRUSTED_PROXIES: {error}") from None
    return GatewayConfig(
        static_dir=Path(static).resolve() if static else None,
        allowed_origins=origins,
        max_body_bytes=_int(env, "NIUNIU_GATEWAY_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
        max_streams=_int(env, "NIUNIU_GATEWAY_MAX_STREAMS", DEFAULT_MAX_STREAMS),
        max_streams_per_address=_int(env, "NIUNIU_GATEWAY_MAX_STREAMS_PER_ADDRESS", DEFAULT_MAX_STREAMS_PER_ADDRESS),
        max_streams_per_caller=_int(env, "NIUNIU_GATEWAY_MAX_STREAMS_PER_CALLER", DEFAULT_MAX_STREAMS_PER_CALLER),
        trusted_proxies=proxies,
        unary_timeout_s=_seconds(env, "NIUNIU_GATEWAY_UNARY_TIMEOUT_S", DEFAULT_UNARY_TIMEOUT_S),
        read_timeout_s=_seconds(env, "NIUNIU_GATEWAY_READ_TIMEOUT_S", DEFAULT_READ_TIMEOUT_S),
        idle_timeout_s=_seconds(env, "NIUNIU_GATEWAY_IDLE_TIMEOUT_S", DEFAULT_IDLE_TIMEOUT_S),
    )


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    return float(_int(env, name, int(default)))


def listen_address(env: Mapping[str, str]) -> tuple[str, int]:
    host = env.get("NIUNIU_GATEWAY_HOST") or env.get("NIUNIU_BIND_HOST") or DEFAULT_BIND_HOST
    return host, _int(env, "NIUNIU_GATEWAY_PORT", DEFAULT_PORT)


def metrics_port(env: Mapping[str, str]) -> int:
    return _int(env, "NIUNIU_GATEWAY_METRICS_PORT", DEFAULT_METRICS_PORT, zero=True)


def http_runner(gateway: Gateway) -> web.AppRunner:
    """The gateway's HTTP server. handler_cancellation: a browser that goes away ends its upstream
    WatchTable at once. aiohttp's keep-alive timer is the idle timeout: it runs from a connection's
    opening (or its last answer) and closes it when no request's headers have arrived by then, which
    bounds a client sending its headers slowly as well as one sending nothing. A body is bounded by
    the read timeout (Gateway._request_message), and so is the lingering read of a body left unread."""
    config = gateway.config
    return web.AppRunner(
        gateway.application(),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=config.idle_timeout_s,
        lingering_time=config.read_timeout_s,
    )


CERT_ENV, KEY_ENV = "NIUNIU_GATEWAY_TLS_CERT_FILE", "NIUNIU_GATEWAY_TLS_KEY_FILE"


def server_ssl_context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """HTTPS with the gateway's certificate (``NIUNIU_GATEWAY_TLS_CERT_FILE``/``_KEY_FILE``); None: HTTP."""
    cert, key = env.get(CERT_ENV, ""), env.get(KEY_ENV, "")
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError(f"{CERT_ENV} and {KEY_ENV} go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"{CERT_ENV}/{KEY_ENV}: cannot load {cert}, {key}: {error}") from None
    return context


async def serve(env: Mapping[str, str]) -> None:
    config = config_from_env(env)
    host, port = listen_address(env)
    https = server_ssl_context(env)
    scraped_on = metrics_port(env)
    channels = {
        TABLE: tls.aio_channel(env.get("NIUNIU_TABLE_ADDR", DEFAULT_TABLE_ADDR), None, env),
        WALLET: tls.aio_channel(env.get("NIUNIU_WALLET_ADDR", DEFAULT_WALLET_ADDR), None, env),
    }
    gateway = Gateway(channels, config, credentials=gateway_credentials(env))
    runner = http_runner(gateway)
    await runner.setup()
    site = web.TCPSite(runner, host, port, shutdown_timeout=SHUTDOWN_GRACE_S, ssl_context=https)
    await site.start()
    serve_metrics(scraped_on, host)
    log.info(
        "gateway listening",
        extra={
            "address": f"{'https' if https else 'http'}://{host}:{port}",
            "metrics_port": scraped_on,
            "origins": list(config.allowed_origins),
            "methods": len(gateway.methods),
            "static_dir": str(config.static_dir or ""),
        },
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await close_quietly(channels)


def check(url: str, timeout_s: float, env: Mapping[str, str] | None = None) -> bool:
    """True once ``url`` answers 200 within ``timeout_s``; https is checked against ``NIUNIU_TLS_CA_FILE``."""
    env = os.environ if env is None else env
    context = ssl.create_default_context(cafile=env.get(tls.CA_ENV) or None) if url.startswith("https:") else None
    deadline = time.monotonic() + timeout_s
    while True:
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(url, timeout=2, context=context) as answer,
        ):
            if answer.status == 200:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="niuniu-gateway", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    probe = sub.add_parser("check", help="wait until a gateway answers /healthz")
    probe.add_argument("url", nargs="?", default="")
    probe.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.command == "check":
        host, port = listen_address(os.environ)
        scheme = "https" if os.environ.get(CERT_ENV) else "http"
        url = args.url or f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/healthz"
        sys.exit(0 if check(url, args.timeout) else 1)
    logs.configure("gateway")
    tracing.configure("gateway")  # off unless NIUNIU_OTLP_ENDPOINT is set
    try:
        asyncio.run(serve(dict(os.environ)))
    except ConfigError as error:
        log.error("gateway: %s", error)
        sys.exit(2)


if __name__ == "__main__":
    main()
