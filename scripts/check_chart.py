"""Renders the Helm chart (render_chart.py, Helm's own engine) and checks the result: every
object validates against the Kubernetes schema, the rendered limits pass `sluice check-config`,
the environment carries the chosen settings, and bad values refuse to render. Run through scripts/check_chart.sh, which provides the Python packages.

Usage: check_chart.py SLUICE_BINARY
"""
import os
import subprocess
import sys
import tempfile

import yaml
from render_chart import render

SLUICE = sys.argv[1]
KUBE_VERSION = "1.30.0"
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def validate(docs, label):
    with tempfile.TemporaryDirectory() as d:
        files = []
        for i, doc in enumerate(docs):
            if doc["apiVersion"].startswith("monitoring.coreos.com"):
                continue  # a CRD: not in the core schema
            path = os.path.join(d, f"{i}-{doc['kind']}.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(doc, f)
            files.append(path)
        r = subprocess.run(
            ["kubernetes-validate", "--strict", "-k", KUBE_VERSION, *files],
            capture_output=True, text=True,
        )
        check(r.returncode == 0, f"{label}: {len(files)} objects valid for Kubernetes {KUBE_VERSION}"
              + ("" if r.returncode == 0 else "\n" + r.stdout + r.stderr))


def limits_load(docs, label):
    for cm in (d for d in docs if d["kind"] == "ConfigMap"):
        with tempfile.TemporaryDirectory() as d:
            for name, text in cm["data"].items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            r = subprocess.run([SLUICE, "check-config", d], capture_output=True, text=True)
            check(r.returncode == 0, f"{label}: rendered limits pass check-config {r.stderr.strip()}")


def env_of(docs):
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


scenarios = {
    "defaults": ({}, {"BACKEND_TYPE": "memory", "USE_STATSD": "false",
                      "FAILURE_POLICY": "local_share", "DEGRADED_REPLICAS": None,
                      "ADMIN_API_TOKEN": None, "DECISION_LOG": None}),
    "statsd": (
        {"statsd": {"enabled": True, "host": "statsd.monitoring", "port": 9125}},
        {"USE_STATSD": "true", "STATSD_HOST": "statsd.monitoring", "STATSD_PORT": "9125"},
    ),
    "redis": ({"backend": "redis"}, {"BACKEND_TYPE": "redis", "REDIS_TYPE": "single",
                                     "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"}),
    "redis cluster": (
        {"backend": "redis", "redis": {"type": "cluster", "url": "n1:6379,n2:6379,n3:6379"}},
        {"REDIS_TYPE": "cluster", "REDIS_URL": "n1:6379,n2:6379,n3:6379"},
    ),
    "native API on its own port with a token": (
        {"limiterApi": {"enabled": True, "port": 8082,
                        "token": {"existingSecret": "limiter-token", "secretKey": "token"}}},
        {"LIMITER_API_ENABLED": "true", "LIMITER_GRPC_PORT": "8082",
         "LIMITER_MAX_COUNT": "10000", "LIMITER_IDLE_EXPIRY": "168h",
         "LIMITER_API_TOKEN": {"secretKeyRef": {"name": "limiter-token", "key": "token"}}},
    ),
    "admin API token from a Secret, and the decision log": (
        {"adminApi": {"token": {"existingSecret": "sluice-admin", "secretKey": "token"}},
         "decisionLog": {"enabled": True, "values": "redact", "maxPerSecond": 20}},
        {"ADMIN_API_TOKEN": {"secretKeyRef": {"name": "sluice-admin", "key": "token"}},
         "DECISION_LOG": "over_limit", "DECISION_LOG_VALUES": "redact",
         "DECISION_LOG_MAX_PER_SECOND": "20"},
    ),
    "redis with the default failure policy, local_share, divided by the Deployment's count": (
        {"backend": "redis"},
        {"FAILURE_POLICY": "local_share", "DEGRADED_REPLICAS": "2"},
    ),
    "local_share with replicaCount 3": (
        {"backend": "redis", "replicaCount": 3},
        {"FAILURE_POLICY": "local_share", "DEGRADED_REPLICAS": "3"},
    ),
    "local_share autoscaled: the count is learnt (no DEGRADED_REPLICAS)": (
        {"backend": "redis", "autoscaling": {"enabled": True}},
        {"FAILURE_POLICY": "local_share", "DEGRADED_REPLICAS": None},
    ),
    "local_share with localShare.replicas 0 (learnt)": (
        {"backend": "redis", "localShare": {"replicas": 0}},
        {"DEGRADED_REPLICAS": "0"},
    ),
    "local_share with localShare.replicas 5 and autoscaling": (
        {"backend": "redis", "localShare": {"replicas": 5}, "autoscaling": {"enabled": True}},
        {"DEGRADED_REPLICAS": "5"},
    ),
    "fail_closed on redis: no replica count": (
        {"backend": "redis", "failurePolicy": "fail_closed"},
        {"FAILURE_POLICY": "fail_closed", "DEGRADED_REPLICAS": None},
    ),
    "tracing and fail-open": (
        {"tracing": {"otlpEndpoint": "http://collector:4317"}, "failurePolicy": "fail_open",
         "serviceMonitor": {"enabled": True}},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "TRACING_EXPORTER_PROTOCOL": "grpc",
         "FAILURE_POLICY": "fail_open"},
    ),
}
for label, (values, want_env) in scenarios.items():
    try:
        docs = render(values)
    except Exception as e:  # the renderer's errors are the finding
        check(False, f"{label}: render failed: {e}")
        continue
    validate(docs, label)
    limits_load(docs, label)
    env = env_of(docs)
    if not values.get("limiterApi", {}).get("enabled"):
        check("LIMITER_API_ENABLED" not in env, f"{label}: the native API stays off")
    for name, value in want_env.items():
        check(env.get(name) == value, f"{label}: {name}={env.get(name)!r} (want {value!r})")

# Each refusal with the part of the message that says why (None: any refusal).
for label, (values, why) in {
    "unknown backend": ({"backend": "memcache"}, None),
    "several memory replicas": ({"replicaCount": 2}, None),
    "redis auth without a secret": (
        {"backend": "redis", "redis": {"auth": {"enabled": True}}}, None),
    "an unknown failure policy": ({"failurePolicy": "garbage"}, "failurePolicy must be"),
    "local_share misspelt": ({"failurePolicy": "local-share"}, "failurePolicy must be"),
    "a failure policy that is not a string": (
        {"failurePolicy": ["local_share"]}, "failurePolicy must be"),
    "localShare.replicas not a number": (
        {"backend": "redis", "localShare": {"replicas": "three"}}, "localShare.replicas must be"),
    "localShare.replicas negative": (
        {"backend": "redis", "localShare": {"replicas": -1}}, "localShare.replicas must be"),
}.items():
    try:
        render(values)
        check(False, f"{label}: rendered but should be refused")
    except Exception as e:
        check(why is None or why in str(e), f"{label}: refused ({str(e).strip()[:160]})")

print(f"{len(failures)} failed" if failures else "chart checks passed")
sys.exit(1 if failures else 0)
