"""Comparing trials after a sweep (read side only: never writes the store)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

ATTEMPT_COLUMN = "attempt"
STEP_COLUMN = "training_iteration"


def dedup_attempts(frame: pd.DataFrame, step: str = STEP_COLUMN) -> pd.DataFrame:
    """One row per step: where a restored trial re-reported steps, keep the latest attempt's row."""
    if step not in frame.columns or ATTEMPT_COLUMN not in frame.columns:
        return frame
    ordered = frame.sort_values([step, ATTEMPT_COLUMN], kind="stable")
    return ordered.drop_duplicates(subset=[step], keep="last")
