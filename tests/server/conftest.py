"""A live ``flare run`` on a free loopback port (module scope), like vLLM's ``RemoteOpenAIServer``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    url: str

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def _wait_healthy(self, timeout: float, alive) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not alive():
                raise RuntimeError(f"flare run stopped before it was healthy:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"flare run did not become healthy in {timeout} s:\n{self.output()}")
            time.sleep(0.05)


class InProcessServer(_Server):
    """The app ``flare run ARGS`` builds, served by uvicorn on a thread of the test process (no second
    interpreter: the process already holds torch and transformers)."""

    def __init__(self, *args: str, core: str | None = None, timeout: float = 60.0):
        import threading

        import uvicorn

        from helios.cli import build_parser, engine_config
        from helios.server.app import build_server

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ns = build_parser().parse_args(["run", *([core] if core else []), "--port", str(self.port), *args])
        app, _ = build_server(ns.core, engine_config(ns))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        self._wait_healthy(timeout, self.thread.is_alive)

    def output(self) -> str:
        return ""

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class LiveServer(_Server):
    """``python -m helios.cli run [CORE] --port P ARGS``; waits for /health, terminates on close."""

    def __init__(self, *args: str, core: str | None = None, timeout: float = 120.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "helios.cli", "run", *([core] if core else []), "--port", str(self.port), *args]
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"flare-server-{self.port}.log", "w+")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_healthy(timeout, lambda: self.proc.poll() is None)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def server_factory():
    servers = []

    def make(*args, in_process: bool = False, **kw):
        servers.append((InProcessServer if in_process else LiveServer)(*args, **kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture(scope="module")
def ranged_core(tmp_path_factory) -> str:
    """The embedded default core with a declared temperature range 0..2 (the embedded default declares
    none, so its temperature is fixed at 1.0 and a request's temperature is ignored)."""
    import shutil

    from helios.runtime.engine import default_core
    from ignition.core.manifest import read_manifest, write_manifest

    out = tmp_path_factory.mktemp("cores") / "ranged"
    shutil.copytree(default_core(), out)
    core = read_manifest(out / "core.pb")
    core.sampling.ranges.add(name="temperature", lo=0.0, hi=2.0)
    write_manifest(out / "core.pb", core)
    return str(out)


@pytest.fixture(scope="module")
def oai(server):
    """The official OpenAI client against the module's ``server``."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    """The official Anthropic client against the module's ``server``."""
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
