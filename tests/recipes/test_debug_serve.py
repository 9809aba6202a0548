"""``ignition debug-serve``: a checkpoint prepared in process (temporary core, removed at exit) and served
by ``flare run``'s app; a bad checkpoint path exits non-zero with a one-line error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ignition(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(kw.pop("tmpdir"))}
    return subprocess.Popen([sys.executable, "-m", "ignition.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_debug_serve_prepares_and_serves_a_checkpoint(tmp_path):
    from ignition.checkpoints import embedded_default_checkpoint

    ckpt = embedded_default_checkpoint()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _ignition("debug-serve", str(ckpt), "--eager", "--host", "127.0.0.1", "--port", str(port),
                     "--kv-tokens", "2048", "--capacities", "1", "--prefill-chunks", "256", "--device", "cpu",
                     tmpdir=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"debug-serve exited {proc.returncode}:\n{proc.stdout.read()}"
            try:
                health = httpx.get(f"{url}/health", timeout=1)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "debug-serve did not become healthy"
            time.sleep(0.1)
        assert list(tmp_path.glob("flare-debug-serve-*/core/core.pb"))  # the temporary core, while serving
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": health.json()["model"], "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
            "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert "FAULT DIAGNOSIS ONLY" in out and "NOT serving measurements" in out
    assert not list(tmp_path.glob("flare-debug-serve-*"))  # removed at exit


def test_debug_serve_bad_checkpoint_exits_with_one_line(tmp_path, capsys):
    proc = _ignition("debug-serve", str(tmp_path / "missing"), "--eager", "--port", str(_free_port()), tmpdir=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out.strip().count("\n") == 0, out
    assert out.startswith("ignition debug-serve: ") and "is not a checkpoint folder" in out
    # a folder without config.json fails in preparation: still one line, non-zero (in process: fast)
    from ignition.cli import main

    assert main(["debug-serve", str(tmp_path), "--eager", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ignition debug-serve: ") and "config.json not found" in err[0], err
    assert not list(tmp_path.glob("flare-debug-serve-*"))
