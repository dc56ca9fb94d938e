"""The gateway's own metrics: what browsers asked for and what they got back.

The services count their RPCs themselves (``grpc_server_handled_total``); what they cannot see
is what the gateway answers without them (a malformed message, a body too large, a page from
an origin not allowed, the service unreachable) and how long a browser's call takes end to end.

- ``niuniu_gateway_calls_total{method, protocol, code}``: every call answered, by method
  (``Table/PlaceBet``; ``unexposed`` for a path the gateway does not serve), the caller's
  protocol (``grpc-web``, ``connect-unary``, ``connect-stream``) and the gRPC code the caller
  got: the service's, or the gateway's own (``SERVICE_UNAVAILABLE`` is ``UNAVAILABLE``). A
  stream whose caller went away counts as ``CANCELLED``.
- ``niuniu_gateway_call_duration_seconds{method}``: unary calls forwarded to a service, from the
  request's arrival to its answer.
- ``niuniu_gateway_streams_open`` and ``niuniu_gateway_streams_limit``
  (``NIUNIU_GATEWAY_MAX_STREAMS``): one more stream than the limit is refused
  RESOURCE_EXHAUSTED.
- ``niuniu_gateway_streams_refused_total{limit}``: streams refused RESOURCE_EXHAUSTED, by the
  limit they would have passed: ``gateway`` (all streams), ``address`` (one client address),
  ``caller`` (one token's subject) (services/gateway/limits.py).
- ``niuniu_gateway_http_refused_total{reason}``: requests refused before they are a call:
  ``origin`` (403, CORS), ``content_type`` (415), ``http_method`` (405), ``header`` (400, a
  header the gateway reads holds a byte outside printable ASCII), ``read_timeout`` (408, the body
  did not arrive in time).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

UNEXPOSED = "unexposed"

CALLS = Counter(
    "niuniu_gateway_calls_total",
    "Calls answered, by method, the caller's protocol and the gRPC code the caller got.",
    ["method", "protocol", "code"],
)
CALL_SECONDS = Histogram(
    "niuniu_gateway_call_duration_seconds",
    "Unary calls forwarded to a service, from the request's arrival at the gateway to its answer.",
    ["method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
STREAMS_OPEN = Gauge("niuniu_gateway_streams_open", "Server streams (WatchTable) open through this gateway.")
STREAMS_LIMIT = Gauge(
    "niuniu_gateway_streams_limit", "Streams this gateway serves at most (NIUNIU_GATEWAY_MAX_STREAMS)."
)
STREAMS_REFUSED = Counter(
    "niuniu_gateway_streams_refused_total",
    "Streams refused RESOURCE_EXHAUSTED, by the limit they would have passed: gateway, address, caller.",
    ["limit"],
)
for _limit in ("gateway", "address", "caller"):
    STREAMS_REFUSED.labels(_limit)
HTTP_REFUSED = Counter(
    "niuniu_gateway_http_refused_total",
    "Requests refused before they were a call: origin (403), content_type (415), http_method (405),"
    " header (400), read_timeout (408).",
    ["reason"],
)
for _reason in ("origin", "content_type", "http_method", "header", "read_timeout"):
    HTTP_REFUSED.labels(_reason)


def method_label(path: str, exposed: bool) -> str:
    """``/niuniu.table.v1.Table/PlaceBet`` -> ``Table/PlaceBet``; a path not served -> ``unexposed``."""
    if not exposed:
        return UNEXPOSED
    service, _, method = path.lstrip("/").partition("/")
    return f"{service.rpartition('.')[2]}/{method}"
