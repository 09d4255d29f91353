#!/usr/bin/python3
"""The Prometheus rules and the Grafana dashboard in deploy/helm/tandem/files,
checked offline (promtool; Grafana is not in Debian).

  1. `promtool check rules` accepts files/rules.yaml, and
     `promtool test rules` passes every file in tests/deploy/promtool/.
  2. Those tests cover the rules: every recording rule is evaluated by a
     promql_expr_test, and every alert is tested firing and not firing
     (vLLM's vllm:* series are served by the scheduler itself, not
     recorded: tests/integration/metrics_test.py checks them).
  3. The dashboard's structure: schemaVersion, unique panel ids, gridPos on
     the 24-column grid without overlaps, rows, targets with refIds and
     expressions on the ${datasource} variable, template variables for
     namespace, pod and model.
  4. Its queries: every range is $__rate_interval (no hard-coded windows),
     scheduler queries filter on namespace, pod and model, and every query
     parses (each written, with the variables substituted, into a temporary
     rule file for `promtool check rules`).

Usage: monitoring_test.py BUILD_DIR SOURCE_DIR
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_common import chart_dir, find_promtool  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def promtool_run(promtool, *args):
    r = subprocess.run([promtool, *args], capture_output=True, text=True)
    assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}"
    return r.stdout


def check_rules(promtool, rules_file):
    out = promtool_run(promtool, "check", "rules", rules_file)
    tests = sorted(glob.glob(os.path.join(HERE, "promtool", "*.yaml")))
    assert tests, "no promtool tests in tests/deploy/promtool/"
    for t in tests:
        promtool_run(promtool, "test", "rules", t)
    print(f"rules: {out.strip().splitlines()[-1].strip()}; promtool test rules passes "
          f"{[os.path.basename(t) for t in tests]}")
    return tests


def check_coverage(rules_file, test_files):
    with open(rules_file) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    records = [r["record"] for r in rules if "record" in r]
    alerts = [r["alert"] for r in rules if "alert" in r]
    evaluated, firing, quiet = set(), set(), set()
    for path in test_files:
        with open(path) as f:
            suite = yaml.safe_load(f)
        for case in suite["tests"]:
            for t in case.get("promql_expr_test", []):
                for rec in records:
                    # A plain name, or a {__name__=~"..."} regex over several.
                    m = re.fullmatch(r'\{__name__=~"(.*)"\}', t["expr"])
                    if t["expr"] == rec or (m and re.fullmatch(m.group(1), rec)):
                        evaluated.add(rec)
            for t in case.get("alert_rule_test", []):
                (firing if t.get("exp_alerts") else quiet).add(t["alertname"])
    missing = [r for r in records if r not in evaluated]
    assert not missing, f"recording rules no promtool test evaluates: {missing}"
    assert not [r for r in records if r.startswith("vllm:")], \
        "vllm:* recording rules: the scheduler serves vLLM's series itself"
    assert not set(alerts) - firing, f"alerts never tested firing: {set(alerts) - firing}"
    assert not set(alerts) - quiet, f"alerts never tested quiet: {set(alerts) - quiet}"
    print(f"rules: all {len(records)} recording rules evaluated, all {len(alerts)} alerts "
          f"tested firing and quiet")


def overlaps(a, b):
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def check_dashboard_structure(path, dash):
    name = os.path.basename(path)
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list),
                      ("templating", dict), ("time", dict)):
        assert isinstance(dash.get(key), kind), f"{name}: {key} missing or not {kind.__name__}"
    assert dash["schemaVersion"] >= 36, f"{name}: schemaVersion {dash['schemaVersion']}"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables.get("datasource", {}).get("type") == "datasource", "no datasource variable"
    for var in ("namespace", "pod", "model"):
        assert variables.get(var, {}).get("type") == "query", f"{name}: no {var} variable"
        assert variables[var]["datasource"]["uid"] == "${datasource}"
    ids, boxes, rows = set(), [], 0
    for p in dash["panels"]:
        assert isinstance(p.get("id"), int) and p["id"] not in ids, f"{name}: id {p.get('id')}"
        ids.add(p["id"])
        g = p.get("gridPos", {})
        assert all(isinstance(g.get(k), int) for k in "hwxy"), f"panel {p['id']}: gridPos {g}"
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] >= 0 and g["x"] + g["w"] <= 24, \
            f"panel {p['id']}: gridPos {g} off the 24-column grid"
        for other_id, other in boxes:
            assert not overlaps(g, other), f"panels {other_id} and {p['id']} overlap"
        boxes.append((p["id"], g))
        if p["type"] == "row":
            rows += 1
            assert g["w"] == 24 and g["h"] == 1 and p.get("title"), f"row {p['id']}"
            assert p.get("panels") == [], f"row {p['id']}: expanded rows hold no panels"
            continue
        assert p.get("title") and p.get("type"), f"panel {p['id']}"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["id"]
        targets = p.get("targets", [])
        assert targets, f"panel {p['id']} has no targets"
        refs = [t["refId"] for t in targets]
        assert len(set(refs)) == len(refs), f"panel {p['id']}: refIds {refs}"
        for t in targets:
            assert t.get("expr"), f"panel {p['id']} target {t['refId']}: no expr"
            assert t["datasource"]["uid"] == "${datasource}", p["id"]
    row_titles = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    for want in ("Admission", "Preemption"):
        assert want in row_titles, f"{name}: no {want} row ({row_titles})"
    return rows


# Each row's panels must query these series (issue 14).
ROW_SERIES = {
    "Admission": ["tandem_scheduler_num_requests_waiting_by_reason",
                  "tandem_scheduler_requests_admitted_total",
                  "tandem_scheduler_admission_blocked_steps_total",
                  "tandem_scheduler_num_async_loads_in_flight",
                  "tandem_scheduler_kv_lookup_duration_seconds_bucket"],
    "Preemption": ["tandem_scheduler_preemptions_total", "tandem_scheduler_kv_cache_usage_ratio",
                   "tandem_scheduler_recomputed_tokens_total"],
}


def check_rows(dash):
    current, exprs = None, {}
    for p in dash["panels"]:
        if p["type"] == "row":
            current = p["title"]
            continue
        exprs.setdefault(current, []).extend(t["expr"] for t in p["targets"])
    for row, series in ROW_SERIES.items():
        text = "\n".join(exprs.get(row, []))
        missing = [s for s in series if s not in text]
        assert not missing, f"the {row} row does not show {missing}"


SUBSTITUTE = {"$__rate_interval": "5m", "$namespace": ".*", "$pod": ".*", "$model": ".*"}


def substitute(expr):
    for k, v in SUBSTITUTE.items():
        expr = expr.replace(k, v)
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr


def check_queries(promtool, dash):
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for e in exprs:
        windows = re.findall(r"\[([^\]]*)\]", e)
        assert all(w == "$__rate_interval" for w in windows), \
            f"hard-coded range {windows} (use $__rate_interval): {e}"
        if "tandem_scheduler_" in e:
            for sel in re.findall(r"tandem_scheduler_\w+\{([^}]*)\}", e):
                for var in ("$namespace", "$pod", "$model"):
                    assert var in sel, f"scheduler query not filtered on {var}: {e}"
            assert not re.search(r"tandem_scheduler_\w+(?![\w{])", e), f"unfiltered series: {e}"
        elif re.search(r"tandem_\w+", e):
            assert '"$namespace"' in e, f"query not filtered on namespace: {e}"
    # The variables' own queries: label_values(selector, label).
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["definition"])
            assert m, f"variable {v['name']}: {v['definition']}"
            exprs.append(m.group(1))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:query{i}", "expr": substitute(e)}
            for i, e in enumerate(exprs)]}]}, f)
        f.flush()
        promtool_run(promtool, "check", "rules", f.name)
    return len(exprs)


def main():
    _, source_dir = sys.argv[1], sys.argv[2]
    promtool = find_promtool()
    files = os.path.join(chart_dir(source_dir), "files")
    rules_file = os.path.join(files, "rules.yaml")
    tests = check_rules(promtool, rules_file)
    check_coverage(rules_file, tests)
    dashboards = sorted(glob.glob(os.path.join(files, "dashboards", "*.json")))
    assert dashboards, "no dashboards"
    for path in dashboards:
        with open(path) as f:
            dash = json.load(f)
        rows = check_dashboard_structure(path, dash)
        check_rows(dash)
        n = check_queries(promtool, dash)
        print(f"{os.path.basename(path)}: schemaVersion {dash['schemaVersion']}, "
              f"{len(dash['panels'])} panels in {rows} rows on the grid, variables namespace/"
              f"pod/model; all {n} queries parse (promtool) and use $__rate_interval")
    print("monitoring_test: OK")


if __name__ == "__main__":
    main()
