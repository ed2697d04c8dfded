"""contrib/: the Prometheus alerting rules (contrib/prometheus/wal_delivery.rules.yml), their
unit tests (wal_delivery.rules.test.yml), the postgres_exporter queries the database-side
rules read (postgres_exporter_queries.yaml) and the Grafana dashboard
(contrib/grafana/wal_delivery.json), as docs/operations.md ("Alerts and the dashboard")
describes them.

promtool (Debian's prometheus package, installed by tests/setup) checks the rules, runs
their unit tests, and parses every expression of the dashboard: without it these tests
fail, they do not skip. Every metric the rules and the dashboard name is one the workers
register (src/workers) or the queries file makes. The queries run against the test
database as a login that has only the grants the queries file names."""
import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml

from conftest import connect
from relay_helpers import ensure_extension, make_topic, wait_until

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "contrib" / "prometheus"
RULES = PROM / "wal_delivery.rules.yml"
RULE_TESTS = PROM / "wal_delivery.rules.test.yml"
QUERIES = PROM / "postgres_exporter_queries.yaml"
DASHBOARD = ROOT / "contrib" / "grafana" / "wal_delivery.json"

# A metric name in PromQL: wal_... not inside a longer word (label values such as
# "wal-worker" have hyphens and are not names).
METRIC = re.compile(r"(?<![\w.])(wal_[a-z0-9_]+)\b")
REGISTERED = re.compile(r"metric_(counter|gauge|histogram)\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"")


def promtool(*args, cwd=PROM):
    path = shutil.which("promtool")
    assert path, ("promtool is not installed: it comes with Debian's prometheus package "
                  "(tests/setup installs it)")
    return subprocess.run([path, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def load_yaml(path):
    return yaml.safe_load(path.read_text())


def alerting_rules(rules):
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def dashboard_panels():
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def dashboard_exprs():
    return [t["expr"] for p in dashboard_panels() for t in p["targets"]]


def as_promql(expr):
    """A dashboard expression with Grafana's variables replaced, as Prometheus gets it."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def registered_metrics():
    """{name: kind} of every metric the workers register."""
    return {name: kind for name, (kind, _) in registrations().items()}


def call_arguments(text, start):
    """The rest of a C call's arguments from start (inside its parentheses), string
    literals blanked, without the closing parenthesis."""
    out, depth, i = [], 1, start
    while depth:
        c = text[i]
        if c == '"':
            end = i + 1
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append('"' + (text[i + 1:end] if re.fullmatch(r"\w+", text[i + 1:end]) else "") + '"')
            i = end + 1
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth:
            out.append(c)
        i += 1
    return "".join(out)


def registrations():
    """{name: (kind, label names)} of every metric the workers register. The label names
    are the registration's last argument: NULL, a compound literal {"a", "b"}, or a static
    array defined before it in the same file."""
    found = {}
    for source in (ROOT / "src" / "workers").rglob("*.c"):
        text = source.read_text()
        for m in REGISTERED.finditer(text):
            call = call_arguments(text, m.end())
            if "{" in call:
                labels = re.findall(r'"(\w+)"', call[call.rindex("{"):])
            else:
                last = re.findall(r"(\w+)\s*$", call)[0]
                arrays = re.findall(r"static const char \*const %s\[\] = \{([^}]*)\}" % last,
                                    text[:m.start()])
                labels = re.findall(r'"(\w+)"', arrays[-1]) if last != "NULL" else []
            found[m.group(2)] = (m.group(1), set(labels))
    return found


def exporter_metrics():
    """The metrics postgres_exporter makes of the queries file: <query>_<column> for each
    column that is not a label."""
    names = set()
    for namespace, query in load_yaml(QUERIES).items():
        for column in query["metrics"]:
            (name, spec), = column.items()
            if spec["usage"] != "LABEL":
                names.add(f"{namespace}_{name}")
    return names


def known_metric(name, registered, exported):
    if name in registered or name in exported:
        return True
    base, _, suffix = name.rpartition("_")
    return suffix in ("bucket", "sum", "count") and registered.get(base) == "histogram"


# ------------------------------------------------------------------------------ rules


def test_promtool_checks_the_rules():
    out = promtool("check", "rules", RULES.name)
    assert out.returncode == 0, out.stdout + out.stderr
    count = sum(len(group["rules"]) for group in load_yaml(RULES)["groups"])
    assert f"SUCCESS: {count} rules found" in out.stdout, out.stdout


def test_the_rules_unit_tests_pass():
    out = promtool("test", "rules", RULE_TESTS.name)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_is_tested_firing_and_quiet():
    tested = {}
    for case in load_yaml(RULE_TESTS)["tests"]:
        for check in case["alert_rule_test"]:
            tested.setdefault(check["alertname"], set()).add(bool(check["exp_alerts"]))
    for rule in alerting_rules(load_yaml(RULES)):
        assert tested.get(rule["alert"]) == {True, False}, \
            f"{rule['alert']}: needs a unit test where it fires and one where it does not"


def test_the_unit_tests_pin_each_alerts_for_duration(tmp_path):
    """An alert that fired a minute later than it does fails its unit test: the tests
    hold each alert's timing, not only that it fires at some point."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    rules = load_yaml(RULES)
    for rule in alerting_rules(rules):
        original = rule.get("for")
        minutes = int(original.removesuffix("m")) if original else 0
        rule["for"] = f"{minutes + 1}m"
        (tmp_path / RULES.name).write_text(yaml.safe_dump(rules, sort_keys=False))
        out = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
        assert out.returncode != 0 and f"alertname: {rule['alert']}," in out.stdout + out.stderr, \
            f"{rule['alert']} with for: {rule['for']} still passes its unit tests"
        if original is None:
            del rule["for"]
        else:
            rule["for"] = original


def test_a_changed_threshold_fails_the_unit_tests(tmp_path):
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text()
    assert text.count("waiting_for=\"relay\"}) > 120") == 1
    (tmp_path / RULES.name).write_text(text.replace("waiting_for=\"relay\"}) > 120",
                                                    "waiting_for=\"relay\"}) > 180"))
    out = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert out.returncode != 0 and "alertname: WalDeliveryRelayBehind," in out.stdout + out.stderr


# ------------------------------------------------------------------------------ dashboard


def test_the_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in dashboard_panels():
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_dashboard_expression_parses(tmp_path):
    """promtool parses each expression as a recording rule's."""
    exprs = dashboard_exprs()
    assert len(exprs) > 20
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard_expr_{i}", "expr": as_promql(e)} for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard.rules.yml").write_text(yaml.safe_dump(rules))
    out = promtool("check", "rules", "dashboard.rules.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_bad_dashboard_expression_is_caught(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard_expr_0", "expr": as_promql("sum by (destination (wal_in_flight)")}]}]}
    (tmp_path / "dashboard.rules.yml").write_text(yaml.safe_dump(rules))
    assert promtool("check", "rules", "dashboard.rules.yml", cwd=tmp_path).returncode != 0


# ------------------------------------------------------------------------------ metric names


def test_every_metric_the_rules_and_dashboard_name_exists():
    registered, exported = registered_metrics(), exporter_metrics()
    assert {"wal_consumer_lag", "wal_destination_paused", "wal_dead_letter_alerts_total",
            "wal_ingest_request_seconds"} <= set(registered)
    exprs = [r["expr"] for r in alerting_rules(load_yaml(RULES))] + dashboard_exprs()
    used = {name for e in exprs for name in METRIC.findall(e)}
    unknown = sorted(n for n in used if not known_metric(n, registered, exported))
    assert not unknown, f"named in contrib/ but neither registered in src/workers nor made by " \
                        f"{QUERIES.name}: {unknown}"
    assert known_metric("wal_ingest_request_seconds_bucket", registered, exported)
    assert not known_metric("wal_delivered_total_bucket", registered, exported)


def metric_labels():
    """{metric: its label names} for the workers' metrics, the exporter's (postgres_exporter
    adds server, the database's address) and up."""
    labels = {name: names | {"job", "instance"} for name, (_, names) in registrations().items()}
    for namespace, query in load_yaml(QUERIES).items():
        columns = [next(iter(m.items())) for m in query["metrics"]]
        keys = {c for c, spec in columns if spec["usage"] == "LABEL"} | {"job", "instance", "server"}
        for column, spec in columns:
            if spec["usage"] != "LABEL":
                labels[f"{namespace}_{column}"] = keys
    labels["up"] = {"job", "instance"}
    return labels


def unknown_labels(expr, labels):
    """The labels expr groups by or matches on that none of the metrics it names has."""
    names = set(re.findall(r"(?<![\w.])(wal_[a-z0-9_]+|up)\b", expr))
    allowed = {"le"}.union(*(labels.get(re.sub(r"_(bucket|sum|count)$", "", n), set())
                             | labels.get(n, set()) for n in names))
    used = {label.strip() for group in
            re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
            for label in group.split(",") if label.strip()}
    used |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*\"", expr))
    return used - allowed


def test_every_label_the_rules_and_dashboard_use_exists():
    """Each label an expression groups by or matches on is one of the metrics it names
    (or job, instance, le): a label the code does not set would group nothing."""
    labels = metric_labels()
    assert labels["wal_retry_failed_total"] == {"destination", "topic", "outcome", "job", "instance"}
    assert labels["wal_consumer_lag"] == {"topic", "partition", "job", "instance"}
    assert labels["wal_ingest_outbox_write_seconds"] == {"job", "instance"}
    assert labels["wal_delivery_backlog_records"] == {"topic", "state", "waiting_for", "job", "instance",
                                                   "server"}
    assert unknown_labels('sum by (dest) (wal_in_flight{topic="x"})', labels) == {"dest", "topic"}
    for expr in [r["expr"] for r in alerting_rules(load_yaml(RULES))] + dashboard_exprs():
        assert not unknown_labels(expr, labels), f"{expr}: no metric it names has {unknown_labels(expr, labels)}"


# ------------------------------------------------------------------------------ exporter queries


def monitor_grants(role):
    """The GRANT statements of the queries file's header, for role."""
    lines = [line.removeprefix("#").strip() for line in QUERIES.read_text().splitlines()
             if line.startswith("#")]
    text = " ".join(line for line in lines if line)
    grants = re.findall(r"GRANT [^;]*;", text)
    assert len(grants) >= 3, grants
    return [g.replace("wal_monitor", role) for g in grants]


def test_the_exporter_queries_run_with_only_their_grants(unique):
    ensure_extension()
    role = f"mon_{uuid.uuid4().hex[:8]}"
    relay_topic, proc_topic = f"mon.relay.{unique}", f"mon.proc.{unique}"
    brokers = int(os.environ.get("KAFKA_BROKERS") or 1)
    queries = load_yaml(QUERIES)
    with connect() as su:
        su.execute(f"CREATE ROLE {role} LOGIN")
        try:
            for grant in monitor_grants(role):
                su.execute(grant)
            # A record the relay cannot ship (Kafka cannot make its topic) and one that
            # waits for its processor (no wal-worker process runs).
            make_topic(su, relay_topic, replication_factor=brokers + 1)
            make_topic(su, proc_topic, processor_kind="http", processor="http://127.0.0.1:9/")
            for topic in (relay_topic, proc_topic):
                su.execute("SELECT wal_enqueue(%s, '{}'::jsonb, 'k1')", (topic,))

            with connect(user=role) as mon:
                results = {}
                for namespace, query in queries.items():
                    cur = mon.execute(query["query"])
                    columns = [c.name for c in cur.description]
                    expected = [next(iter(m)) for m in query["metrics"]]
                    assert columns == expected, f"{namespace}: columns {columns}, metrics {expected}"
                    usage = {next(iter(m)): next(iter(m.values()))["usage"] for m in query["metrics"]}
                    rows = cur.fetchall()
                    for row in rows:
                        for column, value in zip(columns, row):
                            if usage[column] == "LABEL":
                                assert isinstance(value, str), (namespace, column, value)
                            else:
                                assert isinstance(value, (int, float)), (namespace, column, value)
                    results[namespace] = [dict(zip(columns, row)) for row in rows]

                backlog = {(r["topic"], r["state"], r["waiting_for"]): r
                           for r in results["wal_delivery_backlog"]}
                for key in ((relay_topic, "pending", "relay"), (proc_topic, "pending", "processor")):
                    assert key in backlog, f"{key} not in {sorted(backlog)}"
                    assert backlog[key]["records"] == 1 and backlog[key]["oldest_age_seconds"] >= 0
                config, = results["wal_delivery_config"]
                assert config["in_sync"] in (0, 1) and config["version"] >= config["published_version"]
                relay, = results["wal_delivery_relay"]
                assert relay["passes"] >= 0 and relay["lanes_read"] >= 0 and relay["possible_duplicates"] >= 0
                spans, = results["wal_delivery_relay_spans"]
                assert all(v >= 0 for v in spans.values()), spans
                query = queries["wal_delivery_reconcile"]["query"]
                wait_until(lambda: mon.execute(query).fetchone()[0] >= 1, 30,
                           what="the reconciler to report the topic Kafka cannot make")
                # Without its grant the query is refused: the grants above are what it uses.
                su.execute(f"REVOKE SELECT ON wal_delivery.backlog FROM {role}")
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    mon.execute(queries["wal_delivery_backlog"]["query"])
        finally:
            su.execute("DELETE FROM wal_delivery.outbox WHERE topic IN (%s, %s)", (relay_topic, proc_topic))
            su.execute("DELETE FROM wal_delivery.topics WHERE name IN (%s, %s)", (relay_topic, proc_topic))
            su.execute(f"DROP OWNED BY {role}")
            su.execute(f"DROP ROLE {role}")
