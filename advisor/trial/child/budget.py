"""How long a trial's warm-up and window run, and what the window times (docs/method.md).

Warm-up and window each keep to `trial_seconds`, whatever the batch: where one optimizer cycle
(accumulation x micro-steps) does not fit the window, the window times its parts instead,
micro-steps and optimizer steps apart, and samples/s is estimated from them. Re-runs of
finalists (`whole_cycles`) time whole cycles however long, at least one in the warm-up. A
window times at least two cycles that take more than half of it each, three otherwise; an
estimate two (plain, stepped) pairs of micro-steps. A search trial (`precise_window`) settles
sooner and may end its window once its rate is precise (an estimate whose micro-steps are alike
after one pair), or clearly below the best's (`advisor.trial.child.window`); its window ends at the
step nearest its time rather than the first after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from advisor.knobs import TrialConfig
from advisor.trial.child.agreement import EveryStep, ParentWatch, RankAgreement
from advisor.trial.child.early_end import PRECISE_MIN_BATCHES
from advisor.trial.child.steps import Clock, WindowMonitor
from advisor.trial.child.warmup import FirstStep, WarmUpSteps, WarmUpTerms, warm_up
from advisor.trial.child.window import Bounds, Window, cycle_s, run_window
from advisor.trial.orders import ReferenceOrder, WindowOrder
from advisor.trial.protocol import EARLY_STEPS, PRECISE_AFTER_FRACTION, TrialRequest

__all__ = [
    "TrialSteps",
    "WindowTerms",
    "estimated_cycle_s",
    "timed_window",
    "too_long_for_window",
    "warm_up_trial",
]


class TrialSteps(WarmUpSteps, Protocol):
    """What a trial's warm-up and window run and read of a `Trainer`: a warm-up's `WarmUpSteps`,
    the device its DDP ranks agree on, and `restart_cycle` to time a cycle's parts."""

    @property
    def device(self) -> torch.device: ...

    def restart_cycle(self, cycle: int) -> None:
        """From now on, cycles of `cycle` micro-batches (`Trainer.restart_cycle`)."""
        ...


@dataclass(frozen=True)
class WindowTerms:
    """What a trial's warm-up and window keep to: its order's terms and the request's seconds."""

    config: TrialConfig
    trial_seconds: float
    warmup_steps: int = EARLY_STEPS
    whole_cycles: bool = False
    precise_window: bool = False
    sibling_accumulation: tuple[int, ...] = ()
    beat_samples_per_s: float | None = None
    max_measure_steps: int | None = None
    bounded: bool = True  # False: the numerics reference's warm-up runs all its steps, untimed

    @classmethod
    def of(cls, request: TrialRequest) -> WindowTerms:
        """The terms of a window or reference order."""
        order = request.order
        common = {
            "config": order.config,
            "trial_seconds": request.trial_seconds,
            "warmup_steps": max(request.warmup_steps, EARLY_STEPS),
            "max_measure_steps": request.max_measure_steps,
        }
        if isinstance(order, WindowOrder):
            return cls(
                **common,  # type: ignore[arg-type]
                whole_cycles=order.whole_cycles,
                precise_window=order.precise_window,
                sibling_accumulation=order.sibling_accumulation,
                beat_samples_per_s=order.beat_samples_per_s,
            )
        if isinstance(order, ReferenceOrder):
            return cls(**common, whole_cycles=True, bounded=False)  # type: ignore[arg-type]
        raise TypeError(f"a {order.kind} order has no window")


# A window times whole cycles when a cycle takes at most this fraction of it, so that its three
# steps take at most 1.5 windows; else it times a cycle's parts. A search trial's window, which
# ends once precise, needs PRECISE_MIN_BATCHES cycles at least: they must fit in the window.
WHOLE_CYCLE_FRACTION = 0.5


def warm_up_trial(
    trainer: TrialSteps,
    terms: WindowTerms,
    watch: WindowMonitor | None,
    first: FirstStep,
    *,
    clock: Clock = time.perf_counter,
) -> Window:
    """`terms.warmup_steps` optimizer steps within one window's time. A search trial's warm-up
    may end within a step, or take none after a first step long enough to have settled it
    (`warm_up`); a re-run's (`whole_cycles`) runs whole steps, at least one; the numerics
    reference runs all. Time is read from `clock`."""
    agree = EveryStep(trainer.device) if trainer.config.world_size > 1 else None
    budget = terms.trial_seconds if terms.bounded else None
    settle = terms.precise_window and not terms.whole_cycles
    warmup = WarmUpTerms(
        steps=terms.warmup_steps,
        budget_s=budget,
        whole_steps=terms.whole_cycles,
        settle_s=PRECISE_AFTER_FRACTION * terms.trial_seconds if settle else None,
        cycle_beyond_s=_longest_whole_cycle_s(terms) if settle else None,
    )
    return warm_up(trainer, warmup, agree=agree, monitor=watch, first=first, clock=clock)


def too_long_for_window(warmup: Window, terms: WindowTerms, first: FirstStep) -> bool:
    """Whether one optimizer cycle, predicted from the warm-up's micro-steps, is too long for
    whole cycles to be timed within the window; for a search trial, also the cycle of one of
    its `sibling_accumulation`: its window then times the parts, which give their rates too
    (a trial at batch 512 without accumulation would otherwise time whole steps, and the search
    a trial of its own for each accumulation, each its first step again)."""
    config = terms.config
    longest = max((config.accumulation_steps, *terms.sibling_accumulation))
    if terms.whole_cycles or longest == 1:
        return False  # one micro-step is the whole cycle: fewer steps, still whole
    micro = warmup.median_micro_s(stepped=False)
    final = warmup.median_micro_s(stepped=True)
    if config.accumulation_steps == 1:  # every micro-step steps: a plain one takes at most as long
        if final is None and first.predicts_steps:
            final = first.seconds
        micro = final
    if micro is None or final is None:  # the warm-up ran out of time within its first cycle
        return True
    cycle_s = (longest - 1) * micro + final
    return cycle_s > _longest_whole_cycle_s(terms)


def _longest_whole_cycle_s(terms: WindowTerms) -> float:
    """The longest optimizer cycle a window times whole: one that lets a search trial's window
    time PRECISE_MIN_BATCHES cycles within `trial_seconds`, any other window three within 1.5."""
    if terms.precise_window and not terms.whole_cycles:
        return terms.trial_seconds / PRECISE_MIN_BATCHES
    return WHOLE_CYCLE_FRACTION * terms.trial_seconds


def timed_window(
    trainer: TrialSteps,
    terms: WindowTerms,
    warmup: Window,
    first: FirstStep,
    watch: WindowMonitor | None,
    estimate: bool,
    *,
    clock: Clock = time.perf_counter,
) -> Window:
    """The measured window: at least `trial_seconds` (a search trial's, to the step nearest
    it), on every DDP rank, unless the parent watching it ends it early or, with
    `precise_window`, its rate is precise from an eighth of that on. Estimating, it runs cycles
    of two micro-steps, one without and one with the optimizer step, and times each. Time is
    read from `clock`."""
    agree = None
    if trainer.config.world_size > 1:
        dist.barrier()  # all windows start together
        agree = RankAgreement(
            trainer.device,
            terms.trial_seconds,
            # often where the parent may stop it or a precise rate may end it
            check_every_s=ParentWatch.INTERVAL_S if watch or terms.precise_window else None,
            clock=clock,
        )
    if estimate:
        trainer.restart_cycle(2)
    bounds = _window_bounds(trainer, terms, warmup, first, estimate)
    return run_window(trainer, bounds, agree=agree, monitor=watch, time_micro=estimate, clock=clock)


def _window_bounds(
    trainer: TrialSteps, terms: WindowTerms, warmup: Window, first: FirstStep, estimate: bool
) -> Bounds:
    """When the measured window may end, from its terms and what the warm-up and the first
    micro-step saw."""
    # the warm-up's steps, or the first micro-step where it was a whole step (a search trial's
    # warm-up may have taken none after it): one-off costs in it only lower the minimum of
    # steps, which the window's seconds then exceed anyway where steps are short
    whole_first = first.stepped and first.predicts_steps
    steps_s = [*warmup.step_times_s, *([first.seconds] if whole_first else [])]
    long_cycles = bool(steps_s) and max(steps_s) > WHOLE_CYCLE_FRACTION * terms.trial_seconds
    search = terms.precise_window and not terms.whole_cycles
    # A search window right after the first micro-step (the warm-up took none after it), with
    # at most one loader worker (two or more deliver batches in rounds): that micro-step joins
    # the test of precision, of the window's steps where it was a whole step (three alike may
    # end it after two), of an estimate's micro-steps otherwise (three alike may end it after
    # one pair). Its one-off costs only make it less alike.
    alone = not warmup.micro_times_s and not warmup.step_times_s
    alike = first.predicts_steps and (estimate or first.stepped)
    few_workers = trainer.config.num_workers <= 1
    earlier = (first.seconds,) if search and alone and alike and few_workers else ()
    return Bounds(
        min_steps=2 if estimate or long_cycles else 3,
        precise_min_steps=1 if estimate else 2 if earlier else None,
        earlier_steps_s=earlier,
        min_seconds=terms.trial_seconds,
        nearest_step=search,
        one_long_pair=estimate and search,
        max_steps=terms.max_measure_steps,
        stop_at_once=True,  # the parent's stop: it keeps the steps it timed, if any
        worker_rounds=_worker_rounds(estimate=estimate, long_cycles=long_cycles and search),
        # precise: its batch means span worker rounds, and a draining burst keeps it imprecise
        prefetched_rounds=not terms.precise_window,
        precise_after_s=PRECISE_AFTER_FRACTION * terms.trial_seconds
        if terms.precise_window
        else None,
        estimate_accumulation=trainer.config.accumulation_steps if estimate else None,
        sibling_accumulation=terms.sibling_accumulation if estimate else (),
        beat_step_s=trainer.config.global_batch_size / terms.beat_samples_per_s
        if terms.beat_samples_per_s
        else None,
        # an estimate's micro-steps are long: a pair and the micro-step after it may be precise
        agree_every_micro_step=estimate,
    )


def _worker_rounds(*, estimate: bool, long_cycles: bool) -> int:
    """The rounds of the loader's workers a window spans: none for an estimate, whose long
    micro-steps time the workers' bursts anyway; one for a search window of steps longer than
    half of it (two rounds of two workers had made such a window time four steps of 2.6 s on
    examples/hf_gpt2.py); two otherwise, so that a burst drains within the window."""
    if estimate:
        return 0
    return 1 if long_cycles else 2


def estimated_cycle_s(window: Window, accumulation: int) -> float | None:
    """A whole optimizer cycle's seconds from a window that timed its parts: accumulation - 1
    micro-steps and one that ends with the optimizer step, each its median compute, and the
    micro-steps' mean wait for a batch, all of the window's `Window.pairs`
    (`advisor.trial.child.window.cycle_s`); None for a window of whole cycles."""
    plain = window.median_compute_s(stepped=False)
    final = window.median_compute_s(stepped=True)
    wait = window.mean_wait_s()
    if plain is None or final is None or wait is None:
        return None
    return cycle_s(accumulation, plain, final, wait, overlapped=window.loader_workers > 0)
