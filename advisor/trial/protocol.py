"""What the parent hands a trial child (JSON in); the child answers with a `TrialResult`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.config import TrialConfig

__all__ = ["TrialRequest"]


class TrialRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: str
    cwd: str
    config: TrialConfig
    mode: Literal["trial", "validate"] = "trial"
    warmup_steps: int = Field(default=3, ge=1)
    trial_seconds: float = Field(default=3.0, gt=0)
    max_measure_steps: int | None = Field(default=None, ge=1)
    seed: int = 0
    launched_at: float = Field(description="time.time() when the parent started the child")
    result_path: str
    phase_path: str | None = None
