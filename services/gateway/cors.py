"""Cross-origin calls from browsers: which headers a page may send and read, and the preflight."""

from __future__ import annotations

from aiohttp import web

ALLOWED_REQUEST_HEADERS = (
    "authorization",
    "content-type",
    "x-grpc-web",
    "x-user-agent",
    "grpc-timeout",
    "connect-protocol-version",
    "connect-timeout-ms",
    "x-correlation-id",
)
EXPOSED_HEADERS = (
    "grpc-status",
    "grpc-message",
    "niuniu-reason",
    "niuniu-retry-after-s",
    "trailer-niuniu-reason",
    "trailer-niuniu-retry-after-s",
)
PREFLIGHT_MAX_AGE_S = 7200


def cors_headers(origin: str | None) -> dict[str, str]:
    """The CORS headers of an answer to ``origin`` (an allowed one; none without an Origin)."""
    if origin is None:
        return {}
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": ", ".join(EXPOSED_HEADERS),
        "Vary": "Origin",
    }


def preflight(request: web.Request, cors: dict[str, str]) -> web.Response:
    """The answer to an OPTIONS preflight: POST only, with the headers a page may send."""
    wanted = request.headers.get("Access-Control-Request-Method")
    if not cors or wanted is None:
        return web.Response(status=400, text="a preflight names its Origin and Access-Control-Request-Method\n")
    if wanted != "POST":
        return web.Response(status=405, headers={"Allow": "POST, OPTIONS"}, text="POST only\n")
    return web.Response(
        status=204,
        headers={
            **cors,
            "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": ", ".join(ALLOWED_REQUEST_HEADERS),
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
        },
    )
