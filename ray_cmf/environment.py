"""What an execution ran: its code version, software, hardware and seeds (recorded once per execution).

Everything here is read from the process that runs the code, never from the environment variables
(which hold secrets); a git remote URL loses its credentials. The full package list is a
content-addressed artifact, so every execution with the same environment shares one file.

Property names carry the prefix ``env_`` (``seed_`` for seeds) in MLMD; :class:`ray_cmf.Sweep` shows them
as ``env/...`` and ``seed/...`` columns.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray_cmf._names import check_name
from ray_cmf.constants import ENV_PREFIX, SEED_PREFIX

ENV_COLUMNS = ("git_commit", "git_dirty", "host", "gpu_model")  # the ones Sweep.trials() shows
_GIT_TIMEOUT_S = 10.0
_CREDENTIALS = re.compile(r"(?<=://)[^/@]+@")
_URL_PASSWORD = re.compile(r"(?<=://)([^/@:\s]*):[^/@\s]+@")
_SECRET_NAME = re.compile(  # argument names whose value is a credential
    r"pass(word|wd)?|pwd|token|secret|credential|auth|(^|[-_])(api|access|private|secret)?[-_]?key$", re.IGNORECASE
)
REDACTED = "***"
_DIST_INFO = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)\.dist-info$")
_NORMALIZED = re.compile(r"[-_.]+")


@dataclass(frozen=True)
class Environment:
    """One process's record: ``props`` (``env_*`` / ``seed_*`` MLMD properties) and its package list, whose md5
    is among the props too (``env_packages_md5``), so that reads and diffs see two lists differ."""

    props: dict[str, Any]
    packages: str = ""
    md5: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "md5", hashlib.md5(self.packages.encode()).hexdigest() if self.packages else "")
        if self.md5:
            self.props[ENV_PREFIX + "packages_md5"] = self.md5


def capture(*, code: bool = True, software: bool = True, hardware: bool = True) -> Environment:
    """This process's environment: the git state of the user's script (``code``), versions and the package
    list (``software``), host, CPU, GPU and torch's seed (``hardware``)."""
    props: dict[str, Any] = {}
    if code:
        props |= code_version(entry_point())
    if software:
        props |= software_versions()
    if hardware:
        props |= hardware_info() | torch_seed()
    return Environment(props, package_list() if software else "")


@dataclass(frozen=True)
class EntryPoint:
    """The code that ``python`` ran: a ``script`` file, the ``text`` of ``python -c``, or neither where ray_cmf
    cannot read it (code piped to stdin, a REPL, a notebook); ``directory``: where its git state is read."""

    directory: Path
    script: Path | None = None
    text: bytes | None = None


def entry_point() -> EntryPoint:
    """This process's :class:`EntryPoint`."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path and Path(path).is_file():
        script = Path(path).resolve()
        return EntryPoint(script.parent, script)
    argv = sys.orig_argv
    if "-c" in argv[1:-1] and not path:  # the interpreter's own -c: the code follows it
        return EntryPoint(Path.cwd(), text=argv[argv.index("-c", 1) + 1].encode())
    return EntryPoint(Path.cwd())


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args], capture_output=True, timeout=_GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else None


def code_version(entry: EntryPoint) -> dict[str, Any]:
    """Commit, branch, dirty flag, the md5 of the uncommitted diff and the remote (no credentials) of the
    git repository that holds ``entry.directory``; empty when it is not in one (or git is missing). Code that
    is no file git tracks makes it dirty: a script's or ``-c``'s text is then part of the diff, and code that
    cannot be read leaves no md5 (it would call two programs alike). One ``git status`` gives the first
    three: each git call costs a run's first ``log_metric`` a few milliseconds."""
    directory, script = entry.directory, entry.script
    status = _git(directory, "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    if status is None:
        return {}
    header = dict(line[2:].split(" ", 1) for line in status.splitlines() if line.startswith("# "))
    commit = header.get("branch.oid", "")
    if not commit or commit == "(initial)":
        return {}
    untracked = script is None or _git(directory, "ls-files", "--error-unmatch", "--", str(script)) is None
    dirty = untracked or any(not line.startswith("#") for line in status.splitlines())
    diff = b""
    if dirty:
        diff = (_git(directory, "diff", "HEAD") or "").encode()
        if untracked:
            diff += script.read_bytes() if script is not None else entry.text or b""
    readable = script is not None or entry.text is not None
    branch = header.get("branch.head", "")
    props: dict[str, Any] = {
        "git_commit": commit,
        "git_branch": "HEAD" if branch == "(detached)" else branch,
        "git_dirty": dirty,
        "git_diff_md5": hashlib.md5(diff).hexdigest() if dirty and readable else "",
    }
    remote = _git(directory, "remote", "get-url", "origin")
    if remote:
        props["git_remote"] = strip_credentials(remote)
    return {ENV_PREFIX + k: v for k, v in props.items()}


def strip_credentials(url: str) -> str:
    """A URL without its ``user:password@`` part, its query and its fragment (``?private_token=...``)."""
    return _CREDENTIALS.sub("", url).split("?", 1)[0].split("#", 1)[0]


def redact_command(argv: list[str]) -> str:
    """A command line fit to write down: the value of every argument named like a credential (``--password
    X``, ``--api-key=X``, ``HF_TOKEN=X``) and every URL's password become ``***``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        name, equals, _value = arg.partition("=")
        if hide_next and not arg.startswith("-"):
            arg = REDACTED
        elif equals and _SECRET_NAME.search(name.lstrip("-")):
            arg = f"{name}={REDACTED}"
        else:
            arg = _URL_PASSWORD.sub(rf"\1:{REDACTED}@", arg)
        hide_next = arg.startswith("-") and not equals and bool(_SECRET_NAME.search(arg.lstrip("-")))
        out.append(arg)
    return shlex.join(out)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def software_versions() -> dict[str, Any]:
    """Python, ray_cmf, ray and torch versions; CUDA and NCCL when torch was already imported and sees a GPU."""
    props: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "ray_cmf": _version("ray_cmf"),
        "ray": _version("ray"),
        "torch": _version("torch"),
    }
    torch = sys.modules.get("torch")  # never import torch only to describe it
    if torch is not None:
        if torch.version.cuda:  # the CUDA torch was built with; a CPU build has none
            props["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return {ENV_PREFIX + k: v for k, v in props.items()}


@functools.cache
def package_list() -> str:
    """Every installed distribution as ``name==version`` (the name normalized as PEP 503 does), one per line,
    sorted; cached, as it cannot change. The first of a name on ``sys.path`` wins, as ``import`` finds it."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name, version = _name_and_version(dist)
        if name:
            found.setdefault(name, f"{name}=={version}")
    return "".join(f"{line}\n" for _, line in sorted(found.items()))


def _name_and_version(dist: importlib.metadata.Distribution) -> tuple[str, str]:
    """A distribution's name and version from its ``<name>-<version>.dist-info`` directory's name (PEP 427),
    which costs nothing, where parsing every METADATA file costs ~1 ms each; from the metadata otherwise (an
    ``.egg-info``). ``_path`` is where importlib's own PathDistribution keeps that directory."""
    directory = getattr(dist, "_path", None)
    match = _DIST_INFO.match(directory.name) if isinstance(directory, Path) else None
    name, version = (match["name"], match["version"]) if match else (dist.metadata["Name"] or "", dist.version)
    return _NORMALIZED.sub("-", name).lower(), version


def hardware_info() -> dict[str, Any]:
    """Host, Ray node id and IP (inside Ray), CPU model and count; GPU model, count and memory when torch sees
    one."""
    props: dict[str, Any] = {"host": socket.gethostname(), "cpu_model": cpu_model(), "cpu_count": os.cpu_count() or 0}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        props["node_id"] = ray.get_runtime_context().get_node_id()
        props["node_ip"] = ray.util.get_node_ip_address()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        first = torch.cuda.get_device_properties(0)
        props |= {"gpu_model": first.name, "gpu_count": count, "gpu_memory_gb": round(first.total_memory / 2**30, 1)}
    return {ENV_PREFIX + k: v for k, v in props.items()}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_seed() -> dict[str, Any]:
    """torch's initial seed, when torch was imported by the user's code."""
    torch = sys.modules.get("torch")
    return {SEED_PREFIX + "torch": _seed_value(torch.initial_seed())} if torch is not None else {}


def seed_props(seeds: dict[str, Any]) -> dict[str, Any]:
    """The MLMD properties of seeds the user records (``seed_<name>``); each must be an int."""
    for name, value in seeds.items():
        check_name("seed name", name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"Seed {name!r} must be an int, got {value!r}")
    return {SEED_PREFIX + name: _seed_value(value) for name, value in seeds.items()}


def _seed_value(seed: int) -> int | str:
    """A seed as MLMD can hold it: an int64, or its decimal string (torch's seeds go up to 2**64 - 1)."""
    return int(seed) if -(2**63) <= seed < 2**63 else str(seed)


def recorded_environment(props: Mapping[str, Any]) -> dict[str, Any]:
    """The ``env/...`` and ``seed/...`` values ray_cmf recorded among an execution's properties, each seed an
    int again (see :func:`_seed_value`). A config's keys of such names are not among them: see
    :func:`~ray_cmf.lineage.config_properties`."""
    recorded: dict[str, Any] = {}
    for key, value in props.items():
        if key.startswith(ENV_PREFIX):
            recorded["env/" + key[len(ENV_PREFIX) :]] = value
        elif key.startswith(SEED_PREFIX):
            seed = isinstance(value, str) and value.lstrip("-").isdecimal()
            recorded["seed/" + key[len(SEED_PREFIX) :]] = int(value) if seed else value
    return recorded
