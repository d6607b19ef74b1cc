"""A real 2-node Ray cluster on one machine whose worker node cannot see the driver's store.

The head node (0 CPUs) runs beside the driver. The worker node runs in its own mount namespace
(``unshare -m``) with a tmpfs mounted over the directory that holds the store, so that directory is
empty there, as on a cluster without a shared filesystem. Trials and Train workers are pinned to it
with the ``far`` resource. Each node is a ``ray start --block`` child process in its own process group,
stopped by that pid (never a machine-wide ``ray stop``, which would end the test session's Ray too).

The nodes and the drivers share a network namespace of their own that has only a loopback interface:
Ray resolves "127.0.0.1" to the machine's outward address for multi-node clusters, and inside that
namespace there is none, so all of the cluster's traffic stays on loopback.
"""

from __future__ import annotations

import contextlib
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
from typing import Any

RAY = str(Path(sys.executable).with_name("ray"))
ENV = {
    **os.environ,
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",  # worker nodes may join (the Makefile turns this off elsewhere)
}
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
    probe = subprocess.run(["unshare", "-m", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -m -n is not permitted here (needs root): {probe.stderr.strip()}"
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
        self.netns = subprocess.Popen(
            ["unshare", "-n", "bash", "-c", "ip link set lo up && exec sleep infinity"], start_new_session=True
        )
        self.enter = ["nsenter", f"--net=/proc/{self.netns.pid}/ns/net"]
        self.temp = Path(tempfile.mkdtemp(prefix="rcmf", dir="/tmp"))  # short: Ray's socket paths must fit
        self._logs: list[Path] = []
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--temp-dir={self.temp}"]
        time.sleep(0.2)  # the namespace's loopback is up
        head = [RAY, "start", "--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false"]
        self.head = self._spawn([*head, *common, *_ports()])
        try:
            self._start_far(hidden, far_cpus, common)
        except BaseException:  # a node that did not start leaves nothing running behind
            self.close()
            raise

    def _start_far(self, hidden: Path, far_cpus: int, common: list[str]) -> None:
        """Once the head is up, start the worker node, which cannot see ``hidden``."""
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

    def _spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        """Start a node; its output goes to a log in the cluster's temp dir (the error quotes it)."""
        with open(self.temp / f"node-{len(self._logs)}.log", "wb") as log:
            self._logs.append(Path(log.name))
            return subprocess.Popen(self.enter + command, env=ENV, start_new_session=True, stdout=log, stderr=log)

    def _wait_for_nodes(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = subprocess.run(
                [*self.enter, RAY, "status", f"--address={self.address}"], env=ENV, capture_output=True, text=True
            )
            if status.returncode == 0 and status.stdout.count("node_") >= count:
                return
            for node in (self.head, getattr(self, "far", None)):
                if node is not None and node.poll() is not None:
                    said = "\n".join(f"{p.name}: {p.read_text(errors='replace')[-3000:]}" for p in self._logs)
                    raise RuntimeError(f"a Ray node exited with {node.returncode} while starting:\n{said}")
            time.sleep(1.0)
        raise TimeoutError(f"the cluster at {self.address} did not reach {count} nodes in {timeout} s")

    def stop_far(self) -> None:
        """Kill the worker node for real: every process in its mount namespace (raylet, workers, agents)."""
        if not hasattr(self, "far"):  # it never started
            return
        if self.far.poll() is None:
            namespace = os.readlink(f"/proc/{self.far.pid}/ns/mnt")
            for pid in _pids_in_namespace(namespace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _kill_group(self.far)

    def close(self) -> None:
        self.stop_far()
        _kill_group(self.head)
        _kill_group(self.netns)
        shutil.rmtree(self.temp, ignore_errors=True)

    def driver(self, script: str, *args: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen[str]:
        """Start a driver script against the cluster (in the cluster's network namespace)."""
        return subprocess.Popen(
            [*self.enter, sys.executable, "-c", script, self.address, *args],
            env={**ENV, **(env or {})},
            text=True,
            **popen,
        )

    def run_driver(self, script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 400) -> str:
        """Run a driver script against the cluster; return its stdout (raise with its stderr on failure)."""
        process = self.driver(script, *args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = process.communicate(timeout=timeout)
        if process.returncode != 0:
            raise AssertionError(f"driver failed ({process.returncode}):\n{stderr[-6000:]}")
        return stdout


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _pids_in_namespace(namespace: str) -> list[int]:
    """The processes whose mount namespace is ``namespace`` (as ``readlink /proc/PID/ns/mnt`` prints it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == namespace:
                    pids.append(int(entry.name))
    return pids


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"
