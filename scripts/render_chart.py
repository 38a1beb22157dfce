"""Renders the Helm chart with Helm's own engine (the helm-python-sdk package embeds it): the one
place the chart is rendered, for scripts/check_chart.py and for tests/it/chart.rs, which plays the
result under `podman kube play`.

Usage: render_chart.py RELEASE VALUES_JSON   prints the rendered objects as one JSON array
"""
import json
import os
import sys

import yaml
from helm_python.chart import Chart

CHART = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy", "helm", "sluice")


def render(values, release="sluice", namespace="sluice"):
    """The chart's objects for `values`, NOTES.txt and empty templates left out."""
    manifests = Chart.load(CHART).render(values, name=release, namespace=namespace, is_install=True)
    docs = []
    for path in sorted(manifests):
        if path.endswith("NOTES.txt") or not manifests[path].strip():
            continue
        docs.extend(d for d in yaml.safe_load_all(manifests[path]) if d)
    return docs


if __name__ == "__main__":
    print(json.dumps(render(json.loads(sys.argv[2]), release=sys.argv[1])))
