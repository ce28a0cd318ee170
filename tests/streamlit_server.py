"""A Streamlit server started by a test: a free port, waiting for it to serve, stopping it."""
import socket
import subprocess
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(proc: subprocess.Popen, url: str, timeout_s: float = 60) -> None:
    """Poll ``url``'s health endpoint until it answers "ok"; fail with the server's output when
    it exits or the time is up. ``proc`` must have been started with stdout=PIPE."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as health:
                assert health.status == 200 and health.read().strip() == b"ok"
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.stdout.read().decode(errors="replace")[-3000:]
                pytest.fail(f"streamlit did not serve {url}:\n{out}")
            time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    """Terminate the server (kill it if it does not stop within 15 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
