"""What the reports say about the race, the learning rate and the noise scale (pure functions of a
`Recommendation`), shared by report.md and report.html."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.report.verdicts import ROLE_WORDS, claim_text, race_verdict
from advisor.results import (
    NoiseScale,
    Racer,
    RaceSummary,
    Recommendation,
    did_not_fall,
)

__all__ = [
    "PredictionRow",
    "RaceRow",
    "RaceView",
    "baseline_kept",
    "race_view",
    "went_on_brief",
    "went_on_text",
]


@dataclass(frozen=True)
class RaceRow:
    """One racer as a table row; every value already formatted."""

    label: str
    role: str
    global_batch: int
    lr: str
    samples_per_s: float | None
    final_loss: str
    reaches: str
    sooner: str
    startup: str
    winner: bool


@dataclass(frozen=True)
class PredictionRow:
    """What the noise scale predicts for one global batch, as a table row."""

    global_batch: int
    samples_per_s: float
    samples_ratio: str
    time: str  # predicted time to the loss against the user's batch
    raced: str


@dataclass(frozen=True)
class RaceView:
    """The race and its explanations, ready to render."""

    headline: str | None
    verdict: str | None
    loss_text: str | None
    target: str | None
    rows: tuple[RaceRow, ...]
    lr_text: str
    pick_text: str | None
    noise_text: str | None
    predictions: tuple[PredictionRow, ...]
    kept: tuple[str, str] | None  # why your configuration stays: (lead, the rest)
    raced_s: float | None  # each racer's training time before the race went on
    went_on: str | None  # how the race went on for its finalists


def race_view(rec: Recommendation) -> RaceView:
    """Everything the reports say about how the recommendation was decided."""
    race = rec.race
    return RaceView(
        headline=_headline(rec),
        verdict=race_verdict(race) if race else None,
        loss_text=_loss_text(race) if race else None,
        target=_target_text(race) if race else None,
        rows=_rows(race) if race else (),
        lr_text=_lr_text(rec),
        pick_text=_pick_text(rec),
        noise_text=_noise_text(rec.noise_scale) if rec.noise_scale else None,
        predictions=_prediction_rows(rec),
        kept=baseline_kept(rec),
        raced_s=(race.went_on_from or race.seconds) if race else None,
        went_on=went_on_text(race) if race else None,
    )


def went_on_brief(race: RaceSummary) -> str | None:
    """That the race went on, in a line for the console; None where it did not."""
    if race.went_on_from is None:
        return None
    count = sum(r.race_seconds > race.went_on_from for r in race.racers)
    return (
        f"it kept your global batch after {race.went_on_from:g} s, so {count} finalists went on "
        f"from where they stopped to {race.seconds:g} s: a race from initialisation favours the "
        "smallest batch; report.md has both verdicts"
    )


def went_on_text(race: RaceSummary) -> str | None:
    """How the race went on for its finalists, and what it said before; None where it did
    not go on."""
    if race.went_on_from is None:
        return None
    went = [r.label for r in race.racers if r.race_seconds > race.went_on_from]
    return (
        f"after {race.went_on_from:g} s, {_first_verdict(race)}"
        f". A race that short sees only the start of training, where the smallest batch does "
        f"best, so {', '.join(went) or 'its finalists'} went on from where they stopped, each "
        f"from its saved weights and optimizer state, to {race.seconds:g} s of training, and "
        "the verdict above was decided there"
    )


def _first_verdict(race: RaceSummary) -> str:
    return race_verdict(race.first_race) if race.first_race else "the race kept your global batch"


def _target_text(race: RaceSummary) -> str | None:
    """What the target is: where your configuration's curve, made non-increasing, ends."""
    if race.target_loss is None:
        return None
    replicates = (
        f"; the median over the race's {race.replicates} replicates" if race.replicates > 1 else ""
    )
    return (
        f"your configuration's loss at the end of the race, {race.target_loss:.4g} (its curve "
        f"made non-increasing, so a rise after its lowest point does not lift it{replicates}); "
        "every other racer stops once two evaluations in a row reach it"
    )


def baseline_kept(rec: Recommendation) -> tuple[str, str] | None:
    """Why your own configuration is recommended, (lead, the rest); None where it is not."""
    if rec.config != rec.baseline_config:
        return None
    if rec.throughput_pick is None:
        return (
            "Your configuration was the fastest one measured",
            "none of the knobs searched beat it here",
        )
    if rec.race is None:
        return (
            "Your configuration was the fastest with your global batch",
            "the faster configurations change it and did not race, and without a race "
            "your global batch is kept",
        )
    if rec.race.target_loss is None:
        return (
            "Your configuration was the fastest with your global batch",
            "the race could not compare global batches (see its verdict), and without it your "
            "global batch is kept",
        )
    if rec.race.verdict.kind == "close-call":
        return (
            "Your configuration stands in a close call",
            "a faster configuration may reach your loss sooner or not: its interval holds both "
            "(see the race's verdict)",
        )
    return (
        "Your configuration reached your loss soonest",
        f"no configuration with more samples/s reached it {rec.race.verdict.margin:.0%} sooner "
        "at the low end of its interval (see the race's verdict)",
    )


def _headline(rec: Recommendation) -> str | None:
    if rec.objective != "time-to-loss":
        return None
    if rec.time_to_loss is not None and rec.race:
        return (
            f"reaches your loss {claim_text(rec.time_to_loss)} sooner over the first "
            f"{rec.race.seconds:g} s of training"
        )
    return "keeps your global batch" if not rec.global_batch_changed else None


def _loss_text(race: RaceSummary) -> str:
    held_out = next((r.curve.held_out_samples for r in race.racers if r.curve), None)
    if race.loss_kind == "held-out":
        return (
            f"the mean loss on {held_out or 'a slice of'} held-out samples (a fixed tenth of "
            "your dataset, at most 1,024, and as many as one evaluation takes in a quarter of "
            "the time between two, but at least 256; left out of every racer's training), in "
            "fp32 with the model in eval mode"
        )
    return (
        "the mean training loss between evaluations: your dataset is an IterableDataset, so "
        "no slice of it can be held out"
    )


def _rows(race: RaceSummary) -> tuple[RaceRow, ...]:
    baseline = next((r for r in race.racers if r.role == "baseline"), None)
    reference = baseline.time_to_target_s if baseline else None
    return tuple(
        RaceRow(
            label=racer.config.label(),
            role=ROLE_WORDS[racer.role],
            global_batch=racer.config.global_batch_size,
            lr=racer.lr.label,
            samples_per_s=racer.samples_per_s,
            final_loss=f"{racer.curve.final_loss:.4g}" if racer.curve else _failed(racer),
            reaches=_reaches(racer, race.seconds) if race.target_loss is not None else "–",
            sooner=_sooner(racer, reference),
            startup=f"{racer.result.startup_s:.2f} s" if racer.result.startup_s else "–",
            winner=index == race.winner,
        )
        for index, racer in enumerate(race.racers)
    )


def _failed(racer: Racer) -> str:
    return f"{racer.result.status}: {racer.result.reason or ''}".strip(": ")


def _reaches(racer: Racer, seconds: float) -> str:
    if racer.curve is None:
        return "–"
    if racer.time_to_target_s is None and racer.race_seconds < seconds:
        return f"not within its {racer.race_seconds:g} s (it did not go on)"
    if racer.time_to_target_s is None:
        return "not within the race"
    if racer.steps_of_baseline:  # it did not train: your curve, at its samples/s
        return f"{racer.time_to_target_s:.1f} s (your steps, at its samples/s)"
    return f"{racer.time_to_target_s:.1f} s"


def _sooner(racer: Racer, reference: float | None) -> str:
    if racer.role == "baseline" or not reference or not racer.time_to_target_s:
        return "–"
    return _relative_time(reference / racer.time_to_target_s)


def _raced_text(batch: int, skipped: bool, batch0: int, raced: set[int]) -> str:
    if batch == batch0:
        return "yours"
    if batch in raced:
        return "yes"
    return "skipped: your loss did not fall" if skipped else "no"


def _relative_time(ratio: float) -> str:
    """A time to the loss against the user's: `ratio` is theirs over this one."""
    return f"{ratio:.2f}x sooner" if ratio >= 1 else f"{1 / ratio:.2f}x later"


def _prediction_rows(rec: Recommendation) -> tuple[PredictionRow, ...]:
    """The noise scale's predictions, and whether each global batch raced."""
    if rec.noise_scale is None:
        return ()
    raced = {r.config.global_batch_size for r in rec.race.racers} if rec.race else set()
    skipped = rec.race is not None and did_not_fall(rec.race.racers)
    batch0 = rec.baseline_config.global_batch_size
    return tuple(
        PredictionRow(
            global_batch=p.global_batch,
            samples_per_s=p.samples_per_s,
            samples_ratio=f"{p.samples_ratio:.2f}x",
            time="–" if p.global_batch == batch0 else _relative_time(p.predicted_speedup),
            raced=_raced_text(p.global_batch, p.raced and skipped, batch0, raced),
        )
        for p in rec.noise_scale.predictions
    )


def _lr_text(rec: Recommendation) -> str:
    """Which learning rate train.py uses, and the measurement behind it."""
    lr = rec.lr
    if rec.race is None:
        if rec.global_batch_changed:
            return (
                "train.py keeps your optimizer's learning rate; nothing checked it at the new "
                "global batch (no race)"
            )
        return "train.py keeps your optimizer's learning rate: the global batch is yours"
    same = [r for r in rec.race.racers if r.config == rec.config and r.curve is not None]
    chosen = next((r for r in same if r.lr == lr), None)
    other = next((r for r in same if r.lr != lr), None)
    if lr.rule == "yours":
        text = "train.py keeps your optimizer's learning rate"
    else:
        warmup = f", reached by a linear warm-up over {lr.warmup_steps} steps"
        text = (
            f"train.py scales your optimizer's learning rate by {lr.scale:.3g} "
            f"({lr.rule} rule{warmup if lr.warmup_steps else ''})"
        )
    if chosen is not None and chosen.curve is not None and other is not None and other.curve:
        text += (
            f": in the race it ended at loss {chosen.curve.final_loss:.4g}, against "
            f"{other.curve.final_loss:.4g} with {other.lr.label}"
        )
    elif not rec.global_batch_changed:
        text += ": the global batch is yours"
    return text + "; LR_SCALE and LR_WARMUP_STEPS at the top of train.py hold it"


def _raced_pick_text(raced: list[Racer], winner: Racer | None) -> str:
    """How the throughput pick fared in the race, with the learning rate that reached your loss
    soonest (a racer stops there, so where it ended says nothing), else the one that ended
    lower."""
    first = [r for r in raced if r.replicate == 0] or raced
    reached = [r for r in first if r.time_to_target_s is not None]
    ended = [r for r in first if r.curve is not None] or first
    shown = (
        min(reached, key=lambda r: r.time_to_target_s or float("inf"))
        if reached
        else min(ended, key=lambda r: r.curve.final_loss if r.curve else float("inf"))
    )
    text = f"it raced and {_reached(shown)} ({shown.lr.label})"
    if winner is None or winner.time_to_target_s is None:
        return text
    if shown.time_to_target_s is not None and shown.time_to_target_s < winner.time_to_target_s:
        return text + (
            f"; the recommendation took {winner.time_to_target_s:.1f} s: not enough later for the "
            "pick to win by the race's margin over the noise"
        )
    return text + f"; the recommendation reached it after {winner.time_to_target_s:.1f} s"


def _reached(racer: Racer) -> str:
    if racer.time_to_target_s:
        return f"reached your loss after {racer.time_to_target_s:.1f} s"
    return "did not reach your loss within the race"


def _pick_text(rec: Recommendation) -> str | None:
    """The highest-throughput configuration when the race chose another, and why."""
    pick = rec.throughput_pick
    if pick is None:
        return None
    text = (
        f"The highest throughput was trial {pick.trial}, {pick.config.label()} "
        f"({pick.samples_per_s:,.0f} samples/s against {rec.samples_per_s:,.0f})"
    )
    raced = [r for r in rec.race.racers if r.config == pick.config] if rec.race else []
    if raced and rec.race is not None:
        winner = rec.race.racers[rec.race.winner] if rec.race.winner is not None else None
        return f"{text}: {_raced_pick_text(raced, winner)}."
    batch = pick.config.global_batch_size
    prediction = (
        next((p for p in rec.noise_scale.predictions if p.global_batch == batch), None)
        if rec.noise_scale
        else None
    )
    if prediction is not None:
        why = (
            "it was to race, but your loss did not fall in the race, so nothing could be timed "
            "to it"
            if prediction.raced and rec.race is not None and did_not_fall(rec.race.racers)
            else "so it did not race"
        )
        return (
            f"{text}: at its global batch {batch} the noise scale predicts "
            f"{prediction.samples_ratio:.2f}x the samples to your loss, "
            f"{_relative_time(prediction.predicted_speedup)} than your batch at best, {why}."
        )
    return f"{text}: its global batch {batch} did not race, so it is not recommended."


def _noise_text(noise: NoiseScale) -> str:
    if noise.value is None:
        return (
            f"The gradient noise scale could not be estimated over {noise.steps} steps "
            f"(micro-batch {noise.small_batch} against {noise.big_batch}): the gradient's signal "
            "did not rise above its noise, or no noise was measured"
        )
    interval = f"95 % interval {noise.low:.3g}–{noise.high:.3g}" if noise.high else "no interval"
    return (
        f"Gradient noise scale phi = {noise.value:.3g} ({interval}), measured over "
        f"{noise.steps} optimizer steps of your configuration from its initial weights, "
        f"gradients of one micro-batch ({noise.small_batch} samples) against the whole step "
        f"({noise.big_batch}). A global batch B needs about (phi + B)/(phi + B0) times your "
        "samples to reach a loss (McCandlish et al. 2018); phi usually grows as training goes on"
    )
