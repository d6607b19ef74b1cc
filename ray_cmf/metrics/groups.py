"""Metrics grouped by kind over one packed buffer: one vectorized update and one compute per group.

Metrics of one kind (class, NaN policy and configuration, see ``Metric.kind``) share their math, so a
group of them is updated, computed and read as one: its states are ``(members, *shape)`` views of the
pack, its staged updates one block per signature. A sync then costs a fixed number of ops per kind,
whatever the number of metrics. A standalone metric is a group of one, with unprefixed names.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ray_cmf.errors import RayCmfError
from ray_cmf.metrics.packing import (
    COLLECTIVE_TIMEOUT_S,
    STATE_DTYPE,
    GroupStates,
    StatePack,
    SyncHandle,
    rank,
    world_size,
)
from ray_cmf.metrics.staging import Stager, from_host, raise_naming_input

if TYPE_CHECKING:
    from ray_cmf.metrics.base import Metric

log = logging.getLogger(__name__)
Outputs = list[dict[str, torch.Tensor]]  # per group: each output of all its members, shaped (members, ...)


class Names:
    """Where each named output of a pack lives, and how a row of scalars is read (built once per pack).

    ``scalars`` lists the outputs of one value per metric, (group, output); their values, concatenated, hold
    ``row_keys[i]`` at ``row_positions[i]``. ``shown`` are the keys of every metric but the ``hidden`` ones (a
    logger's own, see ``MetricCollection``), which only a row that asks for them holds.
    """

    def __init__(
        self,
        named: Sequence[tuple[str, int, int]],
        outputs: Outputs,
        key: Callable[[str, str], str],
        hidden: Collection[str] = (),
    ):
        self.index: dict[str, tuple[int, str, int]] = {}
        whose: dict[str, tuple[str, str]] = {}
        for name, g, member in named:
            for output in outputs[g]:
                k = key(name, output)
                if k in whose:  # one would replace the other in every row
                    raise RayCmfError(f"{k!r} is {_output_of(*whose[k])} and {_output_of(name, output)}: rename one")
                whose[k], self.index[k] = (name, output), (g, output, member)
        self.shown = {k: self.index[k] for k, (name, _) in whose.items() if name not in hidden}
        self.scalars = [(g, output) for g, out in enumerate(outputs) for output, t in out.items() if t[0].numel() == 1]
        begin, start = 0, {}
        for g, output in self.scalars:
            start[g, output] = begin
            begin += outputs[g][output].shape[0]
        scalar_keys = [(k, where) for k, where in self.index.items() if (where[0], where[1]) in start]
        self.row_keys = [k for k, _ in scalar_keys]
        self.row_positions = [start[g, output] + member for _, (g, output, member) in scalar_keys]
        self.row_shown = [whose[k][0] not in hidden for k in self.row_keys]


def _output_of(name: str, output: str) -> str:
    return f"metric {name!r}" if output == "value" else f"output {output!r} of {name!r}"


class MetricValues(Mapping[str, torch.Tensor]):
    """The results of a compute or a sync: ``{name: tensor}``, held per group and indexed on access.

    ``row()`` gives every scalar result as a float, in one transfer from an accelerator. A logger's own
    metrics (see ``MetricCollection``) are not among the keys, and only in a row that asks for them.
    """

    def __init__(self, names: Names, outputs: Outputs) -> None:
        self.names, self.outputs = names, outputs

    def __getitem__(self, key: str) -> torch.Tensor:
        g, output, member = self.names.shown[key]
        return self.outputs[g][output][member]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names.shown)

    def __len__(self) -> int:
        return len(self.names.shown)

    def __repr__(self) -> str:
        return f"MetricValues({dict(self)!r})"

    def member(self, g: int, member: int) -> dict[str, torch.Tensor]:
        """One metric's outputs, by their own names."""
        return {output: tensors[member] for output, tensors in self.outputs[g].items()}

    def row(self, *, hidden: bool = False) -> dict[str, float]:
        """Every scalar result as a plain float, read in one ``tolist`` (and one transfer from an accelerator);
        ``hidden``: a logger's own metrics' too."""
        names = self.names
        if not names.scalars:
            return {}
        parts = [self.outputs[g][output] for g, output in names.scalars]
        flat = torch.cat([part if part.dim() == 1 else part.reshape(-1) for part in parts]).to(STATE_DTYPE)
        values = (flat if flat.device.type == "cpu" else flat.cpu()).tolist()  # host memory needs no transfer
        row = zip(names.row_keys, map(values.__getitem__, names.row_positions), names.row_shown, strict=True)
        return {key: value for key, value, shown in row if shown or hidden}


class _Group:
    """The metrics of one kind in a pack: their stager, and their math through the first member."""

    def __init__(self, members: list[Metric], index: int, pack: StatePack) -> None:
        self.lead, self.index, self.pack = members[0], index, pack
        self.size = len(members)
        self.stager = Stager(
            self.size, pack.device, self._apply, self._apply_one, self.lead._check, self.lead._stage_dtype
        )

    def _apply(self, inputs: list[torch.Tensor], valid: torch.Tensor | None) -> None:
        self.lead._apply(self.pack.live[self.index], inputs, valid)

    def _apply_one(self, member: int, inputs: list[torch.Tensor]) -> None:
        states = {name: view[member : member + 1] for name, view in self.pack.live[self.index].items()}
        self.lead._apply(states, inputs, None)


MAX_PATTERNS = 8  # call patterns of a joint update staged at once (each keeps its own blocks)
Pattern = tuple[tuple[str, ...], tuple[int, ...]]  # a joint update's metric names and their input counts


class _Joint:
    """The staged joint updates of one call pattern (``MetricCollection.update(loss=..., acc=...)``): the
    call's inputs share one block row, so a step's update is one signature check and one copy per input.
    When the block is applied, each metric's columns update it alone: a joint call names a few metrics,
    and their math runs once per block."""

    def __init__(self, groups: MetricGroups, metrics: list[Metric], counts: tuple[int, ...]) -> None:
        self.groups, self.metrics = groups, metrics
        bounds = [sum(counts[:i]) for i in range(len(counts) + 1)]
        self.parts = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        self.stager = Stager(1, groups.device, self._apply, self._apply_one, self._check)

    def _apply(self, columns: list[torch.Tensor], valid: torch.Tensor | None) -> None:
        for metric, part in zip(self.metrics, self.parts, strict=True):
            self.groups.groups[metric._group]._apply_one(metric._member, columns[part])

    def _apply_one(self, _: int, columns: list[torch.Tensor]) -> None:
        self._apply(columns, None)

    def _check(self, *inputs: Any) -> None:
        for metric, part in zip(self.metrics, self.parts, strict=True):
            try:
                metric._check(*inputs[part])
            except ValueError as exc:
                raise ValueError(f"{metric._label()}: {exc}") from None

    def label_of(self, index: int) -> tuple[str, int]:
        """How errors name the metric whose inputs hold the call's ``index``-th input, and its position among them."""
        metric, part = next((m, p) for m, p in zip(self.metrics, self.parts, strict=True) if p.start <= index < p.stop)
        return metric._label(), index - part.start


class MetricGroups:
    """Named metrics packed by kind: updates, local and synced values, reset and checkpoints.

    ``prefixed`` names outputs ``<name>`` (the value) and ``<name>_<output>``, and states ``<name>.<state>``
    (a collection); otherwise outputs and states keep their own names (a standalone metric). The ``hidden``
    metrics (a logger's own) are synced and read like the others, but their values are not listed and their
    states are not checkpointed: they hold nothing between a logger's syncs.
    """

    def __init__(
        self,
        named: Sequence[tuple[str, Metric]],
        device: torch.device,
        *,
        prefixed: bool,
        hidden: Collection[str] = (),
    ) -> None:
        self.device, self.prefixed, self.hidden = device, prefixed, frozenset(hidden)
        kinds: dict[Any, list[tuple[str, Metric]]] = {}
        for name, metric in named:
            kinds.setdefault(metric.kind(), []).append((name, metric))
        prefix = "{}." if prefixed else ""
        self.pack = StatePack([[(prefix.format(name), m) for name, m in members] for members in kinds.values()], device)
        self.groups = [_Group([m for _, m in members], g, self.pack) for g, members in enumerate(kinds.values())]
        self.named = [(name, m) for members in kinds.values() for name, m in members]
        for g, members in enumerate(kinds.values()):
            for member, (_, metric) in enumerate(members):
                metric._groups, metric._group, metric._member = self, g, member
                metric._stager = self.groups[g].stager
        self.interval = 0  # syncs so far: a metric updated in the current interval has ``_updated_in`` equal to it
        self.updated = False  # whether any metric was updated since the last sync
        self.synced: MetricValues | None = None
        self._in_flight: SyncHandle[MetricValues] | None = None  # the latest sync, until it completes
        self._names: Names | None = None
        self._joint: dict[Pattern, _Joint] = {}

    # -- values ----------------------------------------------------------------------------------------
    def push_joint(self, pattern: Pattern, metrics: list[Metric], inputs: list[Any]) -> None:
        """Stage one joint update: ``inputs`` are the named metrics' staged inputs, in ``pattern``'s order."""
        joint = self._joint.get(pattern)
        if joint is None:
            if len(self._joint) == MAX_PATTERNS:
                self._flush_joint()
                self._joint.clear()
            joint = self._joint[pattern] = _Joint(self, metrics, pattern[1])
        try:
            joint.stager.push(0, inputs)
        except TypeError as exc:
            raise_naming_input(exc, inputs, joint.label_of)
        for metric in metrics:
            metric._updated_in = self.interval
        self.updated = True

    def _flush_joint(self) -> None:
        for joint in self._joint.values():
            joint.stager.flush()

    def fold(self) -> None:
        """Apply every staged update (before the states are read, reduced or saved)."""
        self._flush_joint()
        for group in self.groups:
            group.stager.flush()

    def settle(self) -> None:
        """Fold the staged updates and wait for a sync in flight: what a copy or a pickle of the metrics must
        see first, since neither takes staged rows (their blocks write where the original reads) nor a pending
        collective."""
        if self._in_flight is not None:
            self._in_flight.wait()
        self.fold()

    def __getstate__(self) -> dict[str, Any]:
        self.settle()
        return {**vars(self), "_joint": {}, "_in_flight": None}

    def _values(self, states: GroupStates, *, keep: bool) -> MetricValues:
        """Every group's outputs from ``states``; ``keep`` copies those that view a buffer a later sync reuses."""
        outputs = [group.lead._compute(states[group.index]) for group in self.groups]
        if keep:
            outputs = [{k: v if v._base is None else v.clone() for k, v in out.items()} for out in outputs]
        if self._names is None:  # a kind's outputs never change
            where = [(name, metric._group, metric._member) for name, metric in self.named]
            self._names = Names(where, outputs, self._key, self.hidden)
        return MetricValues(self._names, outputs)

    def _key(self, name: str, output: str) -> str:
        if not self.prefixed:
            return output
        return name if output == "value" else f"{name}_{output}"

    def values(self) -> MetricValues:
        """Each metric's last global values (of the last sync) until its own next update, else its local ones.
        A sync still in flight is waited for (on an accelerator, ordered on the stream: no host sync)."""
        if self.synced is None and self._in_flight is not None:
            self._in_flight.wait()
        synced = self.synced
        if synced is not None and not self.updated:
            return synced
        local = self._local()
        if synced is None:
            return local
        fresh = [[True] * group.size for group in self.groups]  # which members take the local values
        for _, metric in self.named:
            fresh[metric._group][metric._member] = metric._updated_in == self.interval
        outputs = []
        for g, (now, then) in enumerate(zip(local.outputs, synced.outputs, strict=True)):
            pick = from_host(torch.tensor(fresh[g]), self.device)
            outputs.append({k: torch.where(pick.view(-1, *[1] * (v.dim() - 1)), v, then[k]) for k, v in now.items()})
        return MetricValues(local.names, outputs)

    def values_of(self, metric: Metric) -> dict[str, torch.Tensor]:
        """One metric's outputs (by their own names), as :meth:`values` gives them."""
        return self.values().member(metric._group, metric._member)

    def _local(self) -> MetricValues:
        """This rank's values now: every staged update applied."""
        self.fold()
        return self._values(self.pack.live, keep=False)

    def sync(self, group: Any = None, *, async_op: bool = False) -> SyncHandle[MetricValues]:
        """End the interval: reduce a snapshot across ranks, reset local states, keep the global values."""
        self.fold()
        interval = self.interval + 1

        def finish(states: GroupStates) -> MetricValues:
            values = self._values(states, keep=True)
            if interval == self.interval:  # the latest sync started: an earlier one waited for late keeps out
                self.synced = values
            return values

        handle = self.pack.reduce(group, async_op=async_op).then(finish)
        self.synced, self.interval, self.updated = None, interval, False  # its values once it completes
        self._in_flight = handle
        if not async_op:
            handle.wait()
        return handle

    def reset(self) -> None:
        """Every state back to its default; staged updates and synced values dropped (those of a sync in flight
        too)."""
        self.discard_staged()
        self.pack.reset()
        self.synced, self._in_flight = None, None
        self.interval += 1  # a sync in flight keeps its values to itself

    def discard_staged(self) -> None:
        self._joint.clear()
        for group in self.groups:
            group.stager.discard()

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self, timeout: float = COLLECTIVE_TIMEOUT_S) -> dict[str, torch.Tensor]:
        """The global states (a collective: every rank calls it), restorable exactly at any world size; the
        hidden metrics' are left out."""
        self.fold()
        states = self.pack.named_states(self.pack.global_states(timeout).clone())
        saved = {key: state for key, state in states.items() if key not in self._hidden_states()}
        return saved | {self._state_key(name, SAVED_AS): _text(m.saved_as()) for name, m in self._shown_metrics()}

    def _shown_metrics(self) -> list[tuple[str, Metric]]:
        return [(name, metric) for name, metric in self.named if name not in self.hidden]

    def _state_key(self, name: str, state: str) -> str:
        return f"{name}.{state}" if self.prefixed else state

    def _hidden_states(self) -> dict[str, torch.Tensor]:
        """The hidden metrics' states, by key, at their defaults."""
        slots = [slot for slot in self.pack.slots if slot.prefix.removesuffix(".") in self.hidden]
        return {slot.key: slot.owner._state_specs[slot.name].default for slot in slots}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Put a global state into rank 0's local state and defaults everywhere else (exact for sum/max/min).
        The hidden metrics' states are optional (earlier versions saved them)."""
        self._check_saved_as(state_dict)
        states = {k: v for k, v in state_dict.items() if not _is_saved_as(k)}
        absent = {slot.key: slot.owner._state_specs[slot.name].missing for slot in self.pack.slots}
        absent.update(self._hidden_states())
        saved = {**{k: v for k, v in absent.items() if v is not None}, **states}  # states added since it was saved
        missing, extra = set(absent) - set(saved), set(saved) - set(absent)
        if missing or extra:
            raise RayCmfError(
                f"Metric state_dict does not match: missing {sorted(missing)}, unexpected {sorted(extra)}"
            )
        views = self.pack.named_states(self.pack.flat)
        given = {key: torch.as_tensor(saved[key]) for key in views}
        if wrong := [key for key, view in views.items() if given[key].numel() != view.numel()]:
            sizes = (
                f"{k!r} holds {tuple(given[k].shape)} values where this metric's state is {tuple(views[k].shape)}"
                for k in wrong
            )
            raise RayCmfError(
                f"Metric state_dict does not match: {'; '.join(sizes)} (it was saved from other settings, such as "
                "another number of Histogram bins)"
            )
        self.reset()
        if world_size() > 1 and rank() != 0:
            return
        for key, view in views.items():
            view.copy_(given[key].to(view.device, STATE_DTYPE).view(view.shape))

    def _check_saved_as(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Refuse a state saved from metrics of another class or with other settings (``Metric.saved_as``), where
        its values would load and mean something else; a state saved before these were kept cannot be checked,
        and says so."""
        shown = self._shown_metrics()
        if shown and not any(_is_saved_as(key) for key in state_dict):
            log.warning(
                "ray_cmf: this metric state_dict holds no metric's class and settings (it predates their recording): "
                "they are not checked; load it only into the metrics it was saved from"
            )
        unlike = []
        for name, metric in shown:
            key = self._state_key(name, SAVED_AS)
            if key in state_dict and (was := _read_text(key, state_dict[key])) != (now := metric.saved_as()):
                what = f"metric {name!r}" if self.prefixed else "the metric"
                unlike.append(f"{what} was saved as {was} and is {now} here")
        if unlike:
            raise RayCmfError(f"Metric state_dict does not match: {'; '.join(unlike)}")


SAVED_AS = "__metric__"  # the state_dict's key, beside each metric's states, for what it was saved as


def _text(text: str) -> torch.Tensor:
    """Text as a tensor of its UTF-8 bytes: a state_dict holds tensors only, as torch's checkpoints expect."""
    return torch.tensor(list(text.encode()), dtype=torch.uint8)


def _read_text(key: str, tensor: torch.Tensor) -> str:
    """The text :func:`_text` made; an error that names ``key`` where it holds something else."""
    held = torch.as_tensor(tensor)
    if held.dtype != torch.uint8 or held.dim() != 1:
        said = f"{key!r} holds {held!r:.80}, not what a metric was saved as"
        raise RayCmfError(f"Metric state_dict does not match: {said}")
    return bytes(held.tolist()).decode(errors="replace")


def _is_saved_as(key: str) -> bool:
    """Whether a state_dict's key records what a metric was saved as (its own, or a collection member's)."""
    return key == SAVED_AS or key.endswith(f".{SAVED_AS}")
