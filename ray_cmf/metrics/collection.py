"""MetricCollection: many metrics, one packed buffer, one collective per sync (two for large states)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ray_cmf._names import check_name
from ray_cmf.metrics.base import Metric
from ray_cmf.metrics.groups import MetricGroups, MetricValues, Pattern
from ray_cmf.metrics.packing import COLLECTIVE_TIMEOUT_S, SyncHandle


class MetricCollection:
    """Named metrics whose states share one contiguous buffer (a region per reduction).

    Metrics of one kind (``Mean()`` twice, say) are updated and computed together, so a sync costs a fixed
    number of ops per kind whatever the number of metrics. ``sync()`` ends a logging interval for all of
    them in one collective (see ``packing``) and resets the local states (except cumulative metrics).
    ``to_row()`` moves every scalar result to the host (in one transfer from an accelerator).

    Example:
        >>> from ray_cmf.metrics import Mean, Max
        >>> metrics = MetricCollection({"loss": Mean(), "grad_norm_max": Max()})
        >>> metrics["loss"].update(torch.tensor([0.5, 1.5]))
        >>> metrics["grad_norm_max"].update(torch.tensor(3.0))
        >>> row = metrics.to_row(metrics.sync().wait())
        >>> row["loss"], row["grad_norm_max"]
        (1.0, 3.0)
    """

    def __init__(self, metrics: Mapping[str, Metric], *, device: Any = None) -> None:
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"MetricCollection takes a {{name: metric}} dict, got a {type(metrics).__name__} ({metrics!r:.80}): "
                "name each metric, MetricCollection({'loss': Mean()})"
            )
        if not metrics:
            raise ValueError("MetricCollection needs at least one metric")
        for name, metric in metrics.items():
            _check_member(name, metric)
        self._metrics = dict(metrics)
        self._hidden: dict[str, Metric] = {}  # a logger's own metrics (see hidden_metric)
        self._device = torch.device(device) if device is not None else next(iter(self._metrics.values())).device
        self._groups = self._pack()
        self._patterns: dict[Pattern, tuple[list[Metric], bool]] = {}  # per call pattern: its metrics, and
        # whether they all stage their arguments as given (then the call is staged as one)

    def __repr__(self) -> str:
        return f"MetricCollection({self._metrics!r})"

    def _pack(self) -> MetricGroups:
        members = {**self._metrics, **self._hidden}
        for metric in members.values():
            metric.to(self._device)
        return MetricGroups(list(members.items()), self._device, prefixed=True, hidden=self._hidden)

    def add(self, name: str, metric: Metric) -> None:
        """Add a metric, repacking the states (values kept). Do it before the first sync: the layout changes."""
        self._add(name, metric, self._metrics)

    def _add(self, name: str, metric: Metric, into: dict[str, Metric]) -> None:
        _check_member(name, metric)
        if name in self._metrics or name in self._hidden:
            raise ValueError(f"MetricCollection already has a metric named {name!r}")
        self._unpack()
        into[name] = metric
        self._groups = self._pack()

    def hidden_metric(self, name: str, make: Callable[[], Metric]) -> Metric:
        """The metric a logger keeps in this collection under ``name`` for itself (``StepLogger``'s sample and
        step counts), added from ``make()`` if it has none yet. It is synced in the same collective as the
        metrics, and read in a row that asks for it (``MetricValues.row(hidden=True)``), but it is none of
        them: not among the keys, ``compute()``, ``to_row()`` or ``state_dict()``."""
        metric = self._hidden.get(name)
        if metric is None:
            metric = make()
            self._add(name, metric, self._hidden)
        return metric

    def _unpack(self) -> None:
        """Apply the staged updates and release the members from the packed layout (values kept)."""
        self._groups.fold()
        for metric in (*self._metrics.values(), *self._hidden.values()):
            metric.detach()

    # -- mapping -------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Metric:
        return self._metrics[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)

    def items(self) -> Iterator[tuple[str, Metric]]:
        return iter(self._metrics.items())

    def keys(self) -> Iterator[str]:
        return iter(self._metrics)

    def values(self) -> Iterator[Metric]:
        return iter(self._metrics.values())

    @property
    def device(self) -> torch.device:
        return self._device

    # -- the protocol --------------------------------------------------------------------------------
    def update(self, **inputs: Any) -> None:
        """Update several metrics in one call: ``update(loss=t, acc=(preds, target))``.

        The same as calling each named metric's ``update`` (a tuple holds a metric's positional inputs), for less
        host time per step: the call's inputs are staged together, one row of one block per call pattern. Inputs
        that do not fit raise before any metric is updated.
        """
        calls = [value if type(value) is tuple else (value,) for value in inputs.values()]
        flat = [item for args in calls for item in args]
        pattern = (tuple(inputs), tuple(map(len, calls)))
        known = self._patterns.get(pattern)
        if known is None:
            members = [self._member(name) for name in inputs]
            for name, metric, args in zip(inputs, members, calls, strict=True):
                _check_arguments(name, metric, args)
            known = self._patterns[pattern] = (members, all(m._stages_arguments for m in members))
        joint, stages = known
        # (a None among the inputs, a Mean's weight=None, stages no weight: its own update says so)
        if stages and all(item is not None for item in flat):
            self._groups.push_joint(pattern, joint, flat)
            return
        for metric, args in zip(joint, calls, strict=True):
            metric._check_update(args)
        for metric, args in zip(joint, calls, strict=True):
            metric.update(*args)

    def _member(self, name: str) -> Metric:
        metric = self._metrics.get(name)
        if metric is None:
            raise KeyError(f"MetricCollection has no metric named {name!r}; it has {list(self._metrics)}")
        return metric

    def compute(self) -> MetricValues:
        """``{name: tensor}``: each metric's values of the last sync until its own next update, then its local
        values since that sync (as ``metrics[name].compute()`` gives them)."""
        return self._groups.values()

    def sync(self, group: Any = None, *, async_op: bool = False) -> SyncHandle[MetricValues]:
        """End the interval for every metric in one collective (two for large states); ``wait()`` gives values.

        On CUDA the reduction runs on a side stream; on gloo with ``async_op=True`` the collectives are
        asynchronous. Either way local updates may continue before ``wait()``.
        """
        return self._groups.sync(group, async_op=async_op)

    def to_row(self, values: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Every scalar result as a plain ``{name: float}``; from an accelerator, in ONE transfer."""
        values = self.compute() if values is None else values
        if isinstance(values, MetricValues):
            return values.row()
        scalars = {k: v for k, v in values.items() if v.numel() == 1}
        if not scalars or self._device.type == "cpu":  # reading host memory needs no transfer
            return {k: float(v.item()) for k, v in scalars.items()}
        host = torch.stack([v.reshape(()).to(torch.float64) for v in scalars.values()]).cpu().tolist()
        return dict(zip(scalars, host, strict=True))

    def reset(self) -> None:
        """Restore every state to its default."""
        self._groups.reset()

    def state_dict(self, timeout: float = COLLECTIVE_TIMEOUT_S) -> dict[str, torch.Tensor]:
        """The GLOBAL states (``<metric>.<state>``), restorable exactly at any world size.

        A collective: call it on every rank (then save it on one). Called on one rank only, it raises
        :class:`CollectiveTimeoutError` after ``timeout`` seconds instead of hanging.
        """
        return self._groups.state_dict(timeout)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Restore global states: rank 0 takes them, other ranks start from the defaults."""
        self._groups.load_state_dict(state_dict)

    def to(self, device: Any) -> MetricCollection:
        """Move every state to ``device`` (values kept); returns self."""
        self._unpack()
        self._device = torch.device(device)
        self._groups = self._pack()
        return self


def _check_arguments(name: str, metric: Metric, args: tuple[Any, ...]) -> None:
    """Raise a TypeError naming the metric when ``args`` do not fit its ``update`` (once per call pattern)."""
    signature = inspect.signature(metric.update)
    try:
        signature.bind(*args)
    except TypeError as exc:
        takes = ", ".join(str(p.replace(annotation=inspect.Parameter.empty)) for p in signature.parameters.values())
        raise TypeError(
            f"{metric._label()}: update({takes}) got {len(args)} input(s): {exc} (a metric's several inputs go "
            f"in one tuple: {name}=(a, b))"
        ) from None


def _check_member(name: str, metric: Any) -> None:
    check_name("metric name", name)
    if not isinstance(metric, Metric):
        raise TypeError(f"Metric {name!r} is a {type(metric).__name__}, not a ray_cmf.metrics.Metric")
    if metric._groups is not None and metric._groups.prefixed:
        raise ValueError(f"Metric {name!r} already belongs to another MetricCollection")
