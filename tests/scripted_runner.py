"""A `TrialRunner` that answers from a script, as httpx's tests answer through `MockTransport`:
the search, the re-runs and the decision run in-process and deterministically, and a test reads
the orders they gave (`ScriptedRunner.orders`).

A script says, per configuration, the samples/s a window measures (`rate`), and how a racer's
loss falls with the samples it trains on (`loss`); every other figure follows from those."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from advisor.api import VERSION, search_and_decide
from advisor.knobs import TrialConfig
from advisor.progress import NullProgress, Progress
from advisor.results import (
    GradientNorms,
    HardwareProfile,
    LrPlan,
    RaceCurve,
    RacePoint,
    StudySetup,
    TaskSummary,
    TrialResult,
    TuneResult,
    stop_index,
)
from advisor.search.checks import NumericsCheck
from advisor.search.context import SearchContext
from advisor.search.space import build_space
from advisor.settings import TuneSettings
from advisor.trial.orders import (
    NoiseOrder,
    PhaseCallback,
    ProgressCallback,
    RaceOrder,
    ReferenceOrder,
    TrialOrder,
    ValidateOrder,
)
from tests.conftest import CPU_PROFILE

# The task a tiny MLP factory builds, as its trial child would summarise it.
TASK = TaskSummary(
    return_kind="tuple",
    model_class="Sequential",
    num_parameters=1_000,
    dataset_class="TensorDataset",
    dataset_size=4096,
    iterable=False,
    batch_kind="pair",
    batch_description="(float32[32, 16], int64[32])",
    loss_from_model=False,
    custom_optimizer=False,
    custom_collate=False,
    user_batch_size=32,
)
PEAK_BYTES = 64 * 2**20
STARTUP_S = 0.5  # a racer's process, before it trains
EARLY = (2.30, 2.25, 2.20)  # the first optimizer steps' losses, every configuration alike


def _rate_by_batch(config: TrialConfig) -> float | TrialResult:
    """By default: samples/s grows with the micro-batch, as on a CPU, and nothing fails."""
    return 1000.0 * math.sqrt(config.batch_size) * config.world_size


def _loss_by_samples(config: TrialConfig, lr: LrPlan, samples: int) -> float:
    """By default: the loss falls from 2.3 towards 0.3 with the samples trained on, alike at
    every batch (below the critical batch) and learning rate."""
    return 0.3 + 2.0 * math.exp(-samples / 20_000)


def _early_alike(config: TrialConfig) -> tuple[float, ...]:
    """By default every configuration's first steps lose alike: no knob changes the maths."""
    return EARLY


@dataclass
class ScriptedRunner:
    """Answers each order from `rate` (samples/s, or a whole result such as an oom), `loss`
    (a racer's held-out loss after `samples`), `peak` (bytes), `wait` (the share of a window
    spent waiting for data), `early` (the first steps' losses), `phi` (the noise scale the
    noise trial's gradient norms give) and `seed` (how far a replicate's seed takes a racer
    per sample, against replicate 0: 1.0 alike); records the orders in `orders`. Tests that
    need more override `answered`."""

    rate: Callable[[TrialConfig], float | TrialResult] = _rate_by_batch
    loss: Callable[[TrialConfig, LrPlan, int], float] = _loss_by_samples
    peak: Callable[[TrialConfig], int] = lambda config: PEAK_BYTES
    wait: Callable[[TrialConfig], float] = lambda config: 0.0
    early: Callable[[TrialConfig], tuple[float, ...]] = _early_alike
    phi: float = 1000.0
    seed: Callable[[TrialConfig, int], float] = lambda config, replicate: 1.0
    orders: list[TrialOrder] = field(default_factory=list)

    def run(
        self,
        order: TrialOrder,
        log_path: Path,
        *,
        on_phase: PhaseCallback | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> TrialResult:
        """The scripted result of `order`, as `answered` makes it."""
        self.orders.append(order)
        return self.answered(order, self._scripted(order), on_progress)

    def answered(
        self, order: TrialOrder, result: TrialResult, on_progress: ProgressCallback | None
    ) -> TrialResult:
        """What a subclass makes of the scripted `result` (noise of its own, a machine's load,
        a stop the progress callback orders): by default, the result as it is."""
        return result

    def _scripted(self, order: TrialOrder) -> TrialResult:
        if isinstance(order, RaceOrder):
            return self._race(order)
        if isinstance(order, NoiseOrder):
            return self._noise(order)
        config = order.config
        if isinstance(order, ValidateOrder):
            config = config.model_copy(update={"batch_size": TASK.user_batch_size})
        scripted = self.rate(config)
        if isinstance(scripted, TrialResult):
            return scripted
        result = _window(config, scripted, reference=isinstance(order, ReferenceOrder))
        update = {"peak_memory_bytes": self.peak(config), "early_losses": self.early(config)}
        if result.samples_per_s is not None:
            update["data_wait_fraction"] = self.wait(config)
        return result.model_copy(update=update)

    def _race(self, order: RaceOrder) -> TrialResult:
        config, rate = order.config, self.rate(order.config)
        assert not isinstance(rate, TrialResult), "a racer is a configuration that ran"
        batch = config.global_batch_size
        points = [RacePoint(seconds=0.0, samples=0, steps=0, loss=self._loss(order, 0))]
        for count in order.grid:
            samples = -(-count // batch) * batch  # the first step at or past the count
            seconds = samples / rate
            if seconds > order.seconds:  # the time runs out first: a last point at its end
                samples = int(order.seconds * rate) // batch * batch
                seconds = samples / rate
            loss = self._loss(order, samples)
            steps = samples // batch
            points.append(RacePoint(seconds=seconds, samples=samples, steps=steps, loss=loss))
            losses = [point.loss for point in points[-order.in_a_row :]]
            reached = order.target is not None and bool(
                stop_index(losses, order.target, order.in_a_row) is not None
            )
            beyond = order.max_samples is not None and samples >= order.max_samples
            if reached or beyond or seconds >= order.seconds * 0.999:
                break
        curve = RaceCurve(loss_kind="held-out", held_out_samples=order.held_out, lr=order.lr,
                          points=tuple(points))  # fmt: skip
        wall = points[-1].seconds + STARTUP_S  # a racer's process starts, then trains
        update = {"peak_memory_bytes": self.peak(config), "wall_s": wall}
        return _ok(config, race=curve).model_copy(update=update)

    def _loss(self, order: RaceOrder, samples: int) -> float:
        """The scripted loss after `samples`, as far along as the replicate's seed takes it."""
        return self.loss(
            order.config, order.lr, int(samples * self.seed(order.config, order.replicate))
        )

    def _noise(self, order: NoiseOrder) -> TrialResult:
        config = order.config
        small, big = config.batch_size, config.global_batch_size
        # |G|^2 + tr(S)/B with |G|^2 = 1 and tr(S) = phi: a noise scale of phi
        norms = GradientNorms(
            small_batch=small,
            big_batch=big,
            small_sq=(1.0 + self.phi / small,) * 20,
            big_sq=(1.0 + self.phi / big,) * 20,
        )
        return _ok(config, gradient_norms=norms, eval_s_per_sample=1e-5)


def _ok(config: TrialConfig, **fields: object) -> TrialResult:
    return TrialResult(
        config=config, status="ok", peak_memory_bytes=PEAK_BYTES, task=TASK,
        startup_s=0.1, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _window(config: TrialConfig, rate: float, *, reference: bool) -> TrialResult:
    if reference:
        return _ok(config, early_losses=EARLY)
    step_s = config.global_batch_size / rate
    steps = max(3, math.ceil(1.0 / step_s))
    return _ok(
        config,
        samples_per_s=rate,
        step_time_median_s=step_s,
        step_time_p10_s=step_s,
        step_time_p90_s=step_s,
        data_wait_fraction=0.0,
        warmup_s=1.0,
        window_s=steps * step_s,
        steps_measured=steps,
        samples_measured=steps * config.global_batch_size,
        early_losses=EARLY,
        wall_s=2.0 + steps * step_s,
    )


def scripted_tune(
    settings: TuneSettings, runner: ScriptedRunner, *, hardware: HardwareProfile = CPU_PROFILE
) -> TuneResult:
    """A whole tune of the scripted task, every trial answered by `runner`: the search, the
    re-runs, the noise scale, the race and the outputs, in-process (`search_and_decide`)."""
    logs = settings.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    search = scripted_context(settings, runner, logs, hardware=hardware)
    search = dataclasses.replace(search, numerics=NumericsCheck(runner, logs))
    setup = StudySetup(
        advisor_version=VERSION, workdir=".", baseline_config=search.space.baseline,
        fixed_knobs=search.space.fixed, hardware=hardware, task=TASK,
    )  # fmt: skip
    return search_and_decide(search, setup)


def scripted_context(
    settings: TuneSettings,
    runner: ScriptedRunner,
    logs: Path,
    *,
    hardware: HardwareProfile = CPU_PROFILE,
    progress: Progress | None = None,
) -> SearchContext:
    """A search context on `hardware` for the scripted task, whose trials `runner` answers."""
    space = build_space(settings, hardware, TASK)
    return SearchContext(settings, space, hardware, runner, logs, progress or NullProgress())
