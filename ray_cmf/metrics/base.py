"""The Metric base class: declared states with their reductions, device-only updates, packed sync."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ray_cmf.errors import RayCmfError
from ray_cmf.metrics.packing import (
    COLLECTIVE_TIMEOUT_S,
    REDUCTIONS,
    STATE_DTYPE,
    StatePack,
    SyncHandle,
    rank,
    world_size,
)
from ray_cmf.metrics.staging import Stager

NAN_POLICIES = ("exclude", "propagate")


@dataclass(frozen=True)
class StateSpec:
    """A state's default value and how ranks combine it (sum, max or min)."""

    default: torch.Tensor
    reduce: str


class Metric(ABC):
    """A metric whose states live on the device and reduce across ranks in one packed sync.

    Lifecycle: ``update`` (stages its inputs on the device: no host sync, no communication) -> ``sync``
    (ends the interval: reduces a snapshot across ranks and resets the local state unless ``cumulative``)
    -> ``compute``.
    ``compute()`` returns the last sync's global values until the next ``update``/``reset``; otherwise the
    local values. States are float64 (exact counts up to 2**53).

    Args:
        nan_policy: ``"exclude"`` (default) leaves NaN/inf out of the value and counts them in the
            ``nonfinite`` output; ``"propagate"`` lets them flow into the value.
        cumulative: Keep accumulating across syncs instead of resetting after each.
        device: Where the states live (default CPU; see ``to``).
    """

    nonfinite: torch.Tensor  # a state (see ``add_state``), under ``nan_policy="exclude"``

    def __init__(self, *, nan_policy: str = "exclude", cumulative: bool = False, device: Any = None) -> None:
        if nan_policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
        self.nan_policy = nan_policy
        self.cumulative = cumulative
        self._device = torch.device(device if device is not None else "cpu")
        self._state_specs: dict[str, StateSpec] = {}
        self._pack: StatePack | None = None
        self._owner: Any = None  # the MetricCollection that packs this metric, if any
        self._synced: dict[str, torch.Tensor] | None = None
        self._stager = Stager(self._apply, self._check)
        if nan_policy == "exclude":
            self.add_state("nonfinite", 0.0, "sum")

    # -- declaration ---------------------------------------------------------------------------------
    def add_state(self, name: str, default: float | torch.Tensor, reduce: str) -> None:
        """Declare a state with its default and its cross-rank reduction (``sum``, ``max`` or ``min``)."""
        if reduce not in REDUCTIONS:
            raise ValueError(f"State {name!r}: reduce must be one of {REDUCTIONS}, got {reduce!r}")
        tensor = torch.as_tensor(default, dtype=STATE_DTYPE).clone()
        self._state_specs[name] = StateSpec(tensor, reduce)
        setattr(self, name, tensor.to(self._device, copy=True))  # never alias the default
        self._pack = None

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def pack(self) -> StatePack:
        """This metric's own packed layout (built on first use)."""
        if self._owner is not None:
            raise RayCmfError(
                f"{type(self).__name__} belongs to a MetricCollection; sync, reset and checkpoint the collection"
            )
        if self._pack is None:
            self._pack = StatePack([("", self)], self._device)
        return self._pack

    # -- the protocol --------------------------------------------------------------------------------
    @abstractmethod
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Stage the inputs (``_stage``): no host sync, no value-dependent branch."""

    @abstractmethod
    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Outputs (``value`` first) from a set of states; must not modify them."""

    # -- staged updates (see staging.py) -----------------------------------------------------------
    def _stage(self, *inputs: Any) -> None:
        """Record one update's inputs; ``_apply`` runs on them as part of a block."""
        self._synced = None
        self._stager.push(inputs, self._device)

    def _check(self, *inputs: Any, **options: Any) -> None:
        """Raise ValueError, naming the shapes, if one update's inputs do not fit together (shapes only).

        Runs once per new input signature, so it must depend on shapes and dtypes alone. The default
        accepts any inputs.
        """
        return

    @abstractmethod
    def _apply(self, *inputs: Any, **options: Any) -> None:
        """Vectorized update: every input has a leading dimension indexing the staged updates."""

    def _fold(self) -> None:
        """Apply the staged updates (before the states are read, reduced or saved).

        A member of a collection folds the collection: its updates may be staged there, jointly.
        """
        if self._owner is not None:
            self._owner._fold()
        else:
            self._stager.flush()

    def _discard_staged(self) -> None:
        self._stager.discard()

    def _filter(self, value: torch.Tensor, fill: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Apply the NaN policy: non-finite entries become ``fill`` and are counted (see ``_needs_mask``).

        Returns the filtered values and how many were replaced: a device tensor, or None when nothing needed
        masking (under ``"propagate"``, for integers, or for a finite block on a CPU device).
        """
        if not self._needs_mask(value):
            return value, None
        bad = nonfinite(value)
        excluded = bad.sum()
        self.nonfinite.add_(excluded)
        return value.masked_fill(bad, fill), excluded

    def _needs_mask(self, *values: torch.Tensor) -> bool:
        """Whether the NaN policy must mask non-finite entries of these values (a shape and dtype check on an
        accelerator, so no host sync).

        Not under ``"propagate"``, nor for integer values. On a CPU device, reading a value waits for nothing,
        so finite sums (any NaN or inf summand makes a sum non-finite) skip the masking kernels.
        """
        if self.nan_policy == "propagate":
            return False
        floats = [value for value in values if value.is_floating_point()]
        if not floats:
            return False
        if floats[0].device.type != "cpu":
            return True
        return not all(math.isfinite(value.sum().item()) for value in floats)

    def compute(self) -> dict[str, torch.Tensor]:
        """Outputs as device tensors: the last sync's global values, else this rank's local ones."""
        if self._synced is not None:
            return self._synced
        self._fold()
        return self._compute({name: getattr(self, name) for name in self._state_specs})

    def sync(self, group: Any = None, *, async_op: bool = False) -> SyncHandle[dict[str, torch.Tensor]]:
        """End the interval: reduce a snapshot across ranks (one collective), reset local state, return a handle.

        A no-op for communication when torch.distributed is not initialized or the world size is 1.
        """
        pack = self.pack
        self._fold()
        handle = pack.reduce(group, async_op=async_op).then(lambda states: self._keep_synced(pack.states(self, states)))
        if not async_op:
            handle.wait()
        return handle

    def _keep_synced(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The outputs of a sync's reduced states, kept until the next update.

        Outputs that are views of the reduced buffer are copied (a later sync reuses it); computed ones are not.
        """
        self._synced = {k: v if v._base is None else v.clone() for k, v in self._compute(states).items()}
        return self._synced

    def reset(self) -> None:
        """Restore every state to its default."""
        self._synced = None
        self._discard_staged()
        self.pack.reset(self)

    # -- checkpointing -------------------------------------------------------------------------------
    def state_dict(self, timeout: float = COLLECTIVE_TIMEOUT_S) -> dict[str, torch.Tensor]:
        """The GLOBAL state (reduced across ranks), so it restores exactly at any world size.

        A collective: call it on every rank (then save it on one). Called on one rank only, it raises
        :class:`CollectiveTimeoutError` after ``timeout`` seconds instead of hanging.
        """
        pack = self.pack
        self._fold()
        reduced = pack.global_states(timeout)
        return {name: view.clone() for name, view in pack.states(self, reduced).items()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Restore a global state: rank 0 takes it, other ranks start from the defaults."""
        self._discard_staged()
        load_global_state(self.pack, [("", self)], state_dict)
        self._synced = None

    def to(self, device: Any) -> Metric:
        """Move the states to ``device`` (values kept); returns self."""
        if self._owner is not None:
            raise RayCmfError(f"{type(self).__name__} belongs to a MetricCollection; move the collection instead")
        self._fold()
        self._stager.discard()
        self._device = torch.device(device)
        for name in self._state_specs:
            setattr(self, name, getattr(self, name).to(self._device))
        self._pack = None
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nan_policy={self.nan_policy!r}, cumulative={self.cumulative})"


def nonfinite(value: torch.Tensor) -> torch.Tensor:
    """Mask of the NaN and ±inf entries of a floating tensor.

    ``x - x`` is 0 for every finite ``x`` and NaN otherwise: two cheap kernels, where ``isfinite`` runs four.
    """
    return torch.isnan(value - value)


def load_global_state(
    pack: StatePack, members: list[tuple[str, Metric]], state_dict: Mapping[str, torch.Tensor]
) -> None:
    """Put a global state into rank 0's local state and defaults everywhere else (exact for sum/max/min)."""
    expected = {f"{prefix}{name}" for prefix, metric in members for name in metric._state_specs}
    missing, extra = expected - set(state_dict), set(state_dict) - expected
    if missing or extra:
        raise RayCmfError(f"Metric state_dict does not match: missing {sorted(missing)}, unexpected {sorted(extra)}")
    pack.reset()
    if world_size() > 1 and rank() != 0:
        return
    for prefix, metric in members:
        for name, view in pack.states(metric).items():
            view.copy_(torch.as_tensor(state_dict[f"{prefix}{name}"]).to(view.device, STATE_DTYPE).view(view.shape))
