"""deploy/fleet/compose.yaml (no Docker here): `docker compose config` where Compose v2 runs, and
always the Compose Specification's JSON schema and the structural checks of tests/grafana/test_compose.py: services and pinned images, ports on
loopback, bind mounts that exist, the files the images COPY, every `tailtrace` command line parsed by
the real CLI parser; then the wiring: vLLM scalable behind one name that the gateway resolves, the
collector-contrib's ClickHouse exporter (create_schema false, batching, retry, sending queue) on the
database `clickhouse init` creates, `tailtrace metrics` on it, Grafana with grafana-clickhouse-datasource and the generated rules."""

from __future__ import annotations

import re

import pytest
import yaml
from test_compose import (
    ROOT,
    _interpolate,
    check_compose_config,
    check_images_copy_every_package,
    check_ports_and_mounts,
    compose_schema_errors,
)

FLEET = ROOT / "deploy" / "fleet"
COMPOSE = FLEET / "compose.yaml"
PORTS = {"vllm": [], "gateway": [8080], "otel-collector": [4318, 4317], "clickhouse": [8123, 9000],
         "clickhouse-init": [], "tailtrace-metrics": [9465], "dashboard": [8501], "grafana": [3000]}
ENV = {"CLICKHOUSE_PASSWORD": "p", "CLICKHOUSE_READER_PASSWORD": "r"}


def _doc() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _argv(svc) -> list[str]:
    return [_interpolate(a) for a in (svc.get("entrypoint") or []) + (svc.get("command") or [])]


@pytest.mark.integration
def test_docker_compose_config_accepts_it():
    check_compose_config(COMPOSE, ENV)


def test_the_compose_specifications_schema_accepts_it():
    assert compose_schema_errors(_doc()) == []


def test_services_images_ports_and_mounts():
    doc = _doc()
    check_images_copy_every_package(doc)
    services = doc["services"]
    assert set(services) == set(PORTS)
    for name, svc in services.items():
        image = _interpolate(svc["image"])
        if "build" not in svc:   # third-party images are pinned to a release
            assert re.search(r":\d+(\.\d+)+$", image), f"{name}: {image} is not pinned"
        check_ports_and_mounts(doc, name, PORTS[name], FLEET)
        build = svc.get("build")
        if build:
            ctx = (FLEET / build["context"]).resolve()
            assert ctx == ROOT
            for line in build["dockerfile_inline"].splitlines():
                if line.strip().startswith("COPY"):
                    for src in line.split()[1:-1]:
                        assert (ctx / src).exists(), f"{name}: COPY {src}: missing in the repo"
            # every package the distribution ships is in the image (semantics: the catalog)
            if "pip install" in build["dockerfile_inline"]:
                assert "COPY semantics ./semantics" in build["dockerfile_inline"], name
    # vLLM: N replicas on the GPU, no host port, no fixed name (so `--scale vllm=N` works)
    vllm = services["vllm"]
    assert "container_name" not in vllm and "ports" not in vllm
    assert int(_interpolate(str(vllm["deploy"]["replicas"]))) >= 2
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)


def test_tailtrace_command_lines_parse_and_wire_the_services():
    from tailtrace.cli import build_parser
    from tailtrace.collector.clickhouse.store_url import parse_store_url

    services = _doc()["services"]
    parser = build_parser()
    parsed = {}
    for name, svc in services.items():
        argv = _argv(svc)
        if argv and argv[0] == "tailtrace":
            parsed[name] = parser.parse_args(argv[1:])
            assert callable(getattr(parsed[name], "func", None)), name
    assert set(parsed) == {"vllm", "gateway", "clickhouse-init", "tailtrace-metrics", "dashboard"}
    # the gateway resolves every address of the vLLM service's name, on vLLM's port
    gw = parsed["gateway"]
    assert gw.host == "0.0.0.0" and gw.upstream_dns == "http://vllm:8000" and not gw.upstreams
    assert "--port=8000" in _argv(services["vllm"])
    # every layer sends OTLP to the collector-contrib
    for name in ("vllm", "gateway"):
        assert "--otlp-endpoint=http://otel-collector:4318" in _argv(services[name]), name
    # init creates the schema in the database the exporter writes, before the exporter starts
    store = parse_store_url(parsed["clickhouse-init"].url)
    assert (store.kind, store.host, store.port, store.database) == ("clickhouse", "clickhouse", 8123, "otel")
    assert services["otel-collector"]["depends_on"]["clickhouse-init"]["condition"] == "service_completed_successfully"
    assert services["clickhouse-init"]["depends_on"]["clickhouse"]["condition"] == "service_healthy"
    # the Prometheus exporter reads the same database, once its schema is there
    metrics = parsed["tailtrace-metrics"]
    assert metrics.host == "0.0.0.0" and f"--port={metrics.port}" in _argv(services["tailtrace-metrics"])
    assert parse_store_url(metrics.store).database == store.database and parse_store_url(metrics.store).host == "clickhouse"
    assert services["tailtrace-metrics"]["depends_on"]["clickhouse-init"]["condition"] == \
        "service_completed_successfully"
    # so do the dashboard and the exporter, as the read-only reader (its profile lets the guard set its limits)
    for name in ("dashboard", "tailtrace-metrics"):
        url = parse_store_url(parsed[name].store)
        assert (url.host, url.database) == ("clickhouse", store.database), name
        assert _interpolate(parsed[name].store).startswith("clickhouse://tailtrace_reader:"), name
        assert services[name]["depends_on"]["clickhouse-init"]["condition"] == "service_completed_successfully"
    assert parsed["dashboard"].host == "0.0.0.0" and f"--port={parsed['dashboard'].port}" in _argv(services["dashboard"])


def test_collector_contrib_exports_to_clickhouse_as_tailtrace_reads_it():
    from tailtrace.collector.clickhouse.exporter_schema import METRIC_TABLES, TRACES_TABLE

    cfg = yaml.safe_load((FLEET / "otel-collector.yaml").read_text())
    ch = cfg["exporters"]["clickhouse"]
    assert ch["create_schema"] is False
    assert ch["endpoint"].startswith("tcp://clickhouse:9000") and ch["database"] == "otel"
    assert ch["traces_table_name"] == TRACES_TABLE
    assert set(ch["metrics_tables"].values()) == set(METRIC_TABLES)
    assert ch["sending_queue"]["enabled"] is True and ch["sending_queue"]["queue_size"] > 0
    assert ch["retry_on_failure"]["enabled"] is True
    assert cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    for kind in ("traces", "metrics"):
        pipe = cfg["service"]["pipelines"][kind]
        assert pipe["exporters"] == ["clickhouse"] and pipe["processors"][-1] == "batch"
        assert pipe["processors"][0] == "memory_limiter"
    # the password is the compose environment's, never written in the file
    assert ch["password"] == "${env:CLICKHOUSE_PASSWORD}"
    assert "CLICKHOUSE_PASSWORD" in _doc()["services"]["otel-collector"]["environment"]


def test_grafana_has_the_clickhouse_plugin_datasource_and_rules():
    services = _doc()["services"]
    g = services["grafana"]
    plugin, version = g["environment"]["GF_INSTALL_PLUGINS"].split()
    assert plugin == "grafana-clickhouse-datasource" and re.fullmatch(r"\d+\.\d+\.\d+", version)
    mounts = dict(_interpolate(v).split(":")[:2] for v in g["volumes"] if v.startswith("./"))
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    # the dashboard provider's folder holds the generated ClickHouse dashboard
    provider = yaml.safe_load((FLEET / "grafana/provisioning/dashboards/tailtrace.yaml").read_text())["providers"][0]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert (FLEET / "grafana/dashboards/tailtrace-clickhouse.json").is_file()
    ds = yaml.safe_load((FLEET / "grafana/provisioning/datasources/clickhouse.yaml").read_text())["datasources"][0]
    assert ds["type"] == plugin and ds["jsonData"]["host"] == "clickhouse" and ds["jsonData"]["port"] == 9000
    assert ds["jsonData"]["defaultDatabase"] == "otel"
    # the reader is read-only, declared in the server's users.d, its password from the same variable
    users = (FLEET / "clickhouse/users.d/tailtrace.xml").read_text()
    assert f"<{ds['jsonData']['username']}>" in users and "<readonly>1</readonly>" in users
    assert ds["secureJsonData"]["password"] == "${CLICKHOUSE_READER_PASSWORD}"
    assert "CLICKHOUSE_READER_PASSWORD" in g["environment"] and "CLICKHOUSE_READER_PASSWORD" in \
        services["clickhouse"]["environment"]
    rules = yaml.safe_load((FLEET / "grafana/provisioning/alerting/tailtrace-clickhouse.yaml").read_text())
    sources = {q["datasourceUid"] for r in rules["groups"][0]["rules"] for q in r["data"]} - {"__expr__"}
    assert sources == {ds["uid"]}


def test_the_reader_may_set_every_guard_of_tailtraces_reads():
    """A readonly=1 user may change no setting without a changeable_in_readonly constraint, and those
    need settings_constraints_replace_previous in the server's config (ClickHouse's docs): the
    reader's profile gives one to each setting the guarded read sends (tests/clickhouse/
    test_readonly_user.py shows what a reader without them meets), and the server mounts both files."""
    import xml.etree.ElementTree as ET

    from tailtrace.collector.clickhouse.query import GUARD_SETTINGS

    users = ET.parse(FLEET / "clickhouse/users.d/tailtrace.xml").getroot()
    profile = users.find("profiles/tailtrace_readonly")
    assert profile.findtext("readonly") == "1"
    changeable = {c.tag for c in profile.find("constraints") if c.find("changeable_in_readonly") is not None}
    assert changeable == set(GUARD_SETTINGS) - {"readonly"}, changeable
    config = ET.parse(FLEET / "clickhouse/config.d/tailtrace.xml").getroot()
    assert config.findtext("access_control_improvements/settings_constraints_replace_previous") == "true"
    mounts = {v.split(":")[1] for v in _doc()["services"]["clickhouse"]["volumes"] if v.startswith("./")}
    assert {"/etc/clickhouse-server/users.d/tailtrace.xml", "/etc/clickhouse-server/config.d/tailtrace.xml"} <= mounts
