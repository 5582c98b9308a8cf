"""What was measured and what was concluded, as data (pydantic, frozen).

- `_trial`: the machine (`HardwareProfile`), the task (`TaskSummary`), one trial's
  `TrialResult` and its stored `TrialRecord`;
- `_convergence`: the learning rate a racer trains with, its loss curve, gradient norms, the
  noise scale and what it predicts, a batch-size schedule;
- `_confirmation`: whether the paired re-runs support the speed-up claimed;
- `_race`: the racers, the race and schedule summaries and their verdicts;
- `_effort`: where the search spent its trials, and the knob values it rejected;
- `_recommendation`: the `Recommendation`, its findings, and the `TuneResult`.
"""

from advisor.results._confirmation import (
    Confirmation,
)
from advisor.results._convergence import (
    REACHED_IN_A_ROW,
    BatchPrediction,
    BatchSchedule,
    GradientNorms,
    LossKind,
    LrPlan,
    LrRule,
    NoisePoint,
    NoiseProbe,
    NoiseScale,
    NoiseTrack,
    RaceCurve,
    RacePoint,
    ScheduleStage,
    stop_index,
)
from advisor.results._effort import BatchEffort, Rejected, SearchEffort
from advisor.results._race import (
    Racer,
    RacerRole,
    RaceSummary,
    RaceVerdict,
    ScheduleSummary,
    ScheduleVerdict,
    TimeToLoss,
    did_not_fall,
    reference_racer,
)
from advisor.results._recommendation import (
    Bottleneck,
    Efficiency,
    FixedKnob,
    KnobEffect,
    LayoutBest,
    Notice,
    Recommendation,
    RejectedValue,
    StudySetup,
    ThroughputPick,
    Tie,
    TuneResult,
    shown_knobs,
)
from advisor.results._trial import (
    BUSY_CORES,
    BUSY_STEAL,
    FailurePhase,
    GpuInfo,
    HardwareProfile,
    MachineLoad,
    PrunedProposal,
    RankResult,
    TaskSummary,
    TrialRecord,
    TrialResult,
    TrialRole,
    TrialStatus,
    relative_spread,
)

__all__ = [
    "BUSY_CORES",
    "BUSY_STEAL",
    "REACHED_IN_A_ROW",
    "BatchEffort",
    "BatchPrediction",
    "BatchSchedule",
    "Bottleneck",
    "Confirmation",
    "Efficiency",
    "FailurePhase",
    "FixedKnob",
    "GpuInfo",
    "GradientNorms",
    "HardwareProfile",
    "KnobEffect",
    "LayoutBest",
    "LossKind",
    "LrPlan",
    "LrRule",
    "MachineLoad",
    "NoisePoint",
    "NoiseProbe",
    "NoiseScale",
    "NoiseTrack",
    "Notice",
    "PrunedProposal",
    "RaceCurve",
    "RacePoint",
    "RaceSummary",
    "RaceVerdict",
    "Racer",
    "RacerRole",
    "RankResult",
    "Recommendation",
    "Rejected",
    "RejectedValue",
    "ScheduleStage",
    "ScheduleSummary",
    "ScheduleVerdict",
    "SearchEffort",
    "StudySetup",
    "TaskSummary",
    "ThroughputPick",
    "Tie",
    "TimeToLoss",
    "TrialRecord",
    "TrialResult",
    "TrialRole",
    "TrialStatus",
    "TuneResult",
    "did_not_fall",
    "reference_racer",
    "relative_spread",
    "shown_knobs",
    "stop_index",
]
