"""A real 2-node Ray cluster on one machine whose worker node cannot see the driver's store.

The head node (0 CPUs) runs beside the driver. The worker node runs in its own mount namespace
(``unshare -m``) with a tmpfs mounted over the directory that holds the store, so that directory is
empty there, as on a cluster without a shared filesystem. Trials and Train workers are pinned to it
with the ``far`` resource. Each node is a ``ray start --block`` child process in its own process group,
stopped by that pid (never a machine-wide ``ray stop``, which would end the test session's Ray too).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_USAGE_STATS_ENABLED": "0"}
ENV.pop("RAY_CMF_STORE", None)  # the store is named on the driver only
_PORT_OPTIONS = (
    "--node-manager-port",
    "--object-manager-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


def unshare_skip_reason() -> str | None:
    """Why a node with a private mount namespace cannot be made here, or None when it can."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -m is not permitted here (needs root): {probe.stderr.strip()}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports() -> list[str]:
    return [f"{option}={free_port()}" for option in _PORT_OPTIONS]


class TwoNodeCluster:
    """Start with ``hidden`` (the directory the worker node must not see); stop with :meth:`close`."""

    def __init__(self, hidden: Path, far_cpus: int = 2) -> None:
        self.hidden = hidden
        self.temp = Path(tempfile.mkdtemp(prefix="rcmf", dir="/tmp"))  # short: Ray's socket paths must fit
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--temp-dir={self.temp}"]
        self.head = self._spawn(
            [RAY, "start", "--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false"]
            + common
            + _ports()
        )
        self._wait_for_nodes(1)
        far = [
            RAY,
            "start",
            f"--address={self.address}",
            f"--num-cpus={far_cpus}",
            f"--resources={json.dumps({'far': far_cpus})}",
            *common,
            *_ports(),
        ]
        script = f"mount -t tmpfs none {hidden} && exec {' '.join(_quote(a) for a in far)}"
        self.far = self._spawn(["unshare", "-m", "bash", "-c", script])
        self._wait_for_nodes(2)

    @staticmethod
    def _spawn(command: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command, env=ENV, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def _wait_for_nodes(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = subprocess.run(
                [RAY, "status", f"--address={self.address}"], env=ENV, capture_output=True, text=True
            )
            if status.returncode == 0 and status.stdout.count("node_") >= count:
                return
            for node in (self.head, getattr(self, "far", None)):
                if node is not None and node.poll() is not None:
                    raise RuntimeError(f"a Ray node exited with {node.returncode} while starting")
            time.sleep(1.0)
        raise TimeoutError(f"the cluster at {self.address} did not reach {count} nodes in {timeout} s")

    def stop_far(self) -> None:
        """Kill the worker node for real: its raylet, its workers and everything else in its process group."""
        _kill_group(self.far)

    def close(self) -> None:
        _kill_group(self.far)
        _kill_group(self.head)
        shutil.rmtree(self.temp, ignore_errors=True)

    def run_driver(self, script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 400) -> str:
        """Run a driver script against the cluster; return its stdout (raise with its stderr on failure)."""
        done = subprocess.run(
            [sys.executable, "-c", script, self.address, *args],
            env={**ENV, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise AssertionError(f"driver failed ({done.returncode}):\n{done.stderr[-6000:]}")
        return done.stdout


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"
