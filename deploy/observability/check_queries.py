"""Check every PromQL query of the dashboards and alert rules against the code.

1. Each query parses: they are written as recording rules into a scratch rules file and
   `promtool check rules` parses it (Grafana's $__rate_interval etc. substituted first).
2. Each metric name a query uses is one the services export, or one a recording rule of
   alerts.rules.yml makes. The exported set is read from prometheus_client's registry
   after importing every module of backbone/ and services/ that uses prometheus_client,
   so it follows the code as metrics are added.
3. Each label a query names (matchers, by/without) exists on one of the metrics it uses
   or is one Prometheus adds (job, instance, ...).

    python deploy/observability/check_queries.py [--promtool PATH]   exit 1 on any problem
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RULES = HERE / "alerts.rules.yml"
DASHBOARDS = HERE / "dashboards"

# Series Prometheus makes itself, and labels it (or the ServiceMonitor) attaches to targets.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Series of the stateful tier's exporters (deploy/k8s/components/stateful-monitoring), the
# kubelet and kube-state-metrics, with the labels the rules use: CloudNativePG's instance
# exporter (its PodMonitor adds `cluster`), Strimzi's Kafka exporter, redis_exporter.
EXPORTER_SERIES: dict[str, set[str]] = {
    "cnpg_collector_up": {"cluster"},
    "cnpg_pg_replication_lag": {"cluster"},
    "cnpg_pg_stat_archiver_failed_count": {"cluster"},
    "cnpg_collector_last_available_backup_timestamp": {"cluster"},
    "kafka_topic_partition_in_sync_replica": {"topic", "partition"},
    "kafka_topic_partition_under_replicated_partition": {"topic", "partition"},
    "redis_up": set(),
    "redis_memory_used_bytes": set(),
    "redis_memory_max_bytes": set(),
    "kubelet_volume_stats_available_bytes": {"persistentvolumeclaim"},
    "kubelet_volume_stats_capacity_bytes": {"persistentvolumeclaim"},
    "kube_job_status_failed": {"job_name"},
    "kube_job_owner": {"job_name", "owner_kind", "owner_name"},
    "kube_cronjob_created": {"cronjob"},
    "kube_cronjob_status_last_successful_time": {"cronjob"},
}
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint", "__name__"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "inf",
    "nan",
    "atan2",
}


@dataclass(frozen=True)
class Query:
    where: str
    expr: str


def exported_metrics() -> dict[str, set[str]]:
    """Series name -> label names, for everything the services' code registers."""
    sys.path[:0] = [str(ROOT), str(ROOT / "gen")]
    for path in sorted([*ROOT.glob("backbone/**/*.py"), *ROOT.glob("services/**/*.py")]):
        if "prometheus_client" in path.read_text(encoding="utf-8"):
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    from prometheus_client import REGISTRY

    labels_of: dict[str, tuple[str, ...]] = {}
    for collector in list(REGISTRY._collector_to_names):  # no public way to list label names
        name, names = getattr(collector, "_name", None), getattr(collector, "_labelnames", None)
        if name is not None and names is not None:
            labels_of[name] = tuple(names)
    series: dict[str, set[str]] = {}
    for family in REGISTRY.collect():
        labels = set(labels_of.get(family.name, ()))
        labels |= {key for sample in family.samples for key in sample.labels}
        for suffix in SUFFIXES.get(family.type, ("",)):
            series[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return series


def dashboard_queries() -> Iterator[Query]:
    for file in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(file.read_text(encoding="utf-8"))
        for panel in _panels(board.get("panels", [])):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    yield Query(f"{file.name}: {panel.get('title')!r} {target.get('refId')}", target["expr"])
        for var in board.get("templating", {}).get("list", []):
            if var.get("type") == "query":
                text = var["query"]["query"] if isinstance(var.get("query"), dict) else var.get("query", "")
                match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text.strip())
                if match is None:
                    raise ValueError(f"{file.name}: variable {var['name']}: unsupported query {text!r}")
                yield Query(f"{file.name}: variable {var['name']}", f"count by ({match[2]}) ({match[1]})")


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def rule_queries(kind: str = "alert") -> Iterator[Query]:
    """The alert expressions (``kind="record"``: the recording rules' expressions)."""
    for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            if kind in rule:
                yield Query(f"{RULES.name}: {rule[kind]}", rule["expr"])


def substitute(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def parse_errors(queries: list[Query], promtool: str) -> list[str]:
    """promtool's complaints about queries that do not parse (one rules file, one rule each)."""
    groups = [{"name": "q", "rules": [{"record": f"q:{i}", "expr": substitute(q.expr)} for i, q in enumerate(queries)]}]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "queries.rules.yml"
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False), encoding="utf-8")
        done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    if done.returncode == 0:
        return []
    errors = []
    for line in (done.stdout + done.stderr).splitlines():
        found = re.search(r"(\d+):(\d+): group \"q\", rule (\d+)", line)
        hint = f" [{queries[int(found[3]) - 1].where}]" if found else ""
        if line.strip():
            errors.append(line.strip() + hint)
    return errors


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) that a PromQL expression mentions."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    labels: set[str] = set()
    for inside in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", inside))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for inside in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        labels |= {label.strip() for label in inside.split(",") if label.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    metrics = set()
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match[1], match[2]
        if not call and word.lower() not in KEYWORDS and not re.fullmatch(r"\d+\w*", word):
            metrics.add(word)
    return metrics, labels


def recorded_series(exported: dict[str, set[str]]) -> dict[str, set[str]]:
    """Series the recording rules make: name -> the labels of what they read plus their own labels."""
    series: dict[str, set[str]] = {}
    for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                metrics, _ = names_in(rule["expr"])
                labels = set().union(*(exported.get(m, set()) | series.get(m, set()) for m in metrics))
                series.setdefault(rule["record"], set()).update(labels | set(rule.get("labels", {})))
    return series


def name_errors(queries: list[Query], exported: dict[str, set[str]]) -> list[str]:
    """Unknown metrics and stray labels; the recording rules' series count as known."""
    exported = exported | recorded_series(exported) | EXPORTER_SERIES
    errors = []
    for q in queries:
        metrics, labels = names_in(substitute(q.expr))
        unknown = sorted(m for m in metrics if m not in exported and m not in PROMETHEUS_SERIES)
        if unknown:
            errors.append(f"{q.where}: no service exports {', '.join(unknown)}")
        known = set().union(*(exported.get(m, set()) for m in metrics)) | TARGET_LABELS
        stray = sorted(labels - known)
        if stray and not unknown:
            errors.append(f"{q.where}: label(s) {', '.join(stray)} on none of {', '.join(sorted(metrics))}")
    return errors


def all_queries() -> list[Query]:
    return [*dashboard_queries(), *rule_queries(), *rule_queries("record")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--promtool", default=shutil.which("promtool") or "promtool")
    args = parser.parse_args()
    queries = all_queries()
    errors = parse_errors(queries, args.promtool) + name_errors(queries, exported_metrics())
    for error in errors:
        print(f"check_queries: {error}", file=sys.stderr)
    print(f"check_queries: {len(queries)} queries, {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
