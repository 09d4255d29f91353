#!/usr/bin/python3
"""Every object the chart renders (defaults, all options on, and the HPA
variant) validated against the Kubernetes and CRD schemas of the npm
packages kubernetes-models, @kubernetes-models/prometheus-operator,
@kubernetes-models/keda and @kubernetes-models/cert-manager (Node.js).

The packages are installed with `npm install --prefix` into
BUILD_DIR/deploy-npm (kept between runs; needs the npm registry the first
time). Their validators check types, enums and required fields; like the
OpenAPI schemas they come from, they let unknown fields through.

Usage: k8s_models_test.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_common import chart_dir, find_helm, objects, render_text  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGES = {"kubernetes-models": "5.1.0",
            "@kubernetes-models/prometheus-operator": "6.0.0",
            "@kubernetes-models/keda": "2.0.0",
            "@kubernetes-models/cert-manager": "6.0.0"}


def install(prefix):
    """npm install the pinned packages into prefix unless they are there."""
    modules = os.path.join(prefix, "node_modules")

    def installed(pkg):
        try:
            with open(os.path.join(modules, pkg, "package.json")) as f:
                return json.load(f)["version"]
        except OSError:
            return None

    if all(installed(p) == v for p, v in PACKAGES.items()):
        return modules
    npm = shutil.which("npm")
    assert npm, "npm not found (Node.js)"
    os.makedirs(prefix, exist_ok=True)
    # The packages ask for node >= 22 but run on Debian's node 20.
    r = subprocess.run([npm, "install", "--prefix", prefix, "--no-audit", "--no-fund",
                        "--no-save", "--engine-strict=false", "--loglevel=error"]
                       + [f"{p}@{v}" for p, v in PACKAGES.items()],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"npm install: {r.stdout}{r.stderr}"
    for p, v in PACKAGES.items():
        assert installed(p) == v, f"{p}: {installed(p)}, wanted {v}"
    return modules


def main():
    build_dir, source_dir = sys.argv[1], sys.argv[2]
    node = shutil.which("node")
    assert node, "node not found (Node.js)"
    modules = install(os.path.join(build_dir, "deploy-npm"))
    helm, chart = find_helm(source_dir), chart_dir(source_dir)
    all_on = os.path.join(HERE, "golden", "all-on.values.yaml")
    renders = {"defaults": ([], []), "all-on": ([all_on], []),
               "hpa": ([], ["autoscaling.hpa.enabled=true", "networkPolicy.enabled=true",
                            "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
                            "worker.backend=cpu", "worker.gpus=0",
                            "kvstore.enabled=false"]),
               "hpa-external": ([], ["autoscaling.hpa.enabled=true",
                                     "autoscaling.hpa.metricType=External"]),
               "tls": ([all_on], ["tls.enabled=true", "tls.source=certManager",
                                  "tls.certManager.issuerRef.name=ca"]),
               "local-socket": ([all_on], ["kvstore.localSocket.enabled=true"])}
    items = []
    for label, (files, sets) in renders.items():
        items += [{"source": label, "object": o}
                  for o in objects(render_text(helm, chart, files, sets))]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(items, f)
        f.flush()
        r = subprocess.run([node, os.path.join(HERE, "k8s_validate.mjs"), modules, f.name],
                           capture_output=True, text=True, timeout=300)
    print(r.stdout, end="")
    assert r.returncode == 0, f"kubernetes-models: rc={r.returncode}\n{r.stderr}"
    kinds = sorted({i["object"]["kind"] for i in items})
    print(f"k8s_models_test: OK: {len(items)} objects valid ({', '.join(kinds)})")


if __name__ == "__main__":
    main()
