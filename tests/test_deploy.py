"""deploy/: what an operator copies, checked as far as this machine can run it.

The container engine does not run here, so the files are checked for what
they claim: they parse (YAML, the Dockerfile's instructions, the systemd
unit, ``nginx -t``); every ``AGUI_HUB_*`` variable they name is a setting and
every environment they give a gateway is accepted by
:meth:`GatewayConfig.from_env`; ports agree; probes and health checks get 200
from a real gateway; every Redis they run keeps acknowledged events (AOF,
``noeviction``: the Redis configurations are started with redis-server and
asked by the store itself); grace periods outlast a drain. Then the topology
runs with real processes on loopback (tests/topology.py): Redis from
deploy/redis.conf, two gateways with the Compose file's settings, nginx from
deploy/nginx/agui-hub.conf in front, and a viewer behind nginx that loses
its gateway to SIGKILL mid-run and still ends with every event exactly once,
in order.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from agui_hub.cli.demo import demo_run
from agui_hub.client.hub_client import HubClient, Snapshot, Subscribed, ThreadEvent
from agui_hub.client.publisher import Publisher
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.config import GatewayConfig, is_loopback, setting_kinds, unknown_variables
from agui_hub.gateway.workers import STOP_TIMEOUT
from agui_hub.store import open_store
from agui_hub.store.urls import parse_store_url

from .conftest import TIMEOUT_SCALE
from .processes import ROOT, GatewayProcess, Gateways, child_env, http_status
from .topology import (
    DEPLOY,
    NGINX_CONF,
    REDIS_CONF,
    DeployRedis,
    Nginx,
    nginx_binary,
    nginx_command,
    upstream_servers,
    write_nginx_config,
)

KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"
UNIT = DEPLOY / "systemd" / "agui-hub.service"
UNIT_ENV = DEPLOY / "systemd" / "env"
GATEWAY_SERVICES = ("gateway-1", "gateway-2")
VARIABLE = re.compile(r"\bAGUI_HUB_[A-Z0-9_]*[A-Z0-9]\b")


def deploy_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file())


def yaml_files() -> list[Path]:
    return [p for p in deploy_files() if p.suffix in (".yml", ".yaml")]


# -- the Dockerfile --------------------------------------------------------------------------

DOCKERFILE_INSTRUCTIONS = frozenset(
    {
        "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK",
        "LABEL", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Instruction:
    line: int
    name: str
    args: str

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form instruction (fails the test otherwise)."""
        text = self.args.removeprefix("CMD").strip() if self.name == "HEALTHCHECK" else self.args
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            pytest.fail(f"Dockerfile line {self.line}: {self.name} is not in exec form: {text}")
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), value
        return value


def parse_dockerfile(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, continuation lines joined, comments and
    parser directives dropped. Fails on a line that is no known instruction."""
    instructions: list[Instruction] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (pending is None and not stripped):
            continue  # comments may sit between continuation lines too
        body = raw.rstrip()
        continued = body.endswith("\\")
        body = body[:-1] if continued else body
        pending = (
            (number, body) if pending is None else (pending[0], f"{pending[1]} {body.strip()}")
        )
        if not continued:
            line, full = pending
            pending = None
            name, _, args = full.strip().partition(" ")
            assert name in DOCKERFILE_INSTRUCTIONS, f"Dockerfile line {line}: unknown {name!r}"
            instructions.append(Instruction(line, name, args.strip()))
    assert pending is None, "the Dockerfile ends inside a continued line"
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [i for i, ins in enumerate(instructions) if ins.name == "FROM"]
    assert starts, "no FROM"
    return instructions[starts[-1] :]


def image_environment() -> dict[str, str]:
    """The ``ENV`` of the image's final stage."""
    env: dict[str, str] = {}
    for ins in final_stage(parse_dockerfile(DOCKERFILE.read_text())):
        if ins.name == "ENV":
            for item in shlex.split(ins.args):
                name, sep, value = item.partition("=")
                assert sep, f"ENV {item!r}: use the NAME=value form"
                env[name] = value
    return env


def healthcheck_command() -> list[str]:
    (check,) = [
        ins for ins in final_stage(parse_dockerfile(DOCKERFILE.read_text()))
        if ins.name == "HEALTHCHECK"
    ]  # fmt: skip
    options, _, command = check.args.partition("CMD ")
    assert re.fullmatch(r"(--[a-z-]+=\S+\s*)*", options), f"HEALTHCHECK options: {options!r}"
    return Instruction(check.line, "CMD", command).exec_form()


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether BuildKit leaves *path* (relative to the context) out, by its
    rules: a path is out when it or a parent directory matches a pattern, the
    last matching pattern wins, ``!`` re-includes, ``**`` spans directories."""

    def regex(pattern: str) -> re.Pattern[str]:
        parts = re.split(r"(\*\*/?|\*|\?)", pattern.strip("/"))
        out = "".join(
            ".*" if p in ("**", "**/") else "[^/]*" if p == "*" else "[^/]" if p == "?"
            else re.escape(p)
            for p in parts
        )  # fmt: skip
        return re.compile(out)

    components = path.split("/")
    prefixes = ["/".join(components[: i + 1]) for i in range(len(components))]
    excluded = False
    for raw in patterns:
        negated = raw.startswith("!")
        pattern = raw[1:] if negated else raw
        if any(regex(pattern).fullmatch(prefix) for prefix in prefixes):
            excluded = not negated
    return excluded


def test_dockerfile_is_well_formed_and_runs_the_gateway_as_non_root() -> None:
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    first = next(ins for ins in instructions if ins.name != "ARG")
    assert first.name == "FROM", "the first instruction after ARGs must be FROM"
    for ins in instructions:
        if ins.name == "FROM":
            image = ins.args.split()[0]
            assert re.fullmatch(r"python:(3\.1[1-9]|\$\{PYTHON_VERSION\})-slim", image), image
    arg = next(ins for ins in instructions if ins.name == "ARG")
    assert re.fullmatch(r"PYTHON_VERSION=3\.1[1-9]", arg.args), arg

    final = final_stage(instructions)
    names = [ins.name for ins in final]
    for needed in ("USER", "HEALTHCHECK", "EXPOSE", "ENTRYPOINT", "CMD"):
        assert needed in names, f"the image's stage has no {needed}"
    user = [ins for ins in final if ins.name == "USER"][-1].args.split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), (
        f"USER {user}: a numeric non-root user (Kubernetes' runAsNonRoot checks the number)"
    )
    (entrypoint,) = [ins.exec_form() for ins in final if ins.name == "ENTRYPOINT"]
    assert entrypoint == ["agui-hub"]
    (command,) = [ins.exec_form() for ins in final if ins.name == "CMD"]
    assert command[0] == "serve", command
    env = image_environment()
    assert env["AGUI_HUB_HOST"] == "0.0.0.0"
    (expose,) = [ins.args for ins in final if ins.name == "EXPOSE"]
    assert expose.split("/")[0] == env["AGUI_HUB_PORT"], (expose, env)

    # The package is installed with the redis extra, from what the context holds.
    runs = " ".join(ins.args for ins in instructions if ins.name == "RUN")
    assert 'install ".[redis]"' in runs, runs
    copied = [
        ins.args.split()[:-1] for ins in instructions
        if ins.name == "COPY" and not ins.args.startswith("--from")
    ]  # fmt: skip
    sources = [source for sources in copied for source in sources]
    assert {"pyproject.toml", "agui_hub"} <= set(sources), sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"


def test_the_build_context_keeps_what_the_image_is_built_from() -> None:
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]  # fmt: skip
    package = [
        str(p.relative_to(ROOT)) for p in (ROOT / "agui_hub").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]  # fmt: skip
    assert "agui_hub/static/index.html" in package
    for path in ["pyproject.toml", "README.md", *package]:
        assert not dockerignore_excludes(path, patterns), f"{path} would be left out"
    for path in [
        ".git/config",
        "tests/test_deploy.py",
        "js/node_modules/x",
        ".venv/bin/python",
        "agui_hub/__pycache__/cli.cpython-312.pyc",
        "deploy/secrets/jwt-secret",
    ]:
        assert dockerignore_excludes(path, patterns), f"{path} would be sent to the builder"


# -- YAML: Compose and Kubernetes -----------------------------------------------------------


def test_every_yaml_file_parses() -> None:
    files = yaml_files()
    assert COMPOSE in files and len(files) >= 8, files
    for path in files:
        documents = list(yaml.safe_load_all(path.read_text()))
        assert documents and all(isinstance(d, dict) for d in documents), path
        if path.parent == KUBERNETES and path.name != "kustomization.yaml":
            for document in documents:
                assert {"apiVersion", "kind", "metadata"} <= document.keys(), (path, document)
                assert document["metadata"].get("name"), (path, document)


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    """A Compose service's ``environment`` (map or list form) as strings."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def kubernetes() -> dict[tuple[str, str], dict[str, Any]]:
    """Every Kubernetes object of deploy/kubernetes by (kind, name)."""
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            key = (document["kind"], document["metadata"]["name"])
            assert key not in objects, f"{key} twice"
            objects[key] = document
    return objects


def gateway_container() -> dict[str, Any]:
    deployment = kubernetes()["Deployment", "agui-hub"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def kubernetes_environment() -> dict[str, str]:
    """What a gateway pod sees: the image's ENV, the ConfigMap, the container's env."""
    objects = kubernetes()
    container = gateway_container()
    env = dict(image_environment())
    for source in container.get("envFrom", []):
        data = objects["ConfigMap", source["configMapRef"]["name"]]["data"]
        env.update({k: str(v) for k, v in data.items()})
    for item in container.get("env", []):
        env[item["name"]] = str(item["value"])
    return env


def compose_environment(service: str = "gateway-1") -> dict[str, str]:
    """What a Compose gateway sees: the image's ENV and the service's environment."""
    return {**image_environment(), **environment_of(compose()["services"][service])}


def unit_environment() -> dict[str, str]:
    """The variables of deploy/systemd/env, read as systemd's EnvironmentFile= does."""
    env: dict[str, str] = {}
    for number, raw in enumerate(UNIT_ENV.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), f"env line {number}: {raw!r}"
        env[name] = value.strip().strip("\"'")
    return env


def environments() -> dict[str, dict[str, str]]:
    return {
        **{f"compose {name}": compose_environment(name) for name in GATEWAY_SERVICES},
        "kubernetes": kubernetes_environment(),
        "systemd": unit_environment(),
        "image": image_environment(),
    }


# -- settings ----------------------------------------------------------------------------------


def test_every_agui_hub_variable_in_deploy_is_a_setting() -> None:
    named: dict[str, set[str]] = {}
    for path in deploy_files():
        for name in VARIABLE.findall(path.read_text()):
            named.setdefault(name, set()).add(str(path.relative_to(DEPLOY)))
    assert len(named) >= 8, named
    unknown = unknown_variables(dict.fromkeys(named, ""))
    assert not unknown, {name: sorted(named[name]) for name in unknown}


def test_every_gateway_environment_in_deploy_is_accepted() -> None:
    settings = {f"AGUI_HUB_{name.upper()}" for name in setting_kinds()}
    for where, env in environments().items():
        variables = {k: v for k, v in env.items() if k.startswith("AGUI_HUB_")}
        assert variables, where
        assert not unknown_variables(variables), (where, unknown_variables(variables))
        assert set(variables) <= settings, (where, set(variables) - settings)
        config = GatewayConfig.from_env(environ=variables)  # ValueError: a bad value
        config.check_processes()
        assert config.host == "0.0.0.0" and config.port == 8765, (where, config)
        if where == "image":
            continue  # the image alone: the memory store, no key (it refuses to serve so)
        parsed = parse_store_url(config.store)
        assert parsed.scheme == "redis", (where, config.store)
        assert config.require_durable_store, f"{where}: AGUI_HUB_REQUIRE_DURABLE_STORE"
        # A public address needs authentication, or the gateway refuses to start.
        assert not is_loopback(config.host) and config.jwt_configured, where
        # Behind a balancer every connection comes from the balancer's address
        # (the VM's gateway serves its clients directly).
        if where != "systemd":
            assert config.max_connections_per_address >= config.max_connections, where
    compose_store = urlsplit(compose_environment()["AGUI_HUB_STORE"])
    assert compose_store.hostname == "redis" and "redis" in compose()["services"]


# -- ports, probes, health checks ---------------------------------------------------------------


def probe_paths() -> dict[str, str]:
    """Every HTTP path a health check in deploy/ asks for, by where it is."""
    paths = {}
    code = healthcheck_command()[-1]
    assert "http://127.0.0.1:" in code, code
    (paths["Dockerfile HEALTHCHECK"],) = re.findall(r"'(/[^']*)'", code)
    container = gateway_container()
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        paths[f"kubernetes {probe}"] = container[probe]["httpGet"]["path"]
    return paths


def test_probes_are_the_documented_ones_and_ports_agree() -> None:
    paths = probe_paths()
    assert paths["kubernetes readinessProbe"] == "/readyz"
    assert paths["kubernetes livenessProbe"] == "/healthz"
    assert " + '/healthz'" in " ".join(healthcheck_command())

    port = int(image_environment()["AGUI_HUB_PORT"])
    assert port == GatewayConfig().port == 8765
    container = gateway_container()
    (container_port,) = container["ports"]
    assert container_port["containerPort"] == int(kubernetes_environment()["AGUI_HUB_PORT"])
    assert container_port["containerPort"] == port
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == container_port["name"], probe
    objects = kubernetes()
    service = objects["Service", "agui-hub"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == container_port["name"]
    ingress = objects["Ingress", "agui-hub"]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "agui-hub", "port": {"name": service_port["name"]}}
    assert int(unit_environment()["AGUI_HUB_PORT"]) == port
    for name in GATEWAY_SERVICES:
        assert int(compose_environment(name).get("AGUI_HUB_PORT", port)) == port
    # nginx's upstreams are the Compose gateways, on the gateways' port.
    servers = upstream_servers(NGINX_CONF.read_text())
    assert servers == [f"{name}:{port}" for name in GATEWAY_SERVICES], servers
    (listen,) = re.findall(r"^\s*listen\s+(\d+);", NGINX_CONF.read_text(), re.MULTILINE)
    published = compose()["services"]["nginx"]["ports"]
    assert published == [f"{listen}:{listen}"], published


@pytest.fixture
def deploy_redis(tmp_path: Path) -> Iterator[DeployRedis]:
    """redis-server running deploy/redis.conf (its address and directory replaced)."""
    server = DeployRedis(tmp_path / "redis", REDIS_CONF.read_text())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def jwt_secret(directory: Path) -> Path:
    path = directory / "jwt-secret"
    path.write_text(base64.b64encode(secrets.token_bytes(48)).decode() + "\n")
    return path


def start_deployed_gateway(
    gateways: Gateways, env: Mapping[str, str], store: str, secret: Path
) -> GatewayProcess:
    """A gateway with a deploy file's settings on loopback: its store and key
    file replaced by the test's, its address by the test's flags."""
    settings = {k: v for k, v in env.items() if k.startswith("AGUI_HUB_")}
    for name in ("AGUI_HUB_HOST", "AGUI_HUB_PORT"):
        settings.pop(name, None)  # the fixture's --host 127.0.0.1 --port N
    settings["AGUI_HUB_STORE"] = store
    settings["AGUI_HUB_JWT_SECRET_FILE"] = str(secret)
    gateway = gateways.start(store, env=settings)
    assert "is not a setting" not in gateway.log(), gateway.log()
    return gateway


def without_proxies(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.lower().endswith("_proxy")}


def test_probes_and_health_checks_answer_200_from_a_real_gateway(
    gateways: Gateways, deploy_redis: DeployRedis, tmp_path: Path
) -> None:
    gateway = start_deployed_gateway(
        gateways, kubernetes_environment(), deploy_redis.url, jwt_secret(tmp_path)
    )
    for where, path in probe_paths().items():
        assert http_status(gateway.port, path, timeout=2) == 200, (where, path, gateway.log())
    with urllib.request.urlopen(f"http://127.0.0.1:{gateway.port}/readyz", timeout=2) as answer:
        body = answer.read().decode()
    assert body == "ready\n", body  # and no warning: deploy/redis.conf keeps events

    # The image's HEALTHCHECK command itself, with the gateway's port as the image's.
    command = healthcheck_command()
    assert command[0] == "python"
    env = without_proxies(child_env())
    env["AGUI_HUB_PORT"] = str(gateway.port)
    done = subprocess.run([sys.executable, *command[1:]], env=env, timeout=10, check=False)
    assert done.returncode == 0
    gateway.kill()  # nothing answers there any more: the check must fail
    done = subprocess.run(
        [sys.executable, *command[1:]], env=env, timeout=10, capture_output=True, check=False
    )
    assert done.returncode != 0 and b"Connection refused" in done.stderr, done


# -- Redis: AOF and noeviction everywhere ---------------------------------------------------------


def redis_directives(conf: str) -> dict[str, str]:
    """The directives of a redis.conf (the last one of each name wins, as in Redis)."""
    directives = {}
    for raw in conf.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            directives[name.lower()] = value.strip()
    return directives


def assert_durable(directives: Mapping[str, str], where: str) -> None:
    assert directives.get("appendonly") == "yes", f"{where}: appendonly yes"
    assert directives.get("appendfsync") in ("everysec", "always"), f"{where}: appendfsync"
    assert directives.get("maxmemory-policy") == "noeviction", f"{where}: noeviction"


def assert_flags_keep_durability(command: list[str], where: str) -> None:
    """Flags on a redis-server command line override its file: none may undo AOF."""
    for flag, allowed in (
        ("--appendonly", {"yes"}),
        ("--appendfsync", {"everysec", "always"}),
        ("--maxmemory-policy", {"noeviction"}),
    ):
        if flag in command:
            assert command[command.index(flag) + 1] in allowed, f"{where}: {flag}"


def kubernetes_redis_conf() -> str:
    conf = kubernetes()["ConfigMap", "agui-hub-redis"]["data"]["redis.conf"]
    assert isinstance(conf, str)
    return conf


def test_every_redis_in_deploy_runs_with_aof_and_noeviction() -> None:
    assert_durable(redis_directives(REDIS_CONF.read_text()), "deploy/redis.conf")

    # Compose: each Redis service runs a mounted file that is durable.
    redis_services = {
        name: service for name, service in compose()["services"].items()
        if str(service.get("image", "")).startswith("redis")
    }  # fmt: skip
    assert list(redis_services) == ["redis"]
    for name, service in redis_services.items():
        command = service["command"]
        assert command[0] == "redis-server", command
        assert_flags_keep_durability(command, f"compose {name}")
        mounts = dict(volume.split(":")[:2][::-1] for volume in service["volumes"])
        source = DEPLOY / mounts[command[1]]
        assert source.resolve() == REDIS_CONF.resolve(), source
        assert_durable(redis_directives(source.read_text()), f"compose {name}")

    # Kubernetes: each Redis container runs the ConfigMap's file.
    objects = kubernetes()
    containers = [
        (key, container, obj["spec"]["template"]["spec"])
        for key, obj in objects.items() if key[0] in ("Deployment", "StatefulSet")
        for container in obj["spec"]["template"]["spec"]["containers"]
        if container["image"].startswith("redis")
    ]  # fmt: skip
    assert len(containers) == 1
    for key, container, pod in containers:
        command = container.get("command", []) + container.get("args", [])
        assert command[:1] == ["redis-server"], command
        assert_flags_keep_durability(command, str(key))
        mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        (volume,) = [name for name, path in mounted.items() if command[1].startswith(path + "/")]
        config_map = objects["ConfigMap", volumes[volume]["configMap"]["name"]]
        conf = config_map["data"][command[1].rsplit("/", 1)[1]]
        assert_durable(redis_directives(conf), str(key))
    # The same settings as deploy/redis.conf, which explains them.
    assert redis_directives(kubernetes_redis_conf()) == redis_directives(REDIS_CONF.read_text())

    # Nothing in deploy/ starts a Redis some other way.
    for path in deploy_files():
        for line in path.read_text().splitlines():
            if "redis-server --" in line:
                assert_flags_keep_durability(shlex.split(line.strip(" #-")), str(path))


@pytest.mark.parametrize("which", ["deploy/redis.conf", "kubernetes ConfigMap"])
async def test_redis_from_the_deploy_configuration_keeps_acknowledged_events(
    which: str, tmp_path: Path
) -> None:
    """redis-server 7 accepts the file, and the store's own check finds nothing to warn about."""
    conf = REDIS_CONF.read_text() if which == "deploy/redis.conf" else kubernetes_redis_conf()
    server = DeployRedis(tmp_path / "redis", conf)
    server.start()
    try:
        store = open_store(server.url)
        try:
            assert await store.durability_warnings() == []
        finally:
            await store.close()
    finally:
        server.stop()


# -- grace periods outlast a drain -------------------------------------------------------------


def seconds(value: str | int) -> float:
    """A systemd or Compose duration (``45``, ``45s``, ``1min``, ``1m30s``) in seconds."""
    text = str(value).strip()
    if text.isdigit():
        return float(text)
    units = {"min": 60, "m": 60, "s": 1, "h": 3600, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|min|h|m|s)", text)
    assert parts and "".join(f"{n}{u}" for n, u in parts) == text.replace(" ", ""), text
    return sum(float(n) * units[u] for n, u in parts)


def test_grace_periods_outlast_the_drain() -> None:
    # A gateway's drain is bounded by about 20 s; `serve --workers N` gives its
    # workers STOP_TIMEOUT (30 s) before it kills them: the longest stop there is.
    drain = STOP_TIMEOUT
    assert drain == 30.0
    pod = kubernetes()["Deployment", "agui-hub"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep", pre_stop
    assert pod["terminationGracePeriodSeconds"] > drain + float(pre_stop[1]), pod
    unit = parse_unit(UNIT.read_text())
    assert seconds(unit["Service"]["TimeoutStopSec"]) > drain
    for name in GATEWAY_SERVICES:
        assert seconds(compose()["services"][name]["stop_grace_period"]) > drain


# -- the systemd unit ------------------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, dict[str, str]]:
    """A systemd unit file: {section: {key: value}}; a key given twice keeps the last."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = re.fullmatch(r"\[([A-Za-z]+)\]", line)
        if header:
            assert header.group(1) not in sections, f"line {number}: [{header.group(1)}] twice"
            current = sections[header.group(1)] = {}
            continue
        key, sep, value = line.partition("=")
        assert current is not None and sep, f"line {number}: not Key=value in a section: {raw!r}"
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key.strip()), f"line {number}: {key!r}"
        current[key.strip()] = value.strip()
    return sections


def test_systemd_unit_has_what_a_vm_needs() -> None:
    unit = parse_unit(UNIT.read_text())
    assert set(unit) == {"Unit", "Service", "Install"}
    assert unit["Unit"]["Description"]
    service = unit["Service"]
    required = {
        "EnvironmentFile": "/etc/agui-hub/env",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "Restart": "on-failure",
        "KillMode": "mixed",
        "User": "agui-hub",
    }
    for key, value in required.items():
        assert service.get(key) == value, f"{key}={service.get(key)}"
    assert service["ExecStart"].split()[1:] == ["serve"]
    assert service["ExecStart"].startswith("/"), "systemd wants an absolute path"
    assert int(service["LimitNOFILE"]) >= 65536
    # The settings file: only settings, and every AGUI_HUB_CONNECTIONS fits the limit.
    config = GatewayConfig.from_env(environ=unit_environment())
    assert config.max_connections < int(service["LimitNOFILE"])
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd's own parser warns about every unknown key or bad value."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing: apt-get install systemd (optional check)")
    # `verify` wants ExecStart to exist: the installed gateway's path is not here.
    unit = tmp_path / "agui-hub.service"
    text = UNIT.read_text()
    unit.write_text(text.replace("/opt/agui-hub/bin/agui-hub", sys.executable, 1))
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0 and "agui-hub.service" not in output:
        pytest.skip(f"systemd-analyze cannot run here: {output}")
    assert done.returncode == 0 and not output, output


# -- nginx -------------------------------------------------------------------------------------


def test_nginx_config_proxies_websockets_with_timeouts_past_the_keepalive() -> None:
    conf = NGINX_CONF.read_text()
    directives = {
        " ".join(line.split()).rstrip(";")
        for line in conf.splitlines()
        if line.strip() and not line.strip().startswith("#")
    }
    for needed in (
        "proxy_http_version 1.1",
        "proxy_set_header Upgrade $http_upgrade",
        "proxy_set_header Connection $connection_upgrade",
        "map $http_upgrade $connection_upgrade {",
        "proxy_pass http://agui_hub",
        "least_conn",
    ):
        assert needed in directives, needed
    (next_upstream,) = re.findall(r"^\s*proxy_next_upstream\s+([^;]+);", conf, re.MULTILINE)
    assert {"error", "timeout", "http_503"} <= set(next_upstream.split()), next_upstream
    for server in re.findall(r"^\s*server\s+\S+:\d+\s+([^;]*);", conf, re.MULTILINE):
        assert "max_fails=" in server and "fail_timeout=" in server, server
    # A quiet WebSocket carries a ping every ping_interval, answered within
    # ping_timeout: nginx must wait longer before it closes it.
    for where, env in environments().items():
        config = GatewayConfig.from_env(environ=env)
        assert config.ping_interval is not None and config.ping_timeout is not None, where
        keepalive = config.ping_interval + config.ping_timeout
        for name in ("proxy_read_timeout", "proxy_send_timeout"):
            (value,) = re.findall(rf"^\s*{name}\s+([^;]+);", conf, re.MULTILINE)
            assert seconds(value) > keepalive, (where, name, value, keepalive)
        annotations = kubernetes()["Ingress", "agui-hub"]["metadata"]["annotations"]
        timeout = annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]
        assert seconds(timeout) > keepalive, (where, timeout)


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    binary = nginx_binary()
    conf = write_nginx_config(tmp_path, 18080, [18765, 18766], binary)
    done = subprocess.run(
        nginx_command(binary, tmp_path, conf, "-t"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    output = done.stdout + done.stderr + (tmp_path / "error.log").read_text(errors="replace")
    assert done.returncode == 0, output
    assert "syntax is ok" in output and "test is successful" in output, output
    assert "[warn]" not in output and "[emerg]" not in output, output


# -- Kubernetes --------------------------------------------------------------------------------


def test_kubernetes_objects_fit_together() -> None:
    objects = kubernetes()
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present, (listed, present)
    (image,) = kustomization["images"]
    assert image["name"] == gateway_container()["image"]

    deployment = objects["Deployment", "agui-hub"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert objects["Service", "agui-hub"]["spec"]["selector"] == selector
    assert objects["PodDisruptionBudget", "agui-hub"]["spec"]["selector"]["matchLabels"] == selector
    target = objects["HorizontalPodAutoscaler", "agui-hub"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "agui-hub")
    hpa = objects["HorizontalPodAutoscaler", "agui-hub"]["spec"]
    assert 2 <= hpa["minReplicas"] < hpa["maxReplicas"]
    assert objects["PodDisruptionBudget", "agui-hub"]["spec"]["maxUnavailable"] == 1

    pod = deployment["spec"]["template"]["spec"]
    container = gateway_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    user = [i for i in final_stage(parse_dockerfile(DOCKERFILE.read_text())) if i.name == "USER"]
    assert str(pod["securityContext"]["runAsUser"]) == user[-1].args.split(":")[0]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][kind].keys(), kind

    # The JWT key: a Secret mounted read-only, and the variable points into it.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    secret_volumes = [name for name, v in volumes.items() if "secret" in v]
    assert secret_volumes == ["jwt"]
    assert mounts["jwt"]["readOnly"] is True
    key_file = kubernetes_environment()["AGUI_HUB_JWT_SECRET_FILE"]
    (item,) = volumes["jwt"]["secret"]["items"]
    assert key_file == f"{mounts['jwt']['mountPath']}/{item['path']}"
    assert "AGUI_HUB_JWT_SECRET" not in kubernetes_environment()  # never in a ConfigMap

    store = urlsplit(kubernetes_environment()["AGUI_HUB_STORE"])
    assert ("Service", store.hostname) in objects
    (redis_port,) = objects["Service", store.hostname]["spec"]["ports"]
    assert redis_port["port"] == store.port


# -- the topology: Redis, two gateways, nginx; a viewer survives the loss of its gateway -------


OPENED = re.compile(r"connection \d+ from \S+ opened")
SPEEDUP = 4
"""The demo run's pauses divided by this: about 1.6 s instead of 6.5 s."""


def opened(gateway: GatewayProcess) -> int:
    """How many WebSocket connections the gateway's log says it opened."""
    return len(OPENED.findall(gateway.log()))


async def wait_for(condition: Any, what: str, timeout: float) -> None:
    """Poll *condition* (a callable) until true; fail after *timeout* seconds (scaled)."""
    deadline = time.monotonic() + timeout * TIMEOUT_SCALE
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout * TIMEOUT_SCALE:.0f} s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.timeout(180)
async def test_a_viewer_behind_nginx_survives_the_loss_of_its_gateway(
    gateways: Gateways, tmp_path: Path
) -> None:
    nginx_binary()  # skip (fail under CI) before starting anything
    redis = DeployRedis(tmp_path / "redis", REDIS_CONF.read_text())
    redis.start()
    proxy: Nginx | None = None
    try:
        secret = jwt_secret(tmp_path)
        env = compose_environment()
        first = start_deployed_gateway(gateways, env, redis.url, secret)
        second = start_deployed_gateway(gateways, env, redis.url, secret)
        proxy = Nginx(tmp_path / "nginx", [first.port, second.port])
        await asyncio.to_thread(proxy.start)

        thread = f"deploy-{uuid.uuid4().hex[:8]}"
        run = demo_run(thread, f"run-{uuid.uuid4().hex[:8]}")
        kill_at = len(run) // 3
        published: list[tuple[str, dict[str, Any]]] = []
        received: list[tuple[str, dict[str, Any]]] = []
        subscribed: list[Subscribed] = []
        killed = asyncio.Event()

        async def publish() -> None:
            # The agent writes into Redis directly, as one next to the store
            # would: it is not what the test takes away.
            async with Publisher(redis.url) as publisher:
                for index, (delay, event) in enumerate(run):
                    if index == kill_at:
                        async with asyncio.timeout(30 * TIMEOUT_SCALE):
                            await killed.wait()
                    await asyncio.sleep(delay / SPEEDUP)
                    offset = await publisher.publish(thread, event)
                    published.append((str(offset), event))

        async def view(hub: HubClient) -> None:
            async with hub.subscribe(thread, "start") as subscription:
                async for item in subscription:
                    assert not isinstance(item, Snapshot), "a snapshot: the resume was not whole"
                    if isinstance(item, Subscribed):
                        subscribed.append(item)
                    elif isinstance(item, ThreadEvent):
                        received.append((item.offset, item.event))
                        if item.event["type"] == "RUN_FINISHED":
                            return

        token = encode_token(secret.read_text().strip(), "viewer", subscribe=["*"])
        hub = HubClient(proxy.url, token=token, backoff_max=0.5, give_up_after=30 * TIMEOUT_SCALE)
        await hub.connect()
        try:
            viewing = asyncio.create_task(view(hub))
            publishing = asyncio.create_task(publish())
            await wait_for(lambda: bool(subscribed), "the viewer's subscription", 10)
            # Which gateway did nginx give the viewer? Its log says so.
            await wait_for(lambda: opened(first) + opened(second) == 1, "a connection", 10)
            (lost, other) = (first, second) if opened(first) else (second, first)
            await wait_for(lambda: len(received) >= kill_at, "the first third of the run", 30)

            lost.signal(signal.SIGKILL)
            assert await asyncio.to_thread(lost.wait, 10 * TIMEOUT_SCALE) == -signal.SIGKILL
            killed.set()
            async with asyncio.timeout(60 * TIMEOUT_SCALE):
                await publishing
                await viewing
        finally:
            with contextlib.suppress(Exception):
                await hub.close()

        print(
            f"{len(received)} events, killed the gateway on port {lost.port} after "
            f"{kill_at}, {hub.reconnects} reconnect(s), resumed on port {other.port}: "
            f"{[(s.resumed, s.recovered) for s in subscribed]}"
        )
        # Every event exactly once, in order, at the offsets they were stored at.
        assert len(published) == len(run)
        assert [offset for offset, _ in received] == [offset for offset, _ in published]
        assert received == published
        # The viewer went through nginx to the other gateway and resumed there.
        assert hub.reconnects >= 1
        assert opened(other) >= 1, other.log()
        resumed = [item for item in subscribed if item.resumed]
        assert resumed and all(item.recovered for item in resumed), subscribed
        assert other.process.poll() is None, other.log()
        assert proxy.process is not None and proxy.process.poll() is None, proxy.error_log()
    finally:
        if proxy is not None:
            proxy.stop()
        redis.stop()


def test_topology_helpers_replace_only_addresses() -> None:
    """The nginx and Redis files the topology runs differ from deploy/'s only in
    addresses, ports and the data directory."""
    from .topology import nginx_site, redis_config_for_test

    original = NGINX_CONF.read_text()
    adapted = nginx_site(original, 1234, [2001, 2002])
    changed = [
        (a, b) for a, b in zip(original.splitlines(), adapted.splitlines(), strict=True) if a != b
    ]
    assert [b.split()[:2] for _, b in changed] == [
        ["server", "127.0.0.1:2001"], ["server", "127.0.0.1:2002"], ["listen", "127.0.0.1:1234;"],
    ]  # fmt: skip
    conf = REDIS_CONF.read_text()
    adapted = redis_config_for_test(conf, 4321, Path("/somewhere"))
    changed = [a for a, b in zip(conf.splitlines(), adapted.splitlines(), strict=True) if a != b]
    assert [line.split()[0] for line in changed] == ["bind", "port", "dir"]
