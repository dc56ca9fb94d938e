"""overlays/production: TLS on every link of the render.

Each service serves gRPC with a cert-manager Certificate that names the address its callers
dial and localhost (its probes), issued by the overlay's CA Issuer, requires client
certificates and is probed by the project's health check in the container (kubelet's gRPC
probes speak no TLS); Kafka's only listener is TLS with SCRAM and the clients speak SASL_SSL
against Strimzi's CA; every DSN verifies the pooler's certificate and name; the gateway serves
HTTPS and the Ingress has a tls block whose certificate names its hosts.
"""

from __future__ import annotations

from typing import Any

import pytest
from ops_support import SERVICES, render

Doc = dict[str, Any]
GRPC_PORTS = {"rng": 50051, "table": 50052, "wallet": 50053, "ledger": 50054}


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render("overlays/production")


def of_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


def container(docs: list[Doc], name: str) -> Doc:
    (only,) = of_kind(docs, "Deployment")[f"niuniu-{name}"]["spec"]["template"]["spec"]["containers"]
    return dict(only)


def env_of(docs: list[Doc], name: str) -> dict[str, str]:
    common = of_kind(docs, "ConfigMap")["niuniu-common"]["data"]
    own = {e["name"]: e["value"] for e in container(docs, name).get("env", []) if "value" in e}
    return {**common, **own}


def mounted_secret(docs: list[Doc], name: str, path: str) -> tuple[str, str]:
    """(Secret, key) of the file ``path`` in ``name``'s container."""
    pod = of_kind(docs, "Deployment")[f"niuniu-{name}"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    directory, _, file = path.rpartition("/")
    (mount,) = [m for m in container(docs, name)["volumeMounts"] if m["mountPath"] == directory]
    secret = volumes[mount["name"]]["secret"]
    keys = {item["path"]: item["key"] for item in secret.get("items", [])} or {file: file}
    return secret["secretName"], keys[file]


def certificate_of(docs: list[Doc], secret: str) -> Doc:
    (cert,) = [c for c in of_kind(docs, "Certificate").values() if c["spec"]["secretName"] == secret]
    return cert


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_serves_and_calls_with_mutual_tls(docs: list[Doc], service: str) -> None:
    env = env_of(docs, service)
    assert "NIUNIU_TLS_CLIENT_AUTH" not in env and f"NIUNIU_{service.upper()}_TLS_CLIENT_AUTH" not in env  # require
    secret, key = mounted_secret(docs, service, env[f"NIUNIU_{service.upper()}_TLS_CERT_FILE"])
    assert key == "tls.crt" and mounted_secret(docs, service, env[f"NIUNIU_{service.upper()}_TLS_KEY_FILE"]) == (
        secret,
        "tls.key",
    )
    assert mounted_secret(docs, service, env["NIUNIU_TLS_CA_FILE"]) == (secret, "ca.crt")
    cert = certificate_of(docs, secret)["spec"]
    assert cert["issuerRef"] == {"kind": "Issuer", "name": "niuniu-ca"}
    assert of_kind(docs, "Issuer")["niuniu-ca"]["spec"]["ca"]["secretName"] == "niuniu-ca"
    assert {"server auth", "client auth"} <= set(cert["usages"])
    # The name its callers dial (NIUNIU_<SERVICE>_ADDR) and the probes' localhost are in it.
    host = env[f"NIUNIU_{service.upper()}_ADDR"].rpartition(":")[0]
    assert {host, "localhost"} <= set(cert["dnsNames"])


@pytest.mark.parametrize("service", SERVICES)
def test_the_probes_speak_tls_through_the_health_check(docs: list[Doc], service: str) -> None:
    main = container(docs, service)
    env = env_of(docs, service)
    check = ["python", "-m", "backbone.healthcheck", f"self=localhost:{GRPC_PORTS[service]}"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "grpc" not in main[probe], f"{service} {probe}: kubelet's gRPC probe speaks no TLS"
        assert main[probe]["exec"]["command"][:4] == check
    # The health check presents the pod's own certificate.
    own = env[f"NIUNIU_{service.upper()}_TLS_CERT_FILE"]
    assert env["NIUNIU_TLS_CLIENT_CERT_FILE"] == own
    assert env["NIUNIU_TLS_CLIENT_KEY_FILE"] == env[f"NIUNIU_{service.upper()}_TLS_KEY_FILE"]


def test_kafka_is_tls_only_with_scram_and_the_clients_check_the_brokers(docs: list[Doc]) -> None:
    kafka = of_kind(docs, "Kafka")["niuniu"]
    listeners = kafka["spec"]["kafka"]["listeners"]
    assert listeners and all(li["tls"] is True for li in listeners)
    assert all(li["authentication"]["type"] == "scram-sha-512" for li in listeners)
    for service in SERVICES:
        env = env_of(docs, service)
        assert env["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        host, _, port = env["KAFKA_BOOTSTRAP_SERVERS"].rpartition(":")
        assert host == "niuniu-kafka-bootstrap" and int(port) in {li["port"] for li in listeners}
        assert mounted_secret(docs, service, env["KAFKA_SSL_CAFILE"]) == ("niuniu-cluster-ca-cert", "ca.crt")


@pytest.mark.parametrize("service", SERVICES)
def test_postgres_connections_verify_the_poolers_certificate_and_name(docs: list[Doc], service: str) -> None:
    (dsn,) = [e["value"] for e in container(docs, service)["env"] if e["name"] == f"NIUNIU_{service.upper()}_DSN"]
    fields = dict(part.split("=", 1) for part in dsn.split())
    assert fields["sslmode"] == "verify-full"
    assert mounted_secret(docs, service, fields["sslrootcert"]) == (f"niuniu-{service}-pg-ca", "ca.crt")
    pooler = of_kind(docs, "Pooler")[fields["host"]]
    cluster = of_kind(docs, "Cluster")[pooler["spec"]["cluster"]["name"]]
    assert fields["host"] in cluster["spec"]["certificates"]["serverAltDNSNames"]


def test_the_ingress_has_tls_and_reaches_the_gateway_over_https(docs: list[Doc]) -> None:
    ingress = of_kind(docs, "Ingress")["niuniu-gateway"]
    hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
    (block,) = ingress["spec"]["tls"]
    assert set(block["hosts"]) == hosts
    assert set(certificate_of(docs, block["secretName"])["spec"]["dnsNames"]) == hosts
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/backend-protocol"] == "HTTPS"
    assert annotations["nginx.ingress.kubernetes.io/proxy-ssl-verify"] == "on"
    env = env_of(docs, "gateway")
    secret, _ = mounted_secret(docs, "gateway", env["NIUNIU_GATEWAY_TLS_CERT_FILE"])
    assert annotations["nginx.ingress.kubernetes.io/proxy-ssl-secret"] == f"niuniu/{secret}"
    assert annotations["nginx.ingress.kubernetes.io/proxy-ssl-name"] in certificate_of(docs, secret)["spec"]["dnsNames"]
    # It calls the table and the wallet presenting its certificate, and its probes use HTTPS.
    assert mounted_secret(docs, "gateway", env["NIUNIU_TLS_CLIENT_CERT_FILE"]) == (secret, "tls.crt")
    main = container(docs, "gateway")
    assert all(main[p]["httpGet"]["scheme"] == "HTTPS" for p in ("startupProbe", "readinessProbe", "livenessProbe"))
