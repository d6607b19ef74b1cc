"""The Metric base class: declared states with their reductions, device-only updates, packed sync."""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ray_cmf.errors import RayCmfError
from ray_cmf.metrics.groups import MetricGroups
from ray_cmf.metrics.packing import COLLECTIVE_TIMEOUT_S, REDUCTIONS, STATE_DTYPE, SyncHandle, without_addresses
from ray_cmf.metrics.staging import Stager, raise_naming_input

NAN_POLICIES = ("exclude", "propagate")
RECORDED_VALUES = 16  # a tensor setting of at most this many values is recorded by its values, else by a digest


@dataclass(frozen=True)
class StateSpec:
    """A state's default value, how ranks combine it (sum, max or min), and what a checkpoint that predates
    the state loads it as (None: such a checkpoint is refused)."""

    default: torch.Tensor
    reduce: str
    missing: torch.Tensor | None = None


class Metric(ABC):
    """A metric whose states live on the device and reduce across ranks in one packed sync.

    Lifecycle: ``update`` (stages its inputs on the device: no host sync, no communication) -> ``sync``
    (ends the interval: reduces a snapshot across ranks and resets the local state unless ``cumulative``)
    -> ``compute``.
    ``compute()`` returns the last sync's global values until the next ``update``/``reset``; otherwise the
    local values. States are float64 (exact counts up to 2**53).

    A subclass declares its states (``add_state``) and implements its math vectorized over a group of
    metrics of its kind: ``_apply`` and ``_compute`` see each state as ``(members, *shape)``, so one call
    serves every metric of the kind in a collection. Settings that change the math are its public
    attributes, or what ``_config`` returns. The math must not depend on the order of the updates: ``_apply``
    gets them grouped by input shape, not in call order, and ranks merge their states by each state's
    reduction.

    Args:
        nan_policy: ``"exclude"`` (default) leaves NaN/inf out of the value and counts them in the
            ``nonfinite`` output; ``"propagate"`` lets them flow into the value.
        cumulative: Keep accumulating across syncs instead of resetting after each.
        device: Where the states live (default CPU; see ``to``).
    """

    nonfinite: torch.Tensor  # a state (see ``add_state``), under ``nan_policy="exclude"``
    higher_is_better: bool | None = None  # whether a higher value is better (None: it depends on what it measures)
    _stage_dtype: torch.dtype | None = None  # what staged inputs are converted to as they are copied (None: kept)
    _stages_arguments = False  # whether ``update(*args)`` stages ``args`` as given (a joint update may stage them)

    def __init__(self, *, nan_policy: str = "exclude", cumulative: bool = False, device: Any = None) -> None:
        if nan_policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
        self.nan_policy = nan_policy
        self.cumulative = cumulative
        self._device = torch.device(device if device is not None else "cpu")
        self._state_specs: dict[str, StateSpec] = {}
        self._groups: MetricGroups | None = None  # the packed groups this metric belongs to (built on first use)
        self._group = self._member = 0  # where it sits in them
        self._stager: Stager | None = None
        self._updated_in = -1  # the sync interval of its last update
        if nan_policy == "exclude":
            self.add_state("nonfinite", 0.0, "sum")

    # -- declaration ---------------------------------------------------------------------------------
    def add_state(
        self, name: str, default: float | torch.Tensor, reduce: str, missing: float | torch.Tensor | None = None
    ) -> None:
        """Declare a state with its default and its cross-rank reduction (``sum``, ``max`` or ``min``).

        ``missing``: the value the state takes from a checkpoint saved before it was declared (a state added in
        a later version); None refuses such a checkpoint.
        """
        if reduce not in REDUCTIONS:
            raise ValueError(f"State {name!r}: reduce must be one of {REDUCTIONS}, got {reduce!r}")
        if self._groups is not None:
            raise RayCmfError(f"{type(self).__name__}: declare state {name!r} before the first update")
        tensor = torch.as_tensor(default, dtype=STATE_DTYPE).clone()
        absent = None if missing is None else torch.as_tensor(missing, dtype=STATE_DTYPE).expand(tensor.shape)
        self._state_specs[name] = StateSpec(tensor, reduce, absent)
        setattr(self, name, tensor.to(self._device, copy=True))  # never alias the default

    def _config(self) -> tuple[Any, ...]:
        """Settings that change this metric's math: metrics of one class and config are updated and computed
        together, by the first one's ``_apply`` and ``_compute``. By default every public attribute that is no
        state (``self.threshold = 0.5`` in a subclass's ``__init__``), as ``(name, value)`` pairs, so metrics
        whose settings differ are never computed as one; a subclass may return its settings itself."""
        return tuple((name, _hashable(value)) for name, value in self._own_settings())

    def _state_settings(self) -> tuple[Any, ...]:
        """The settings that give the states their meaning (by default every setting, ``_config``): a checkpoint
        records them, and one saved under others is refused. A setting that only shapes the outputs (a
        Histogram's quantiles) may be left out, so that changing it keeps the checkpoints."""
        return self._config()

    def saved_as(self) -> str:
        """The class and the settings that give the states their meaning, as a checkpoint names them, e.g.
        ``Histogram(8, 0, 1)``."""
        if type(self)._config is Metric._config and type(self)._state_settings is Metric._state_settings:
            settings = ", ".join(f"{name}={_recorded(value)}" for name, value in self._own_settings())
        else:
            settings = ", ".join(_recorded(value) for value in self._state_settings())
        return f"{type(self).__name__}({settings})"

    def _own_settings(self) -> list[tuple[str, Any]]:
        """The public attributes a subclass set, by name, that are neither states nor the base class's."""
        ours = ("nan_policy", "cumulative", *self._state_specs)
        return [(k, v) for k, v in sorted(vars(self).items()) if not k.startswith("_") and k not in ours]

    def kind(self) -> tuple[Any, ...]:
        """What metrics must share to be updated and computed as one group."""
        states = tuple((name, spec.reduce, tuple(spec.default.shape)) for name, spec in self._state_specs.items())
        return (type(self), self.nan_policy, self._config(), states)

    @property
    def device(self) -> torch.device:
        return self._device

    def _solo(self) -> MetricGroups:
        """This metric's own packed layout, unless it belongs to a collection (built on first use)."""
        if self._groups is None:
            self._groups = MetricGroups([("", self)], self._device, prefixed=False)
        elif self._groups.prefixed:
            raise RayCmfError(
                f"{type(self).__name__} belongs to a MetricCollection; sync, reset, move and checkpoint the collection"
            )
        return self._groups

    # -- the protocol --------------------------------------------------------------------------------
    @abstractmethod
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Stage the inputs (``_stage``): no host sync, no value-dependent branch."""

    @abstractmethod
    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Outputs (``value`` first), each ``(members, ...)``, from states ``(members, *shape)``; must not modify
        them."""

    def _stage(self, *inputs: Any) -> None:
        """Record one update's inputs; ``_apply`` runs on them as part of a block (see staging.py)."""
        groups = self._groups or self._solo()
        try:
            self._stager.push(self._member, inputs)  # type: ignore[union-attr]
        except TypeError as exc:
            raise_naming_input(exc, inputs, lambda i: (self._label(), i))
        except ValueError as exc:  # inputs that do not fit together (``_check``)
            raise ValueError(f"{self._label()}: {exc}") from None
        self._updated_in = groups.interval
        groups.updated = True

    def _label(self) -> str:
        """How errors name this metric: ``metric 'loss' (Mean)`` in a collection, else its class."""
        groups = self._groups
        if groups is None or not groups.prefixed:
            return type(self).__name__
        name = next(name for name, metric in groups.named if metric is self)
        return f"metric {name!r} ({type(self).__name__})"

    def _check_update(self, args: tuple[Any, ...]) -> None:
        """Raise as ``update(*args)`` would on bad inputs, staging nothing (a joint update checks first)."""
        stager = self._stager
        assert stager is not None, "a member of a collection has its stager"
        if stager.seen(args):  # the common case: inputs of the latest update's signature, checked then
            return
        self._stage = lambda *inputs: stager.check(inputs)  # type: ignore[method-assign]
        try:
            self.update(*args)
        except TypeError as exc:
            raise_naming_input(exc, args, lambda i: (self._label(), i))
        except ValueError as exc:
            raise ValueError(f"{self._label()}: {exc}") from None
        finally:
            del self._stage

    def _check(self, *inputs: Any, **options: Any) -> None:
        """Raise ValueError, naming the shapes, if one update's inputs do not fit together (shapes only); the
        caller puts the metric's name in front.

        Runs once per new input signature, so it must depend on shapes and dtypes alone. The default
        accepts any inputs.
        """
        return

    @abstractmethod
    def _apply(
        self, states: Mapping[str, torch.Tensor], inputs: list[torch.Tensor], valid: torch.Tensor | None
    ) -> None:
        """Vectorized update of a group: states are ``(members, *shape)``, every input ``(members, rows, *shape)``,
        ``valid`` the ``(members, rows)`` rows that hold an update (None: all of them). The rows of one call are
        updates of one input signature, in the order they were made; updates of another signature (a smaller
        last batch), or of a joint call, come in another call, before or after."""

    def _filter(
        self, states: Mapping[str, torch.Tensor], values: torch.Tensor, fill: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Apply the NaN policy to ``(members, ...)`` values: non-finite entries become ``fill`` and are counted.

        Returns the filtered values and how many were replaced per member: a device tensor, or None when nothing
        needed masking (see ``_needs_mask``).
        """
        if not self._needs_mask(values):
            return values, None
        bad = nonfinite(values)
        excluded = bad.sum(per_member(bad))
        states["nonfinite"].add_(excluded)
        return values.masked_fill(bad, fill), excluded

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
        groups = self._groups
        if groups is None or not groups.prefixed:
            groups = self._solo()
        return groups.values_of(self)

    def sync(self, group: Any = None, *, async_op: bool = False) -> SyncHandle[Mapping[str, torch.Tensor]]:
        """End the interval: reduce a snapshot across ranks (one collective), reset local state, return a handle.

        A no-op for communication when torch.distributed is not initialized or the world size is 1.
        """
        return self._solo().sync(group, async_op=async_op)  # type: ignore[return-value]

    def reset(self) -> None:
        """Restore every state to its default."""
        self._solo().reset()

    # -- checkpointing -------------------------------------------------------------------------------
    def state_dict(self, timeout: float = COLLECTIVE_TIMEOUT_S) -> dict[str, torch.Tensor]:
        """The GLOBAL state (reduced across ranks), so it restores exactly at any world size.

        A collective: call it on every rank (then save it on one). Called on one rank only, it raises
        :class:`CollectiveTimeoutError` after ``timeout`` seconds instead of hanging.
        """
        return self._solo().state_dict(timeout)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Restore a global state: rank 0 takes it, other ranks start from the defaults."""
        self._solo().load_state_dict(state_dict)

    def to(self, device: Any) -> Metric:
        """Move the states to ``device`` (values kept); returns self."""
        if self._groups is not None:
            self._solo().fold()
        self.detach()
        self._device = torch.device(device)
        for name in self._state_specs:
            setattr(self, name, getattr(self, name).to(self._device))
        return self

    def detach(self) -> None:
        """Leave the packed layout (after its staged updates were applied): the states keep their values."""
        for name in self._state_specs:
            setattr(self, name, getattr(self, name).clone())
        self._groups, self._stager = None, None

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle takes: the staged updates applied first (see ``MetricGroups.settle``), and the
        states as the packed buffer holds them, whose copy makes them views of it again (``StatePack``)."""
        if self._groups is None:
            return vars(self).copy()
        self._groups.settle()
        return {k: v for k, v in vars(self).items() if k not in self._state_specs}

    def __repr__(self) -> str:
        """The class and every setting (``_config``'s values first), e.g. ``Accuracy(2, None, ...)``: ranks whose
        metrics differ in any of them are told so at the first sync."""
        if type(self)._config is Metric._config:  # settings found by name: shown by name
            config = "".join(f"{name}={_shown(value)}, " for name, value in self._own_settings())
        else:
            config = "".join(f"{value!r}, " for value in self._config())
        return f"{type(self).__name__}({config}nan_policy={self.nan_policy!r}, cumulative={self.cumulative})"


def _shown(setting: Any) -> str:
    """A setting as ranks compare it: a tensor by its shape and dtype, since each rank holds its own on its own
    device (reading its values would wait for the device), anything else by its repr."""
    if isinstance(setting, torch.Tensor):
        return f"tensor(shape={tuple(setting.shape)}, dtype={setting.dtype})"
    return repr(_python(setting))


def _recorded(setting: Any) -> str:
    """A setting as a checkpoint records it, so that equal settings read alike however they were written: a
    number by its value (``1``, ``1.0``, ``True`` and NumPy's ``1`` are ``1``; ``-0.0`` is ``0``), a tuple as
    the list it equals, a dict or a set in order, a tensor or array by its values (a large one by a digest of them,
    read once, when saved or loaded), anything else by its repr less memory addresses (a function by name)."""
    setting = _python(setting)
    if isinstance(setting, np.ndarray) and setting.dtype != object:
        setting = torch.from_numpy(setting)
    if isinstance(setting, torch.Tensor):
        values = setting.detach().cpu().contiguous()
        if values.numel() <= RECORDED_VALUES:
            return f"tensor({values.tolist()!r}, dtype={values.dtype})"
        digest = hashlib.sha256(values.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
        return f"tensor(shape={tuple(values.shape)}, dtype={values.dtype}, sha256={digest})"
    if isinstance(setting, (bool, int, float)):
        exact = math.isfinite(setting) and setting == int(setting) and abs(setting) <= 2**53
        return repr(int(setting)) if exact else repr(setting)  # a bool is always exact: True reads 1
    if isinstance(setting, (list, tuple)):
        return f"[{', '.join(map(_recorded, setting))}]"
    if isinstance(setting, (set, frozenset)):  # in order: a set's repr follows its hashes, which vary by process
        return "{" + ", ".join(sorted(map(_recorded, setting))) + "}"
    if isinstance(setting, dict):
        items = sorted((_recorded(k), _recorded(v)) for k, v in setting.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    return without_addresses(repr(setting))


def _python(setting: Any) -> Any:
    """A NumPy scalar as the Python number it holds (``np.float64(0.5)`` reprs unlike ``0.5``, and unlike
    itself across NumPy versions); anything else as it is."""
    return setting.item() if isinstance(setting, np.generic) else setting


def _hashable(value: Any) -> Any:
    """A setting as part of a group's key: itself, or its repr where it cannot be one (a list, a dict)."""
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def rows_mask(valid: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``valid`` ``(members, rows)`` shaped to broadcast against ``like`` ``(members, rows, ...)``."""
    return valid.view(*valid.shape, *([1] * (like.dim() - 2)))


def per_member(tensor: torch.Tensor) -> tuple[int, ...]:
    """The dimensions of a ``(members, ...)`` tensor that a per-member reduction folds."""
    return tuple(range(1, tensor.dim()))


def nonfinite(value: torch.Tensor) -> torch.Tensor:
    """Mask of the NaN and ±inf entries of a floating tensor.

    ``x - x`` is 0 for every finite ``x`` and NaN otherwise: two cheap kernels, where ``isfinite`` runs four.
    """
    return torch.isnan(value - value)
