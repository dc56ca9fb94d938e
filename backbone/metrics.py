"""Prometheus metrics shared by every service (names follow Prometheus conventions)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

GRPC_STARTED = Counter(
    "grpc_server_started_total", "RPCs started on the server.", ["grpc_service", "grpc_method", "grpc_type"]
)
GRPC_HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, by status code.",
    ["grpc_service", "grpc_method", "grpc_type", "grpc_code"],
)
GRPC_HANDLING_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Time to handle an RPC, to the last message sent.",
    ["grpc_service", "grpc_method", "grpc_type"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

OUTBOX_PUBLISHED = Counter(
    "niuniu_outbox_published_total", "Events the relay published to Kafka.", ["service", "topic"]
)
OUTBOX_PENDING = Gauge("niuniu_outbox_pending_events", "Outbox events not yet published.", ["service"])
OUTBOX_LAG_SECONDS = Gauge(
    "niuniu_outbox_lag_seconds", "Age of the oldest unpublished outbox event (0 when empty).", ["service"]
)
RELAY_LEADER = Gauge("niuniu_outbox_relay_leader", "1 while this process holds the relay lease.", ["service"])

CONSUMER_APPLIED = Counter(
    "niuniu_consumer_events_applied_total", "Events applied by a consumer (effects committed).", ["consumer", "topic"]
)
CONSUMER_DUPLICATES = Counter(
    "niuniu_consumer_duplicates_total", "Redelivered events recognised and skipped.", ["consumer", "topic"]
)
CONSUMER_FAILURES = Counter(
    "niuniu_consumer_failures_total", "Handler failures (the event is retried).", ["consumer", "topic"]
)
CONSUMER_LAG = Gauge(
    "niuniu_consumer_lag_messages",
    "Messages behind the partition's high watermark.",
    ["consumer", "topic", "partition"],
)


def serve_metrics(port: int, addr: str = "127.0.0.1") -> None:
    """Expose /metrics on ``addr:port`` (0 disables)."""
    if port:
        start_http_server(port, addr=addr)
