"""Time to the baseline's loss over a horizon longer than the race, for each pick a tune makes.

    python benchmarks/convergence.py [--specs examples/mlp.py:factory ...] [--seconds 60]
                                     [--repeats 3] [--trials 20] [--schedule]

For each example, one default `advisor.tune` (objective time-to-loss) names four configurations:

- the baseline (your configuration);
- the best at your global batch (the search's fastest there, `TuneResult.effort`);
- the throughput pick (the highest re-measured samples/s, with your learning rate, as a
  throughput tuner would ship it);
- the default recommendation, with the learning rate it ships.

With `--schedule` the tune runs `--schedule auto` with `--schedule-seconds` the horizon (or the
one given, to check a schedule beyond the horizon it was raced at), and the rows are the
baseline, the fixed recommendation and the batch-size schedule (the shipped one, or the sooner
of the two the tune raced, marked "not shipped"), trained as train.py trains it.

Each then trains `--repeats` times in fresh processes, each repeat from a seed of its own (other
initial weights and data order, the same for every configuration of a repeat), for `--seconds`
of training time (`--seconds 0`: the horizon the recommendation's claim was decided at), with
advisor's race loss (held-out slice, fp32, eval mode) on a geometric grid of sample counts.
Configurations that coincide share their runs. In each repeat the target is where the baseline's
settled curve ends, as the race reads it (`advisor.decide.race.estimate`), and each run is read as
the race reads a racer: up to where one timed to the target stops (two evaluations in a row at or
below it). Each row gives, per repeat, the time plain training takes to that loss: the samples
the curve took to reach it (`advisor.decide.race.estimate.samples_to_loss`) over the samples/s
of a plain run of the same configuration and seed, as long as the horizon, with no evaluation
(a window timed as the re-runs time one, in a fresh process of its own). A run that evaluates
stops its clock while it does, and loader workers fill their queues meanwhile: a lead that a
user's run, which does not pause, never gets. The race clock's reading is kept beside it
(`race_clock_s`). A schedule's rows keep the race clock (its samples/s changes by stage). The
recommendation's row gives the ratio of the baseline's time to its own, per repeat, and whether
their geometric mean falls in the claimed interval, widened by 15 %. Results:
benchmarks/results/convergence.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import advisor
from advisor.decide.race.estimate import samples_to_loss, seconds_to_loss, target_of
from advisor.decide.race.grid import sample_grid
from advisor.decide.race.run import CLOCK_SLACK
from advisor.knobs import TrialConfig
from advisor.results import BatchSchedule, LrPlan, RaceCurve, TuneResult
from advisor.trial.orders import RaceOrder, WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

RESULTS = Path(__file__).parent / "results"
EXAMPLES = (
    "examples/mlp.py:factory",
    "examples/data_bound.py:factory",
    "examples/teacher.py:factory",
    "examples/hf_gpt2.py:factory",
    "examples/large_data.py:factory",
)
Pick = tuple[TrialConfig, LrPlan, BatchSchedule | None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="*", default=list(EXAMPLES))
    parser.add_argument(
        "--seconds", type=float, default=0.0, help="training time per run (0: the claim's horizon)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="fresh runs per configuration")
    parser.add_argument("--trials", type=int, default=20, help="the tune's --trials")
    parser.add_argument("--schedule", action="store_true", help="tune and train the schedule")
    parser.add_argument(
        "--schedule-seconds", type=float, help="the tune's --schedule-seconds (default --seconds)"
    )
    args = parser.parse_args()
    rows = []
    name = "convergence-schedule" if args.schedule else "convergence"
    horizon = args.schedule_seconds or args.seconds
    if args.schedule and horizon != args.seconds:
        name += f"-{horizon:g}s-tuned"
    for spec in args.specs:
        tune = _tune_settings(args.trials, horizon if args.schedule else None)
        rows.append(_example(spec, args.seconds, args.repeats, tune))
        _write(rows, args.seconds, name)  # each example's figures as soon as it has them


def _tune_settings(trials: int, schedule_seconds: float | None) -> dict[str, Any]:
    if schedule_seconds is None:
        return {"trials": trials}
    return {"trials": trials, "schedule": "auto", "schedule_seconds": schedule_seconds}


def _write(rows: list[dict[str, object]], seconds: float, name: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=2))
    table = _markdown(rows, seconds)
    (RESULTS / f"{name}.md").write_text(table)
    print(table, flush=True)


def _picks(result: TuneResult) -> dict[str, Pick]:
    rec = result.recommendation
    best = result.effort.best_at_yours if result.effort else None
    at_yours = next((t.result.config for t in result.trials if t.number == best), None)
    throughput = rec.throughput_pick.config if rec.throughput_pick else rec.config
    return {
        "baseline": (rec.baseline_config, LrPlan(), None),
        "best at your batch": (at_yours or rec.baseline_config, LrPlan(), None),
        "throughput pick": (throughput, LrPlan(), None),
        "recommendation": (rec.config, rec.lr, None),
    }


def _schedule_picks(result: TuneResult) -> dict[str, Pick]:
    rec = result.recommendation
    picks: dict[str, Pick] = {
        "baseline": (rec.baseline_config, LrPlan(), None),
        "fixed recommendation": (rec.config, rec.lr, None),
    }
    summary = rec.schedule
    raced = [r for r in summary.racers if r.role == "schedule"] if summary else []
    racer = summary.shipped_racer if summary else None
    name = "schedule"
    if racer is None and raced:
        racer = min(raced, key=lambda r: r.time_to_target_s or float("inf"))
        name = "schedule (not shipped)"
    if racer is not None:
        picks[name] = (racer.config, LrPlan(), racer.schedule)
    return picks


def _example(
    spec: str, seconds: float, repeats: int, settings: dict[str, Any]
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = advisor.tune(spec, out=Path(out), **settings)
        tune_s = time.perf_counter() - started
        rec = result.recommendation
        claim = rec.time_to_loss
        seconds = seconds or (claim.seconds if claim else rec.race.seconds if rec.race else 10)
        picks = _schedule_picks(result) if "schedule" in settings else _picks(result)
        curves: dict[Pick, list[RaceCurve | None]] = {}
        rates: dict[Pick, list[float | None]] = {}
        rate = max(r.result.samples_per_s or 0.0 for r in result.trials)
        smallest = min(p[0].global_batch_size for p in picks.values())
        yours = rec.baseline_samples_per_s or rate
        grid = sample_grid(smallest, yours * seconds, rate * seconds)
        for pick in dict.fromkeys(picks.values()):
            # Your configuration trains what it trains in the race: the samples its re-runs'
            # samples/s trains in the horizon, so that it sets the target as deep as there
            # (`advisor.decide.race.run._bounds`).
            samples = int(yours * seconds) if pick == picks["baseline"] else None
            curves[pick], rates[pick] = [], []
            for seed in range(repeats):
                curve = _train(spec, *pick, (seconds, samples), (grid, 100 + seed), Path(out))
                curves[pick].append(curve)
                # A schedule's samples/s changes by stage: its rows keep the race clock.
                plain = pick[2] is None
                seeded = (spec, pick[0], seconds, 100 + seed, Path(out))
                rates[pick].append(_plain_rate(*seeded) if plain else None)
    effort = result.effort
    baselines = curves[picks["baseline"]]
    targets = [target_of(c) if c is not None else None for c in baselines]
    runs = [_row(name, pick, curves[pick], rates[pick], targets) for name, pick in picks.items()]
    return {
        "spec": spec,
        "tune_s": tune_s,
        "seconds": seconds,
        "search_share": effort.share if effort else None,
        "trials_ran": effort.ran if effort else None,
        "target_loss": statistics.median(t for t in targets if t is not None),
        "verdict": rec.race.verdict.kind if rec.race else None,
        "claim": claim.model_dump(mode="json") if claim else None,
        "independent": _independent(runs, claim),
        "schedule": rec.schedule.model_dump(mode="json") if rec.schedule else None,
        "noise_scale": rec.noise_scale.model_dump(mode="json") if rec.noise_scale else None,
        "runs": runs,
    }


def _independent(runs: list[dict[str, Any]], claim: Any) -> dict[str, Any] | None:
    """The recommendation's time to the loss against the baseline's in the independent runs:
    per repeat, and their geometric mean, and whether the claim's interval (widened by 15 %)
    holds it."""
    ratios = _ratios(runs, "seconds_to_target")
    if not ratios:
        return None
    typical = statistics.geometric_mean(ratios)
    low, high = (claim.low, claim.high) if claim else (1.0, 1.0)
    on_the_race_clock = _ratios(runs, "race_clock_s")
    return {
        "ratios": ratios,
        "typical": typical,
        "within": low / 1.15 <= typical <= high * 1.15,
        "race_clock_typical": statistics.geometric_mean(on_the_race_clock)
        if on_the_race_clock
        else None,
    }


def _ratios(runs: list[dict[str, Any]], key: str) -> list[float]:
    """Per repeat, the baseline's time to the target over the recommendation's."""
    times = {run["name"]: run[key] for run in runs}
    pairs = zip(times["baseline"], times["recommendation"], strict=True)
    return [mine / theirs for mine, theirs in pairs if mine and theirs]


def _row(
    name: str,
    pick: Pick,
    curves: list[RaceCurve | None],
    rates: list[float | None],
    targets: list[float | None],
) -> dict[str, object]:
    config, lr, schedule = pick
    runs = list(zip(curves, rates, targets, strict=True))
    return {
        "name": name,
        "config": schedule.label(config.world_size) if schedule else config.label(),
        "global_batch": config.global_batch_size,
        "lr": f"{schedule.rule} rule per stage"
        if schedule and schedule.rule != "yours"
        else lr.label,
        "seconds_to_target": [_plain_seconds(c, rate, target) for c, rate, target in runs],
        "race_clock_s": [
            seconds_to_loss(c, target) if c is not None and target is not None else None
            for c, _, target in runs
        ],
        "plain_samples_per_s": rates,
        "final_loss": [c.final_loss if c is not None else None for c in curves],
    }


def _plain_seconds(
    curve: RaceCurve | None, rate: float | None, target: float | None
) -> float | None:
    """Plain training's time to `target`: the samples the curve took over the plain run's
    samples/s; the curve's own clock where there was no plain run."""
    if curve is None or target is None:
        return None
    if rate is None:
        return seconds_to_loss(curve, target)
    samples = samples_to_loss(curve, target)
    return samples / rate if samples is not None else None


def _launch(spec: str, seconds: float, seed: int) -> TrialLaunch:
    """A fresh process from `seed` (initial weights, data order) for about `seconds`."""
    return TrialLaunch(
        spec=spec,
        cwd=Path.cwd(),
        seed=seed,
        warmup_steps=1,
        trial_seconds=seconds,
        timeout_s=3 * seconds + 300,
    )


def _plain_rate(
    spec: str, config: TrialConfig, seconds: float, seed: int, out: Path
) -> float | None:
    """Samples/s of plain training, no evaluation, over `seconds` after a warm-up: one window
    as the re-runs time one (whole optimizer cycles), in a fresh process."""
    launch = _launch(spec, seconds, seed)
    result = ProcessRunner(launch).run(WindowOrder(config=config, whole_cycles=True), out / "w.log")
    if result.samples_per_s is None:
        print(f"{spec} {config.label()} plain: {result.status} {result.reason}", flush=True)
    return result.samples_per_s


def _train(
    spec: str,
    config: TrialConfig,
    lr: LrPlan,
    schedule: BatchSchedule | None,
    bounds: tuple[float, int | None],
    grid_and_seed: tuple[tuple[int, ...], int],
    out: Path,
) -> RaceCurve | None:
    """One run of `bounds` seconds of training, or where it gives samples, those samples (its
    clock may run `CLOCK_SLACK` times the seconds)."""
    (seconds, samples), (grid, seed) = bounds, grid_and_seed
    launch = _launch(spec, seconds, seed)
    clock = seconds * CLOCK_SLACK if samples is not None else seconds
    order = RaceOrder(
        config=config, seconds=clock, lr=lr, schedule=schedule, grid=grid, max_samples=samples
    )
    result = ProcessRunner(launch).run(order, out / "run.log")
    if result.race is None:
        print(f"{spec} {config.label()}: {result.status} {result.reason}", flush=True)
    return result.race


def _markdown(rows: list[dict[str, object]], seconds: float) -> str:
    lines = [
        "| example | run | configuration | global batch | lr | "
        f"plain training's time to the baseline's {f'{seconds:g}-s ' if seconds else ''}settled "
        "loss, each repeat "
        "| final loss (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for run in row["runs"]:  # type: ignore[attr-defined]
            times = ", ".join(
                f"{t:.1f} s" if t is not None else "not reached" for t in run["seconds_to_target"]
            )
            finals = [f for f in run["final_loss"] if f is not None]
            final = f"{statistics.median(finals):.4g}" if finals else "failed"
            lines.append(
                f"| {Path(str(row['spec']).split(':')[0]).name} | {run['name']} | "
                f"{run['config']} | {run['global_batch']} | {run['lr']} | {times} | {final} |"
            )
    lines.append("")
    for row in rows:
        share = row["search_share"]
        claim: Any = row.get("claim")
        independent: Any = row.get("independent")
        claimed = (
            f"{claim['speedup']:.2f}x ({claim['low']:.2f}-{claim['high']:.2f}x)"
            if claim
            else "none"
        )
        measured = "not measured"
        if independent:
            each = ", ".join(f"{r:.2f}" for r in independent["ratios"])
            where = "inside" if independent["within"] else "OUTSIDE"
            measured = f"{independent['typical']:.2f}x ({each}), {where} the claim ±15 %"
            if independent.get("race_clock_typical"):
                measured += f" (on the race clock: {independent['race_clock_typical']:.2f}x)"
        lines.append(
            f"- {Path(str(row['spec']).split(':')[0]).name}: tune {row['tune_s']:.0f} s, "
            f"{row['trials_ran']} search trials ran, "
            + (f"{share:.0%} at your batch or one that raced; " if share is not None else "")
            + f"race: {row['verdict']}; claimed {claimed}, independent runs over "
            f"{row['seconds']:g} s: {measured}"
            + (f"; schedule: {_verdict(row['schedule'])}" if row.get("schedule") else "")
        )
    return "\n".join(lines) + "\n"


def _verdict(summary: Any) -> str:
    return str(summary["verdict"])


if __name__ == "__main__":
    main()
