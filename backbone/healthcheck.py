"""Wait until gRPC services report SERVING: ``python -m backbone.healthcheck NAME=HOST:PORT ... [--timeout S]``."""

from __future__ import annotations

import argparse
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from backbone import tls


def check(target: str, timeout_s: float = 1.0) -> str:
    """The health status name of ``target`` ('SERVING', 'NOT_SERVING', or the gRPC error)."""
    credentials = tls.channel_credentials(None)  # the operator's certificate under mutual TLS
    with grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError as error:
            return error.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def wait(targets: dict[str, str], timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    status = {name: "UNKNOWN" for name in targets}
    while time.monotonic() < deadline:
        status = {name: check(target) for name, target in targets.items()}
        if all(s == "SERVING" for s in status.values()):
            break
        time.sleep(0.5)
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("targets", nargs="+", help="NAME=HOST:PORT")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    targets = dict(item.split("=", 1) for item in args.targets)
    status = wait(targets, args.timeout)
    for name, state in status.items():
        print(f"{name:8} {targets[name]:22} {state}")
    sys.exit(0 if all(s == "SERVING" for s in status.values()) else 1)


if __name__ == "__main__":
    main()
