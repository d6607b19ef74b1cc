"""What any process needs to log into an execution: its :class:`Binding`, and a :class:`SeriesKey` for each
of its series. Both are small, frozen and picklable: they travel in every request to the store's writer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ray_cmf._names import check_name
from ray_cmf.constants import SYSTEM_METRICS_NAME

if TYPE_CHECKING:
    from ray_cmf.store import Store


@dataclass(frozen=True)
class Binding:
    """An execution and the store it lives in: all that any process needs to log into it.

    ``attempt`` counts the starts of a trial or run as the store records them (1 for the first): a restored
    or restarted one continues the count, whatever state the restarting process brought with it.
    ``trial_execution_id``: the Tune trial that a Train run runs in, whose series its series are too.
    """

    store: Store
    pipeline: str
    stage: str
    name: str
    execution_id: int
    attempt: int = 0
    trial_execution_id: int | None = None


@dataclass(frozen=True)
class SeriesKey:
    """One metric series of an execution at the writer.

    ``instance`` separates loggers whose rows must not continue one another (each ``Cmf`` object, each
    Train rank); it is empty for series that a restarted process continues (a trial's results, a run's
    steps). The writer stamps each row of an ``attempts`` series with the binding's attempt, so that rows a
    restart logs again supersede the earlier ones on read (latest attempt wins).
    """

    binding: Binding
    metrics_name: str
    instance: str = ""
    attempts: bool = False

    @classmethod
    def system(cls, binding: Binding, instance: str = "") -> SeriesKey:
        """The ``system_metrics`` series of a process of ``binding`` (of ``instance``: a Train rank's). A later
        start of the trial or run (a retry, a restore, a restart: ``attempt`` > 1) samples into one of its own
        (``attempt<N>``, or ``<instance>-<N>``), so that its samples, numbered from 1 again, neither replace
        nor repeat an earlier start's."""
        if binding.attempt > 1:
            instance = f"{instance}-{binding.attempt}" if instance else f"attempt{binding.attempt}"
        return cls(binding, SYSTEM_METRICS_NAME, instance)

    @property
    def spill_name(self) -> str:
        parts = [str(self.binding.execution_id), check_name("metrics_name", self.metrics_name)]
        return "-".join(parts + ([self.instance] if self.instance else []))
