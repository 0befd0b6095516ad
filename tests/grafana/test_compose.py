"""compose.yaml: validated by `docker compose config` where Docker Compose v2 runs, and always against
the Compose Specification's JSON schema (vendored in compose_spec/) and by a structural check: the services, the GPU reservations, DESIGN.md's ports on loopback, bind mounts
that exist in the repo, the files the images COPY, and every `tailtrace` command line parsed by the
real CLI parser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"

# DESIGN.md's ports (plus the third-party services' usual ones), container port == host port
PORTS = {"vllm": [8000], "gateway": [8080], "collector": [4318, 4317, 9464], "dashboard": [8501],
         "prometheus": [9090], "grafana": [3000], "dcgm-exporter": [9400]}


def _interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` / `${VAR}` / `${VAR:?message}` (as if set, to "") / `$$` with an
    empty environment."""
    value = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)
    value = re.sub(r"\$\{[A-Z0-9_]+:\?[^}]*\}", "", value)
    value = re.sub(r"\$\{[A-Z0-9_]+\}", "", value)
    return value.replace("$$", "$")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # resolves the x-* anchors and `<<` merges


def _compose_v2() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        r = subprocess.run(cmd + ["version", "--short"], check=False, capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip().lstrip("v").startswith("2"):
            return cmd
    return None


def check_compose_config(compose: Path, env: dict | None = None) -> None:
    """`docker compose -f compose config --quiet` passes (with `env` added to the environment), or the
    test is skipped where no Docker Compose v2 runs."""
    cmd = _compose_v2()
    if cmd is None:
        pytest.skip("no Docker Compose v2 here (docker compose / docker-compose): the structural checks below run")
    full = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")} | (env or {})
    r = subprocess.run(cmd + ["-f", str(compose), "config", "--quiet"], check=False, capture_output=True, text=True,
                       env=full, cwd=compose.parent)
    assert r.returncode == 0, r.stderr


COMPOSE_SPEC = Path(__file__).parent / "compose_spec" / "compose-spec.json"
COMPOSE_SPEC_SHA256 = "46b7d35f19dd93a05f8fea530291bf84d881c1791ec167ecf0e6fb94e639d496"


def _interpolated(node):
    """`node` with every string interpolated as Compose does before it validates (`_interpolate`)."""
    if isinstance(node, dict):
        return {k: _interpolated(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolated(v) for v in node]
    return _interpolate(node) if isinstance(node, str) else node


def compose_schema_errors(doc: dict) -> list[str]:
    """The Compose Specification's JSON schema (vendored: compose_spec/README.md) errors of compose
    document `doc`, as read and interpolated: ["path: message", ...] ([] when valid)."""
    import hashlib

    import jsonschema

    text = COMPOSE_SPEC.read_bytes()
    assert hashlib.sha256(text).hexdigest() == COMPOSE_SPEC_SHA256, "compose_spec/compose-spec.json changed"
    validator = jsonschema.Draft7Validator(json.loads(text))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for d in (doc, _interpolated(doc)) for e in validator.iter_errors(d)]


def check_ports_and_mounts(doc: dict, name: str, ports: list[int], base: Path) -> None:
    """Service `name` of compose document `doc` publishes exactly `ports`, each on 127.0.0.1 with the
    same port inside, and its bind mounts (relative to `base`) and named volumes exist."""
    svc = doc["services"][name]
    published = []
    for p in svc.get("ports", []):
        host_ip, host_port, container_port = _interpolate(p).split(":")
        assert host_ip == "127.0.0.1", f"{name} publishes {p} beyond loopback"
        assert host_port == container_port
        published.append(int(host_port))
    assert published == ports, (name, published)
    for v in svc.get("volumes", []):
        src = _interpolate(v).split(":")[0]
        if src.startswith("./"):
            assert (base / src).exists(), f"{name} mounts {src}, missing in the repo"
        elif not src.startswith(("~", "/")):
            assert src in doc["volumes"], f"{name} uses undeclared volume {src}"


@pytest.mark.integration
def test_docker_compose_config_accepts_it():
    check_compose_config(COMPOSE)


def test_the_compose_specifications_schema_accepts_it():
    assert compose_schema_errors(_compose()) == []


def test_the_schema_check_finds_what_compose_would_refuse():
    """The check can fail: a misspelt key, a port that is not a list, a service without image or build's
    shape, a bad restart policy type — each is named with its path."""
    doc = _compose()
    doc["services"]["gateway"]["portz"] = ["127.0.0.1:8080:8080"]
    doc["services"]["dashboard"]["ports"] = 8501
    doc["services"]["collector"]["deploy"] = {"replicas": [2]}
    doc["volumes"] = ["not", "a", "map"]
    errors = compose_schema_errors(doc)
    assert any(e.startswith("services/gateway:") and "'portz'" in e for e in errors), errors
    assert any(e.startswith("services/dashboard/ports:") for e in errors), errors
    assert any(e.startswith("services/collector/deploy/replicas:") for e in errors), errors
    assert any(e.startswith("volumes:") for e in errors), errors


def test_services_ports_gpu_and_mounts():
    doc = _compose()
    services = doc["services"]
    assert set(services) == set(PORTS)
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        check_ports_and_mounts(doc, name, PORTS[name], ROOT)
    # the GPU is reserved for vLLM and dcgm-exporter
    for name in ("vllm", "dcgm-exporter"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), name
    # vLLM runs from the official image, with tailtrace installed into it
    vllm_build = services["vllm"]["build"]
    assert vllm_build["args"]["VLLM_IMAGE"].endswith(":-vllm/vllm-openai:v0.32.0}")
    assert "pip install" in vllm_build["dockerfile_inline"]


def check_images_copy_every_package(doc: dict) -> None:
    """Every image that installs tailtrace (`pip install .`) COPYs each package the distribution
    holds (pyproject's setuptools `include`): `collector` imports `semantics`, so an image without
    it fails at start."""
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    for name, svc in doc["services"].items():
        inline = (svc.get("build") or {}).get("dockerfile_inline", "")
        if not re.search(r"pip install [^\n]*['\" ]\.(\[|['\" ]|$)", inline, re.MULTILINE):
            continue
        copied = {src.strip("./") for line in inline.splitlines() if line.strip().startswith("COPY")
                  for src in line.split()[1:-1]}
        assert packages <= copied, f"{name}: the image does not COPY {sorted(packages - copied)}"


def test_images_copy_only_what_exists():
    for name, svc in _compose()["services"].items():
        build = svc.get("build")
        if not build:
            continue
        for line in build["dockerfile_inline"].splitlines():
            if line.strip().startswith("COPY"):
                for src in line.split()[1:-1]:
                    assert (ROOT / build["context"] / src).exists(), f"{name}: COPY {src}: missing in the repo"
    check_images_copy_every_package(_compose())


def test_tailtrace_command_lines_parse_with_the_real_cli():
    from tailtrace.cli import build_parser

    parser = build_parser()
    checked = 0
    for name, svc in _compose()["services"].items():
        argv = [_interpolate(a) for a in (svc.get("entrypoint") or []) + (svc.get("command") or [])]
        if not argv or argv[0] != "tailtrace":
            continue
        args = parser.parse_args(argv[1:])
        assert callable(getattr(args, "func", None)), name
        host = getattr(args, "host", None)
        assert host == "0.0.0.0", f"{name} must bind 0.0.0.0 inside its container"
        checked += 1
    assert checked == 4  # vllm (serve), gateway, collector, dashboard


def test_prometheus_and_grafana_point_at_the_services():
    doc = _compose()
    services = doc["services"]
    prom_cfg = yaml.safe_load((ROOT / "grafana/prometheus/prometheus.yml").read_text())
    targets = {t for job in prom_cfg["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    for target in targets - {"localhost:9090"}:
        host, port = target.split(":")
        assert host in services and int(port) in PORTS[host], target
    assert {"collector:9464", "vllm:8000", "dcgm-exporter:9400"} <= targets
    mounts = dict(_interpolate(v).split(":")[:2] for v in services["grafana"]["volumes"] if v.startswith("./"))
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/tailtrace.yaml").read_text())
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/tailtrace.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prom_mounts = dict(_interpolate(v).split(":")[:2] for v in services["prometheus"]["volumes"])
    assert prom_mounts["./grafana/prometheus"] == "/etc/prometheus"
    assert prom_cfg["rule_files"] == ["rules.yml"]  # beside prometheus.yml in /etc/prometheus
