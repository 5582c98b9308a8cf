"""The race's and the schedule's verdicts in words: `advisor.decide` stores what it decided and
on which racers (`RaceVerdict`, `ScheduleVerdict`); this module says it, so that a stored study
re-renders with today's wording. Pure functions, shared by the console, report.md and
report.html."""

from __future__ import annotations

from advisor.results import (
    Bottleneck,
    KnobEffect,
    Notice,
    Racer,
    RacerRole,
    RaceSummary,
    RejectedValue,
    ScheduleSummary,
    ScheduleVerdict,
    Tie,
    TimeToLoss,
    reference_racer,
)

__all__ = [
    "GOODPUT_RULE",
    "ROLE_WORDS",
    "bottleneck_text",
    "claim_text",
    "notice_text",
    "payoff_text",
    "race_verdict",
    "rejection_text",
    "schedule_rule",
    "schedule_verdict",
    "tie_text",
]

# What the reports call each racer's role.
ROLE_WORDS = {
    RacerRole.BASELINE: "your configuration",
    RacerRole.YOUR_BATCH: "at your batch",
    RacerRole.CANDIDATE: "another global batch",
    RacerRole.FIXED: "the fixed recommendation",
    RacerRole.SCHEDULE: "schedule",
}

GOODPUT_RULE = (
    "from the best configuration at your global batch (the race's pick for the first "
    "seconds), then at each later point where phi was measured along your run, the global "
    "batch with the most goodput, samples/s x (phi + B0) / (phi + B), among those measured "
    "with the same knobs, where it is larger than the stage before; a stage starts after as "
    "many samples as your run had trained there"
)


def race_verdict(race: RaceSummary) -> str:
    """Why the race's winner won, or why nothing could, in a sentence."""
    verdict = race.verdict
    if verdict.kind == "stated":
        return verdict.reason or ""
    if verdict.kind == "failed":
        return f"the race at your global batch failed ({verdict.reason}): advisor keeps it"
    if verdict.kind == "no-fall":
        return _no_fall(race)
    assert verdict.kept is not None and race.target_loss is not None
    if verdict.kind in ("won", "won-level"):
        assert race.winner is not None
        return _won(race, race.winner, verdict.kept)
    if verdict.kind == "close-call" and verdict.best is not None:
        return _close_call(race, verdict.kept, verdict.best)
    return _kept(race, verdict.kept, verdict.best)


def claim_text(claim: TimeToLoss | None) -> str:
    """A time-to-loss claim with its interval: "2.60x (2.31x-2.94x, 3 replicates)"."""
    if claim is None:
        return "as soon as yours"
    replicates = f"{claim.replicates} replicate{'s' if claim.replicates != 1 else ''}"
    if claim.low <= 0:  # one reading, or one that missed your loss: no low end
        missed = claim.replicates - (
            claim.reached if claim.reached is not None else claim.replicates
        )
        why = f", {missed} not reaching your loss" if missed else ""
        return f"{claim.speedup:.2f}x ({replicates}{why}: no interval)"
    return f"{claim.speedup:.2f}x ({claim.low:.2f}x-{claim.high:.2f}x, {replicates})"


def _no_fall(race: RaceSummary) -> str:
    reference = reference_racer(race.racers)
    curve = reference.curve if reference is not None else None
    if curve is None:
        return "your loss did not fall beyond its noise in the race: advisor keeps your batch"
    first, last = curve.points[0], curve.points[-1]
    start = "at the start" if first.seconds == 0 else f"after {first.seconds:.1f} s"
    return (
        f"your loss did not fall beyond its noise in the race ({first.loss:.4g} {start}, lowest "
        f"{curve.best_loss:.4g}, {last.loss:.4g} after {last.seconds:.1f} s): time to it cannot "
        "compare global batches, so advisor keeps yours (a longer race, --race-seconds "
        f"above {race.seconds:g}, may show it fall)"
    )


def _who(racer: Racer) -> str:
    if racer.role == "baseline":
        return "your configuration"
    return f"{racer.label} (global batch {racer.config.global_batch_size})"


def _won(race: RaceSummary, winner: int, kept: int) -> str:
    won, other = race.racers[winner], race.racers[kept]
    verdict = race.verdict
    text = f"{_who(won)} reaches your loss {claim_text(verdict.best_claim)} sooner than yours"
    if other.role == "baseline":
        return text + f", by more than {verdict.margin:.0%} at the low end"
    return text + (
        f"; the best at your global batch, {other.label}, {claim_text(verdict.kept_claim)}"
    )


def _close_call(race: RaceSummary, kept: int, best: int) -> str:
    verdict = race.verdict
    chosen, other = race.racers[kept], race.racers[best]
    against = "" if chosen.role == "baseline" else f", against {claim_text(verdict.kept_claim)}"
    return (
        f"a close call: {_who(other)} may reach your loss sooner than {_who(chosen)} by "
        f"{verdict.margin:.0%} or not ({claim_text(verdict.best_claim)} sooner than yours"
        f"{against}); {_who(chosen)}, with fewer changes from yours, stands"
    )


def _kept(race: RaceSummary, kept: int, best: int | None) -> str:
    chosen = race.racers[kept]
    verdict = race.verdict
    text = f"{_who(chosen)} reaches your loss"
    if chosen.role != "baseline":
        text += f" {claim_text(verdict.kept_claim)} sooner than yours"
    if best is None:
        return text + "; no other global batch reached it"
    other = race.racers[best]
    alone = race.replicates == 1 and verdict.best_claim is not None
    why = (
        f", too far below {1 + verdict.margin:.2f}x for more replicates to lift it" if alone else ""
    )
    return (
        f"{text}; no other global batch can be {verdict.margin:.0%} sooner (best: {other.label}, "
        f"{claim_text(verdict.best_claim)} against yours{why})"
    )


def _seconds(racer: Racer) -> str:
    if racer.time_to_target_s is not None:
        return f"{racer.time_to_target_s:.1f} s"
    trained = racer.curve.points[-1].seconds if racer.curve and racer.curve.points else 0.0
    if trained < 0.95 * racer.race_seconds:
        return f"not within {trained:.1f} s, when it could no longer win"
    return "never within the race"


def schedule_rule(summary: ScheduleSummary) -> str:
    """How the schedule's stages were chosen from phi, in a sentence."""
    return GOODPUT_RULE


def schedule_verdict(summary: ScheduleSummary, race: RaceSummary | None) -> str:
    """What the schedule's tune decided and why, in a sentence; `race` is the race before it
    (whose verdict says why no schedule was tried where it set no target)."""
    verdict = summary.verdict
    if verdict.kind == "stated":
        return verdict.reason or ""
    if verdict.kind in ("no-race", "race-kept", "timeout"):
        return f"no schedule was tried: {_not_tried(verdict, race)}"
    if verdict.kind in ("none-reached", "ships", "not-by-margin"):
        return _raced(summary, verdict)
    return _not_tried(verdict, race)


def _not_tried(verdict: ScheduleVerdict, race: RaceSummary | None) -> str:
    kind = verdict.kind
    if kind == "no-race":
        return "no race set a target loss"
    if kind == "race-kept":
        return race_verdict(race) if race is not None else "no race set a target loss"
    if kind == "timeout":
        return (
            f"it takes up to about {verdict.bound_s:.0f} s, more than --timeout "
            f"{verdict.timeout_s:g} s allows (raise --timeout, or lower --schedule-seconds)"
        )
    if kind == "processes":
        return f"phi is tracked in one process; yours runs {verdict.processes}"
    if kind == "long-run-failed":
        return f"your configuration's long run failed ({verdict.reason})"
    if kind == "did-not-fall":
        return "your loss did not fall in the long run: nothing can be timed to it"
    if kind == "phi-unmeasured":
        return "the noise scale could not be measured along your run"
    if kind == "phi-flat":
        return (
            "the noise scale did not grow beyond its noise along your run: no schedule is proposed"
        )
    return (
        f"at every phi measured along your run, global batch {verdict.batch} kept the most goodput"
    )


def _raced(summary: ScheduleSummary, verdict: ScheduleVerdict) -> str:
    assert verdict.fixed is not None
    racers, fixed = summary.racers, summary.racers[verdict.fixed]
    reference = next(r for r in racers if r.role == "baseline")
    loss = f"your {reference.race_seconds:g}-s loss {summary.target_loss:.4g}"
    if verdict.kind == "none-reached":
        return (
            f"no schedule reached {loss} more than {verdict.margin:.0%} sooner than "
            f"{_fixed_label(fixed)}, which took {_horizon_seconds(fixed)}: none ships"
        )
    assert verdict.best is not None
    best = racers[verdict.best]
    text = (
        f"the schedule {best.label} reached {loss} after {best.time_to_target_s:.1f} s, "
        f"against {_horizon_seconds(fixed)} for {_fixed_label(fixed)}"
    )
    if verdict.kind == "ships":
        return text + ": it ships"
    return (
        f"{text}: not sooner by more than {verdict.margin:.0%} at every loss checked, so it "
        "does not ship"
    )


def _fixed_label(racer: Racer) -> str:
    if racer.role == "baseline":
        return "your configuration, the fixed recommendation"
    return f"the fixed recommendation ({racer.label})"


def _horizon_seconds(racer: Racer) -> str:
    if racer.time_to_target_s is not None:
        return f"{racer.time_to_target_s:.1f} s"
    return "never within the horizon"


def notice_text(notice: Notice) -> str:
    """A note beside the recommendation, in a sentence."""
    if notice.kind == "stated":
        return notice.text or ""
    if notice.kind == "batch-unchecked":
        batch, batch0 = notice.batch or 0, notice.baseline_batch or 1
        unchecked = (
            "--objective throughput does not race; re-run with --objective time-to-loss to race it"
            if notice.throughput
            else "the tune stopped before its race; run the same command again to race it"
        )
        return (
            f"the global batch changes from {batch0} to {batch} ({batch / batch0:g}x), and "
            f"nothing checked how soon it reaches your loss: {unchecked}, or with "
            f"--global-batch-size {batch0} to keep it"
        )
    if notice.kind == "race-short":
        return (
            f"the race covered the first {notice.race_seconds:g} s of training from your initial "
            "weights; the best global batch often grows later in training (the gradient noise "
            "scale grows as the loss falls): --schedule auto measures that over a longer run "
            "and races a batch that grows with it"
        )
    if notice.kind == "baseline-over-budget":
        return (
            "your configuration does not fit the memory budget: no speed-up over it can be "
            "stated; the memory line says what fits"
        )
    return "the baseline configuration failed: no speed-up can be stated"


def bottleneck_text(bottleneck: Bottleneck, effects: tuple[KnobEffect, ...]) -> str:
    """What limits the recommended configuration, in a sentence citing its trials."""
    if bottleneck.stated is not None:
        return bottleneck.stated
    number, wait = bottleneck.trial, bottleneck.wait or 0.0
    if bottleneck.kind == "input":
        measured = "".join(
            f"; num_workers {e.from_value} → {e.to_value} alone gave {e.ratio:.2f}x "
            f"(trials {', '.join(f'{a} vs {b}' for a, b in e.pairs)})"
            for e in effects
            if e.knob == "num_workers"
        )
        return f"input-bound: trial {number} waited for data {wait:.0%} of its window{measured}"
    if bottleneck.ratio is None:
        return (
            f"compute-bound as far as measured: trial {number} waited for data only {wait:.0%} "
            "of its window; no trial differed from it in batch size alone, so per-step overhead "
            "was not checked"
        )
    before, after = bottleneck.trials
    why = (
        "per-step overhead still dominates, so larger batches pay while memory and the "
        "optimisation allow"
        if bottleneck.kind == "overhead"
        else "the device is busy computing"
    )
    return (
        f"{bottleneck.kind}-bound: batch {bottleneck.batch_from} → {bottleneck.batch_to} alone "
        f"gave {bottleneck.ratio:.2f}x (trials {before} vs {after}) with {wait:.0%} data wait: "
        f"{why}"
    )


def rejection_text(rejected: RejectedValue) -> str:
    """Why a knob value is never recommended, in a sentence citing its trials."""
    if rejected.stated is not None:
        return rejected.stated
    setting = f"{rejected.knob}={rejected.value}"
    trials = ", ".join(map(str, rejected.trials))
    every = f"every trial with it failed ({rejected.failures}: trials {trials})"
    cited = f"trial {rejected.cited}"
    if not rejected.counterparts:
        return (
            f"{setting} rejected: {every}; {cited}: {rejected.cited_reason}; no usable trial "
            "differs from these in this knob alone"
        )
    usable = rejected.counterparts[0][0]
    others = len({bad for _, bad in rejected.counterparts}) - 1
    more = f" (and {others} more such pairs)" if others else ""
    return (
        f"{setting} rejected: {cited} {rejected.cited_kind} ({rejected.cited_reason}) where "
        f"trial {usable}, differing in {rejected.knob} alone, trained{more}; {every}"
    )


def payoff_text(effect: KnobEffect) -> str:
    """After how many steps compiling pays off, from its pairs' first and later steps."""
    if effect.compile_extra_s is None or effect.compile_saved_s is None:
        return effect.note
    extra, saved = effect.compile_extra_s, effect.compile_saved_s
    cost = f"compiling made the first step {extra:.1f} s longer"
    if saved <= 0:
        return f"{cost}, and compiled steps were no faster: it never pays off"
    return (
        f"{cost} and saves {saved * 1000:.2f} ms per step: it pays off after "
        f"{extra / saved:,.0f} steps"
    )


def tie_text(tie: Tie) -> str:
    """How a tie within measurement noise was decided, in a sentence citing its trials."""
    if tie.stated is not None:
        return tie.stated
    other = tie.slow if tie.kept == tie.fast else tie.fast
    return (
        f"trials {tie.fast} and {tie.slow} stayed within measurement noise after {tie.runs} "
        f"re-runs each ({tie.gap:.1%} apart, spreads {tie.fast_spread:.1%} and "
        f"{tie.slow_spread:.1%}): advisor recommends trial {tie.kept}, which changes fewer "
        f"knobs from your baseline than trial {other}"
    )
