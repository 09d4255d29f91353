"""Helpers the tests in tests/deploy share: finding helm and promtool, and
rendering the chart."""
import os
import shutil
import subprocess

import yaml

# The release name and namespace of the golden renders.
RELEASE = "tandem"
NAMESPACE = "tandem"


def chart_dir(source_dir):
    return os.path.join(source_dir, "deploy", "helm", "tandem")


def find_helm(source_dir):
    local = os.path.join(source_dir, ".cache", "tools", "helm")
    helm = local if os.access(local, os.X_OK) else shutil.which("helm")
    assert helm, "helm not found: run tools/install-deps.sh (it puts helm in .cache/tools)"
    return helm


def find_promtool():
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found (Debian package prometheus; tools/install-deps.sh)"
    return promtool


def helm_template(helm, chart, values_files=(), sets=(), release=RELEASE, namespace=NAMESPACE):
    """Runs helm template; returns the CompletedProcess (text)."""
    args = [helm, "template", release, chart, "--namespace", namespace]
    for f in values_files:
        args += ["-f", f]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True)


def render_text(helm, chart, values_files=(), sets=(), **kw):
    out = helm_template(helm, chart, values_files, sets, **kw)
    assert out.returncode == 0, f"helm template {values_files} {sets}: {out.stderr}"
    return out.stdout


def objects(text):
    """The rendered objects, in order."""
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind_name(objs):
    return {(d["kind"], d["metadata"]["name"]): d for d in objs}


def pod_specs(objs):
    """(owner kind/name, pod spec) of every workload's pod template."""
    return [(f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
            for o in objs if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


def all_containers(pod_spec):
    return (pod_spec.get("initContainers", []) + pod_spec["containers"]
            + pod_spec.get("ephemeralContainers", []))
