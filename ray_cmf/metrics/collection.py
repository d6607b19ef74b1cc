"""MetricCollection: many metrics, one packed buffer, one collective per sync (two for large states)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ray_cmf._names import check_name
from ray_cmf.metrics.base import Metric, load_global_state
from ray_cmf.metrics.packing import COLLECTIVE_TIMEOUT_S, StatePack, States, SyncHandle
from ray_cmf.metrics.staging import Stager

Values = dict[str, torch.Tensor]
Pattern = tuple[tuple[str, ...], tuple[int, ...]]  # a joint update's metric names and their input counts
MAX_PATTERNS = 8  # call patterns of ``update`` staged at once (each keeps its own blocks)


def flatten_outputs(name: str, outputs: Mapping[str, torch.Tensor]) -> Values:
    """``value`` keeps the metric's name; every other output becomes ``<name>_<output>``."""
    return {name if key == "value" else f"{name}_{key}": tensor for key, tensor in outputs.items()}


class MetricCollection:
    """Named metrics whose states share one contiguous buffer (a region per reduction).

    ``sync()`` ends a logging interval for all of them in one collective (see ``packing``) and resets the
    local states (except cumulative metrics). ``to_row()`` moves every scalar result to the host (in one
    transfer from an accelerator).

    Example:
        >>> from ray_cmf.metrics import Mean, Max
        >>> metrics = MetricCollection({"loss": Mean(), "grad_norm_max": Max()})
        >>> metrics["loss"].update(torch.tensor([0.5, 1.5]))
        >>> metrics["grad_norm_max"].update(torch.tensor(3.0))
        >>> row = metrics.sync().wait() and metrics.to_row()
        >>> row["loss"], row["grad_norm_max"]
        (1.0, 3.0)
    """

    def __init__(self, metrics: Mapping[str, Metric], *, device: Any = None) -> None:
        if not metrics:
            raise ValueError("MetricCollection needs at least one metric")
        for name, metric in metrics.items():
            check_name("metric name", name)
            if not isinstance(metric, Metric):
                raise TypeError(f"Metric {name!r} is a {type(metric).__name__}, not a ray_cmf.metrics.Metric")
            if metric._owner is not None:
                raise ValueError(f"Metric {name!r} already belongs to another MetricCollection")
        self._metrics = dict(metrics)
        self._device = torch.device(device) if device is not None else next(iter(self._metrics.values())).device
        self._synced: Values | None = None
        self._joint: dict[Pattern, tuple[Stager, list[Metric]]] = {}  # staged joint updates, by call pattern
        self._pack = self._build_pack()

    def _build_pack(self) -> StatePack:
        for metric in self._metrics.values():
            if metric.device != self._device:
                metric.to(self._device)
            metric._owner = self
            metric._pack = None
        return StatePack([(f"{name}.", m) for name, m in self._metrics.items()], self._device)

    def add(self, name: str, metric: Metric) -> None:
        """Add a metric, repacking the states (values kept). Do it before the first sync: the layout changes."""
        check_name("metric name", name)
        if name in self._metrics:
            raise ValueError(f"MetricCollection already has a metric named {name!r}")
        if metric._owner is not None:
            raise ValueError(f"Metric {name!r} already belongs to another MetricCollection")
        self._fold()
        for member in self._metrics.values():
            member._owner = None
            for state in member._state_specs:
                setattr(member, state, getattr(member, state).clone())  # detach from the old buffers
        self._metrics[name] = metric
        self._pack = self._build_pack()

    # -- mapping -------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Metric:
        return self._metrics[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)

    def items(self) -> Iterator[tuple[str, Metric]]:
        return iter(self._metrics.items())

    @property
    def device(self) -> torch.device:
        return self._device

    # -- the protocol --------------------------------------------------------------------------------
    def update(self, **inputs: Any) -> None:
        """Update several metrics in one call: ``update(loss=t, acc=(preds, target))``.

        The same as calling each named metric's ``update`` (a tuple holds a metric's positional inputs), for
        less host time per step: the call's inputs are staged together, in one block per call pattern. A
        call whose inputs together are too large to stage updates every named metric directly.
        """
        flat: list[Any] = []
        counts: list[int] = []
        for value in inputs.values():
            if type(value) is tuple:
                flat.extend(value)
                counts.append(len(value))
            else:
                flat.append(value)
                counts.append(1)
        pattern = (tuple(inputs), tuple(counts))
        stager, named = self._joint.get(pattern) or self._joint_stager(pattern)
        for metric in named:
            metric._synced = None
        stager.push(flat, self._device)

    def _joint_stager(self, pattern: Pattern) -> tuple[Stager, list[Metric]]:
        """Staging for a new call pattern of ``update`` (and the metrics it names): each block's columns go to
        their own metric."""
        unknown = [name for name in pattern[0] if name not in self._metrics]
        if unknown:
            raise KeyError(f"MetricCollection has no metric named {unknown[0]!r}; it has {list(self._metrics)}")
        if len(self._joint) == MAX_PATTERNS:
            for stager, _ in self._joint.values():
                stager.flush()
            self._joint.clear()
        members = [(self._metrics[name], count) for name, count in zip(*pattern, strict=True)]

        def each(method: str) -> Callable[..., None]:
            def call(*columns: Any) -> None:
                begin = 0
                for metric, count in members:
                    getattr(metric, method)(*columns[begin : begin + count])
                    begin += count

            return call

        joint = self._joint[pattern] = (Stager(each("_apply"), each("_check")), [metric for metric, _ in members])
        return joint

    def compute(self) -> Values:
        """``{name: tensor}``: the last sync's global values until the next update, else local ones."""
        if self._synced is not None and all(m._synced is not None for m in self._metrics.values()):
            return self._synced
        self._fold()
        out: Values = {}
        for name, metric in self._metrics.items():
            out.update(flatten_outputs(name, metric.compute()))
        return out

    def sync(self, group: Any = None, *, async_op: bool = False) -> SyncHandle[Values]:
        """End the interval for every metric in one collective (two for large states); ``wait()`` gives values.

        On CUDA the reduction runs on a side stream; on gloo with ``async_op=True`` the collectives are
        asynchronous. Either way local updates may continue before ``wait()``.
        """

        self._fold()

        def finish(reduced: States) -> Values:
            values: Values = {}
            for name, metric in self._metrics.items():
                values.update(flatten_outputs(name, metric._keep_synced(self._pack.states(metric, reduced))))
            self._synced = values
            return values

        handle = self._pack.reduce(group, async_op=async_op).then(finish)
        if not async_op:
            handle.wait()
        return handle

    def to_row(self, values: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Every scalar result as a plain ``{name: float}``; from an accelerator, in ONE transfer."""
        values = self.compute() if values is None else values
        scalars = {k: v for k, v in values.items() if v.numel() == 1}
        if not scalars or self._device.type == "cpu":  # reading host memory needs no transfer
            return {k: float(v.item()) for k, v in scalars.items()}
        host = torch.stack([v.reshape(()).to(torch.float64) for v in scalars.values()]).cpu().tolist()
        return dict(zip(scalars, host, strict=True))

    def reset(self) -> None:
        """Restore every state to its default."""
        self._pack.reset()
        self._discard_staged()
        self._clear_synced()

    def state_dict(self, timeout: float = COLLECTIVE_TIMEOUT_S) -> dict[str, torch.Tensor]:
        """The GLOBAL states (``<metric>.<state>``), restorable exactly at any world size.

        A collective: call it on every rank (then save it on one). Called on one rank only, it raises
        :class:`CollectiveTimeoutError` after ``timeout`` seconds instead of hanging.
        """
        self._fold()
        reduced = self._pack.global_states(timeout)
        return {
            f"{name}.{state}": view.clone()
            for name, metric in self._metrics.items()
            for state, view in self._pack.states(metric, reduced).items()
        }

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Restore global states: rank 0 takes them, other ranks start from the defaults."""
        self._discard_staged()
        load_global_state(self._pack, [(f"{n}.", m) for n, m in self._metrics.items()], state_dict)
        self._clear_synced()

    def _fold(self) -> None:
        """Apply every staged update, joint or not (before reading or reducing the states)."""
        for stager, _ in self._joint.values():
            stager.flush()
        for metric in self._metrics.values():
            metric._stager.flush()

    def _discard_staged(self) -> None:
        self._joint.clear()
        for metric in self._metrics.values():
            metric._discard_staged()

    def _clear_synced(self) -> None:
        self._synced = None
        for metric in self._metrics.values():
            metric._synced = None

    def to(self, device: Any) -> MetricCollection:
        """Move every state to ``device`` (values kept); returns self."""
        self._fold()
        self._discard_staged()
        self._device = torch.device(device)
        for metric in self._metrics.values():
            metric._owner = None
        self._pack = self._build_pack()
        return self
