"""``docker compose up`` rehearsed without Docker: the services of docker-compose.yml that are
built from this repository's Dockerfile run as plain processes here, with the image's
ENTRYPOINT and ENV, in ``depends_on`` order. What only Docker does is translated:

- an infrastructure service (an image of its own: redis, postgres) is the server already
  running here, and a URL naming it (``redis://redis:6379/0``) becomes that server's URL;
- a volume's container path (``/data``, ``/models``) is a directory here: a named volume's is
  made under ``root``, a bind mount's is its source;
- ``--host`` is 127.0.0.1 (a published port is on the host's loopback), and ``--port`` a free
  port standing for the published one, also in the health checks;
- ``$HOSTNAME`` is this host's name, as a container's is its own (Celery's ``%h``).

The image build and the volumes themselves stay with ``docker-compose config``.
"""

import json
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.workers.helpers import running, wait_for
from tests.workers.served import HOST, free_port

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?::-([^}]*))?\}")
CONTAINER_PATH = re.compile(r"(?:^|(?<=:))/[^:]*")  # each path of a ``a:b`` list


def interpolate(node: Any, variables: Mapping[str, str]) -> Any:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``$$`` (a literal ``$``) in every
    string of a parsed compose file."""
    if isinstance(node, dict):
        return {key: interpolate(value, variables) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, variables) for value in node]
    if not isinstance(node, str):
        return node

    def value(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1)) or match.group(2) or ""

    return VARIABLE.sub(value, node)


def image_defaults(dockerfile: Path) -> tuple[list[str], dict[str, str]]:
    """The Dockerfile's ENTRYPOINT (exec form) and ENV."""
    entrypoint, env = [], {}
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
        keyword, _, rest = line.strip().partition(" ")
        if keyword == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif keyword == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(rest))
    return entrypoint, env


@dataclass
class Service:
    """One of the repository's services, as a process here."""

    name: str
    argv: list[str]
    env: dict[str, str]
    depends_on: dict[str, str]  # service -> condition
    healthcheck: list[str] | None


class Rehearsal:
    """The services of ``compose`` (docker-compose.yml) with the infrastructure at ``local``
    (service name -> URL here) and the volumes under ``root``."""

    def __init__(
        self, compose: Path, local: Mapping[str, str], root: Path, variables: Mapping[str, str]
    ) -> None:
        config = interpolate(yaml.safe_load(compose.read_text()), variables)
        services = {
            name: spec for name, spec in config["services"].items() if not spec.get("profiles")
        }
        self.infrastructure = {name for name, spec in services.items() if "build" not in spec}
        self.local, self.root, self.project = dict(local), root, compose.parent
        self.ports: dict[str, int] = {}  # a published container port -> a free port here
        self.entrypoint, self.image_env = image_defaults(compose.parent / "Dockerfile")
        self.services = {
            name: self._service(name, spec)
            for name, spec in services.items()
            if name not in self.infrastructure
        }
        self.processes: dict[str, Popen] = {}

    def _service(self, name: str, spec: dict[str, Any]) -> Service:
        for published in spec.get("ports", []):
            self.ports.setdefault(published.rpartition(":")[2], free_port())
        mounts = {}
        for volume in spec.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                mounts[target] = self.project / source
            else:
                mounts[target] = self.root / "volumes" / source
                mounts[target].mkdir(parents=True, exist_ok=True)
        env = {**self.image_env, **{k: str(v) for k, v in spec.get("environment", {}).items()}}
        env = {key: self._value(value, mounts) for key, value in env.items()}
        bin_dir = str(Path(sys.executable).parent)  # the image's rlwb, celery and python
        env.update(
            PATH=f"{bin_dir}:/usr/bin:/bin", HOME=str(self.root), HOSTNAME=socket.gethostname()
        )
        argv = [*self.entrypoint, *spec["command"]]
        for i, arg in enumerate(argv[:-1]):
            if arg == "--host":
                argv[i + 1] = HOST
            elif arg == "--port":
                argv[i + 1] = str(self.ports[argv[i + 1]])
        return Service(name, argv, env, self._depends_on(spec), self._healthcheck(spec))

    def _value(self, value: str, mounts: Mapping[str, Path]) -> str:
        """An environment value here: a URL of an infrastructure service is its server's
        here; a container path is its mount's directory."""
        if "://" in value:
            host = urlsplit(value).hostname
            return self.local[host] if host in self.infrastructure else value

        def path(match: re.Match) -> str:
            found = match.group(0)
            for target, source in mounts.items():
                if found == target or found.startswith(target + "/"):
                    return str(source) + found[len(target) :]
            return found

        return CONTAINER_PATH.sub(path, value)

    @staticmethod
    def _depends_on(spec: dict[str, Any]) -> dict[str, str]:
        needs = spec.get("depends_on", {})
        if isinstance(needs, list):
            return dict.fromkeys(needs, "service_started")
        return {name: need.get("condition", "service_started") for name, need in needs.items()}

    def _healthcheck(self, spec: dict[str, Any]) -> list[str] | None:
        test = spec.get("healthcheck", {}).get("test")
        if test is None:
            return None
        argv = ["sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]
        for published, port in self.ports.items():
            argv = [arg.replace(f":{published}/", f":{port}/") for arg in argv]
        return argv

    def order(self) -> list[str]:
        """The repository's services, each after what it depends on."""
        done: list[str] = []

        def visit(name: str) -> None:
            if name in done or name in self.infrastructure:
                return
            for need in self.services[name].depends_on:
                visit(need)
            done.append(name)

        for name in sorted(self.services):
            visit(name)
        return done

    def healthy(self, name: str) -> bool:
        """The service's health check passes now."""
        service = self.services[name]
        done = subprocess.run(
            service.healthcheck, env=service.env, capture_output=True, timeout=60, check=False
        )
        return done.returncode == 0

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()

    @contextmanager
    def up(self) -> Iterator["Rehearsal"]:
        """Start every service in order, waiting where a dependant asks to (a service that
        must complete, one that must be healthy); stop them all, last first, on exit."""
        with ExitStack() as stack:
            for name in self.order():
                for need, condition in self.services[name].depends_on.items():
                    if need not in self.infrastructure:
                        self._wait(need, condition)
                service = self.services[name]
                log = self.root / f"{name}.log"
                self.processes[name] = stack.enter_context(
                    running(service.argv, service.env, self.root, log)
                )
            yield self

    def _wait(self, name: str, condition: str) -> None:
        process = self.processes[name]
        if condition == "service_completed_successfully":
            assert process.wait(120) == 0, self.log(name)
        elif condition == "service_healthy":
            wait_for(lambda: self.healthy(name), 120, f"{name} to be healthy", interval=2)
        else:
            assert condition == "service_started", condition
