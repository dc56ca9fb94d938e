"""Every environment variable a service (or the browser gateway) reads is set by the manifests that run it.

A service that reads a variable nobody sets falls back to its default, and the defaults
are right for a local run (loopback addresses, the development ports), not in a cluster:
the table dialled 127.0.0.1 for the rng and the wallet while its health said SERVING.

1. What each service reads, statically: the modules its console script imports
   (transitively, within this repository), and in them every string literal that is an
   environment variable name (``"NIUNIU_..."``, ``"KAFKA_..."``, ``"DATABASE_URL"``,
   ``"REDIS_URL"``) or a per-service template (``f"NIUNIU_{service.upper()}_DSN"``),
   expanded for that service.
2. What the manifests set: each rendered Deployment's container ``env`` and the keys of
   the ConfigMaps and Secrets its ``envFrom`` names, rendered or, for an overlay that names
   objects the operator creates (``operator-created.yaml``, overlays/production), listed.
3. A variable read and never set fails the check, unless ``OPTIONAL`` says why its
   default is right in a cluster (or why it must never be set there), ``ONLY_FOR`` says
   that only some services really read it, or it is a key file (``KEY_FILES``) of a
   container whose environment sets ``NIUNIU_ENV=development`` (overlays/local: the
   services then sign with the development keys, see backbone/auth.py). The per-service
   and the shared spelling of a setting (``NIUNIU_RNG_BIND_HOST`` / ``NIUNIU_BIND_HOST``)
   stand in for each other, also for ``OPTIONAL``.

    python deploy/k8s/check_env.py [--kubectl PATH] [OVERLAY_OR_RENDERED_YAML ...]
    (default: every overlay under deploy/k8s/overlays; exit 1 on any gap)
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ROOT / "deploy" / "k8s" / "overlays"
PACKAGES = ("backbone", "bull", "services")
SERVICES = ("rng", "table", "wallet", "ledger")
CHECKED = (*SERVICES, "gateway")  # the four services and the browser gateway

# Read by a service, and rightly unset in a cluster. Each entry says why.
OPTIONAL: dict[str, str] = {
    "DATABASE_URL": "fallback when NIUNIU_<SERVICE>_DSN is unset; the manifests set the DSN",
    "NIUNIU_DB_SCHEMA": "tests only: several systems in one database, a schema each",
    "NIUNIU_EVENT_LOOP": "uvloop by default; asyncio only to rule the loop out when diagnosing",
    "NIUNIU_OTLP_ENDPOINT": "traces are off by default; an operator with a collector sets it (docs/operating.md)",
    "NIUNIU_GATEWAY_KEY_FILE": "without it the gateway forwards no client address and logs so (docs/security.md)",
    "NIUNIU_RNG_TEST_DECKS": "test-only deck hook: must never be set outside tests",
    "NIUNIU_ENV": "development mode: set only by the local scripts, tests and overlays/local, never in production",
    "NIUNIU_GRPC_REFLECTION": "server reflection, on by default; overlays/production turns it off (config.yaml)",
    "NIUNIU_WALLET_THROTTLE": "the wallet's log-in throttle limits; the defaults are the production ones",
    "NIUNIU_GATEWAY_HOST": "the gateway's own listen address; NIUNIU_BIND_HOST (niuniu-common) applies when unset",
    "NIUNIU_GATEWAY_STATIC_DIR": "the reference web table's files; a cluster serves none (the operator's own frontend)",
    "NIUNIU_GATEWAY_UNARY_TIMEOUT_S": "the gateway's unary deadline; the default (30 s) is the production one",
    # Mutual TLS between the services is off unless NIUNIU_TLS_CA_FILE is set (backbone/tls.py):
    # overlays/production sets it with cert-manager's certificates (tls-patches.yaml); the
    # local and operators overlays run without.
    "NIUNIU_TLS_CA_FILE": "mutual TLS is off unless set; overlays/production sets it (tls-patches.yaml)",
    "NIUNIU_TLS_CLIENT_AUTH": "mutual TLS only (NIUNIU_TLS_CA_FILE)",
    "NIUNIU_TLS_CERT_FILE": "mutual TLS only: NIUNIU_<SERVICE>_TLS_CERT_FILE",
    "NIUNIU_TLS_KEY_FILE": "mutual TLS only: NIUNIU_<SERVICE>_TLS_KEY_FILE",
    "NIUNIU_TLS_CLIENT_CERT_FILE": "mutual TLS only: an operator tool's client certificate",
    "NIUNIU_TLS_CLIENT_KEY_FILE": "mutual TLS only: an operator tool's client key",
    # backbone.auth.operator_token's f"NIUNIU_{role.value.upper()}_TOKEN" looks like a
    # per-service template to this check; only command-line tools read it, never a service.
    "NIUNIU_TOKEN": "NIUNIU_<ROLE>_TOKEN: an operator tool's token, not read by the services",
    "KAFKA_SSL_CAFILE": "the brokers' CA, for a *SSL protocol only; overlays/production sets it (tls-patches.yaml)",
    "KAFKA_SASL_USERNAME": "a process's default Kafka user; a service uses its own NIUNIU_<SERVICE>_KAFKA_USER",
    "KAFKA_SASL_PASSWORD": "a process's default Kafka password; a service uses its own NIUNIU_<SERVICE>_KAFKA_PASSWORD",
    # The bounds on waits and the health probes (backbone/config.py): the defaults are the production ones.
    **dict.fromkeys(
        (
            "NIUNIU_DB_CONNECT_TIMEOUT_S",
            "NIUNIU_DB_STATEMENT_TIMEOUT_MS",
            "NIUNIU_DB_LOCK_TIMEOUT_MS",
            "NIUNIU_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
            "NIUNIU_DB_POOL_TIMEOUT_S",
            "NIUNIU_REDIS_TIMEOUT_MS",
            "NIUNIU_HEALTH_PROBE_INTERVAL_MS",
            "NIUNIU_HEALTH_PROBE_TIMEOUT_MS",
        ),
        "a bound on a wait or the health probe schedule (backbone/config.py); the defaults are the production ones",
    ),
}

# Read by the shared code of every service, but used only by these services.
ONLY_FOR: dict[str, tuple[str, ...]] = {
    # Tokens.from_env(issuer=spec.issues_user_tokens): only the wallet signs player/admin/auditor tokens.
    "NIUNIU_ISSUER_KEY_FILE": ("wallet",),
    # backbone.clientaddress: only the gateway signs with it; the wallet imports the module to verify.
    "NIUNIU_GATEWAY_KEY_FILE": ("gateway",),
    # The browser gateway imports backbone.config and backbone.auth for a constant or two but holds
    # no database, no Redis and no key (the callers' tokens pass through), and serves no gRPC: what
    # Settings.from_env and Tokens.from_env read is the four services' alone.
    **dict.fromkeys(
        (
            "NIUNIU_DSN",
            "NIUNIU_GRPC_PORT",
            "NIUNIU_KEY_FILE",
            "NIUNIU_JWKS_FILE",
            "REDIS_URL",
            "NIUNIU_DB_POOL_MAX_SIZE",
        ),
        SERVICES,
    ),
}

# The key files (backbone/auth.py KEY_ENV_VARS): required, except in development mode, where a
# service without them uses the development keys (and a configured placeholder file would stop
# it). A container whose environment sets NIUNIU_ENV=development may therefore leave them unset.
DEVELOPMENT_ENV = ("NIUNIU_ENV", "development")
KEY_FILES = frozenset(
    {"NIUNIU_JWKS_FILE", "NIUNIU_ISSUER_KEY_FILE", *(f"NIUNIU_{s.upper()}_KEY_FILE" for s in SERVICES)}
)

_NAME = re.compile(r"(?:NIUNIU_[A-Z0-9_]+|KAFKA_[A-Z0-9_]+|DATABASE_URL|REDIS_URL)")
_TEMPLATE = re.compile(r"NIUNIU_\{[^{}]*\}(_[A-Z0-9_]+)")


@dataclass(frozen=True, slots=True)
class Gap:
    overlay: str
    deployment: str
    variable: str


def console_scripts() -> dict[str, str]:
    """Console script name -> module, from pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return {name: target.split(":")[0] for name, target in re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', section, re.M)}


def module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(root_module: str) -> set[str]:
    """``root_module`` and every repository module it imports, transitively."""
    seen: set[str] = set()
    todo = [root_module]
    while todo:
        module = todo.pop()
        if module in seen or module.split(".")[0] not in PACKAGES:
            continue
        path = module_path(module)
        if path is None:
            continue
        seen.add(module)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                todo.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo.append(node.module)
                todo.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return seen


def variables_read(modules: Iterable[str], service: str) -> set[str]:
    names: set[str] = set()
    for module in modules:
        path = module_path(module)
        assert path is not None
        with path.open("rb") as source:
            for token in tokenize.tokenize(source.readline):
                if token.type != tokenize.STRING:
                    continue
                body = token.string.lstrip("rbfuRBFU").strip("\"'")
                if _NAME.fullmatch(body):
                    names.add(body)
                elif (m := _TEMPLATE.fullmatch(body)) is not None:
                    names.add(f"NIUNIU_{service.upper()}{m.group(1)}")
    return names


def render(target: Path, kubectl: str) -> list[dict[str, Any]]:
    if target.is_file():
        text = target.read_text()
    else:
        text = subprocess.run([kubectl, "kustomize", str(target)], check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]


OPERATOR_CREATED = "operator-created.yaml"


def operator_created(target: Path) -> list[dict[str, Any]]:
    """The objects an overlay names but leaves to the operator, as stubs with their keys (no values)."""
    listing = target / OPERATOR_CREATED
    if not listing.is_file():
        return []
    return [
        {"kind": o["kind"], "metadata": {"name": o["name"]}, "data": dict.fromkeys(o["keys"], "")}
        for o in yaml.safe_load(listing.read_text())
    ]


def variables_set(container: dict[str, Any], docs: list[dict[str, Any]]) -> set[str]:
    names = {entry["name"] for entry in container.get("env", [])}
    by_kind_name = {(doc.get("kind"), doc.get("metadata", {}).get("name")): doc for doc in docs}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        for kind, ref in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if ref in source:
                doc = by_kind_name.get((kind, source[ref]["name"]), {})
                keys = set(doc.get("data") or {}) | set(doc.get("stringData") or {})
                names |= {prefix + key for key in keys}
    return names


def value_of(container: dict[str, Any], docs: list[dict[str, Any]], variable: str) -> str | None:
    """The literal value ``variable`` gets in this container (env wins over envFrom), if the manifests say."""
    for entry in container.get("env", []):
        if entry["name"] == variable:
            return entry.get("value") if "valueFrom" not in entry else None
    by_kind_name = {(doc.get("kind"), doc.get("metadata", {}).get("name")): doc for doc in docs}
    value: str | None = None
    for source in container.get("envFrom", []):  # a later source overrides an earlier one
        prefix = source.get("prefix", "")
        for kind, ref in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if ref in source and variable.startswith(prefix):
                doc = by_kind_name.get((kind, source[ref]["name"]), {})
                key = variable.removeprefix(prefix)
                if key in (doc.get("stringData") or {}):
                    value = doc["stringData"][key]
                elif kind == "ConfigMap" and key in (doc.get("data") or {}):
                    value = doc["data"][key]
    return value


def deployments(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc.get("kind") == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield doc["metadata"]["name"], container


def check(target: Path, kubectl: str) -> list[Gap]:
    scripts = console_scripts()
    docs = render(target, kubectl) + operator_created(target)
    gaps: list[Gap] = []
    for name, container in deployments(docs):
        command = (container.get("command") or [""])[0]
        module = scripts.get(command)
        service = next((s for s in CHECKED if module == f"services.{s}.server"), None)
        if module is None or service is None:
            continue
        read = variables_read(imported_modules(module), service)
        given = variables_set(container, docs)
        development = value_of(container, docs, DEVELOPMENT_ENV[0]) == DEVELOPMENT_ENV[1]
        missing = {
            v
            for v in read - given
            if _alternative(v, service) not in given
            and v not in OPTIONAL
            and _alternative(v, service) not in OPTIONAL
            and service in ONLY_FOR.get(v, ONLY_FOR.get(_alternative(v, service), (service,)))
            and not (development and v in KEY_FILES)
        }
        gaps += [Gap(target.name, name, variable) for variable in sorted(missing)]
    return gaps


def _alternative(variable: str, service: str) -> str:
    """The per-service and the shared spelling of one setting (NIUNIU_RNG_X <-> NIUNIU_X): either one will do."""
    own = f"NIUNIU_{service.upper()}_"
    if variable.startswith(own):
        return "NIUNIU_" + variable.removeprefix(own)
    return own + variable.removeprefix("NIUNIU_") if variable.startswith("NIUNIU_") else variable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubectl", default=str(ROOT / ".venv" / "bin" / "kubectl"))
    parser.add_argument("targets", nargs="*", type=Path)
    args = parser.parse_args(argv)
    targets = args.targets or sorted(p for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").is_file())
    gaps = [gap for target in targets for gap in check(target, args.kubectl)]
    for gap in gaps:
        where = f"{gap.overlay}: {gap.deployment}"
        print(f"check-env: {where} reads {gap.variable}, which no manifest sets", file=sys.stderr)
    if not gaps:
        print(f"check-env: ok: every variable the services read is set ({', '.join(t.name for t in targets)})")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
