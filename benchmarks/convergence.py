"""Time to the baseline's loss over a horizon longer than the race, for each pick a tune makes.

    python benchmarks/convergence.py [--specs examples/mlp.py:factory ...] [--seconds 60]
                                     [--repeats 3] [--trials 20] [--evaluations 20] [--schedule]

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

Each then trains `--repeats` times in fresh processes, from the same initial weights, for
`--seconds` of training time (at least six race lengths), with advisor's race loss (held-out
slice, fp32, eval mode) at `--evaluations` evenly spaced points. Configurations that coincide
share their runs. The target is the median over the baseline's repeats of its lowest loss; each
row gives the time each repeat first reached it. Results: benchmarks/results/convergence.json
and .md.
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
from advisor.decide.race.verdict import time_to_loss
from advisor.knobs import TrialConfig
from advisor.results import BatchSchedule, LrPlan, RaceCurve, TuneResult
from advisor.trial.orders import RaceOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from advisor.trial.protocol import RACE_EVALUATIONS

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
    parser.add_argument("--seconds", type=float, default=60.0, help="training time per run")
    parser.add_argument("--repeats", type=int, default=3, help="fresh runs per configuration")
    parser.add_argument("--trials", type=int, default=20, help="the tune's --trials")
    parser.add_argument(
        "--evaluations",
        type=int,
        default=RACE_EVALUATIONS,
        help="loss points per run (more for a model whose loss bottoms out within seconds)",
    )
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
        rows.append(_example(spec, args.seconds, args.repeats, tune, args.evaluations))
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
    spec: str, seconds: float, repeats: int, settings: dict[str, Any], evaluations: int
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = advisor.tune(spec, out=Path(out), **settings)
        tune_s = time.perf_counter() - started
        picks = _schedule_picks(result) if "schedule" in settings else _picks(result)
        curves: dict[Pick, list[RaceCurve | None]] = {}
        for pick in dict.fromkeys(picks.values()):
            curves[pick] = [
                _train(spec, *pick, seconds, evaluations, Path(out)) for _ in range(repeats)
            ]
    rec, effort = result.recommendation, result.effort
    bests = [c.best_loss for c in curves[picks["baseline"]] if c is not None]
    target = statistics.median(bests) if bests else None
    return {
        "spec": spec,
        "tune_s": tune_s,
        "search_share": effort.share if effort else None,
        "trials_ran": effort.ran if effort else None,
        "target_loss": target,
        "verdict": rec.race.verdict if rec.race else None,
        "schedule": rec.schedule.model_dump(mode="json") if rec.schedule else None,
        "noise_scale": rec.noise_scale.model_dump(mode="json") if rec.noise_scale else None,
        "runs": [_row(name, pick, curves[pick], target) for name, pick in picks.items()],
    }


def _row(
    name: str, pick: Pick, curves: list[RaceCurve | None], target: float | None
) -> dict[str, object]:
    config, lr, schedule = pick
    return {
        "name": name,
        "config": schedule.label(config.world_size) if schedule else config.label(),
        "global_batch": config.global_batch_size,
        "lr": f"{schedule.rule} rule per stage"
        if schedule and schedule.rule != "yours"
        else lr.label,
        "seconds_to_target": [
            time_to_loss(c, target) if c is not None and target is not None else None
            for c in curves
        ],
        "final_loss": [c.final_loss if c is not None else None for c in curves],
    }


def _train(
    spec: str,
    config: TrialConfig,
    lr: LrPlan,
    schedule: BatchSchedule | None,
    seconds: float,
    evaluations: int,
    out: Path,
) -> RaceCurve | None:
    launch = TrialLaunch(
        spec=spec,
        cwd=Path.cwd(),
        warmup_steps=1,
        trial_seconds=seconds,
        timeout_s=3 * seconds + 300,
    )
    result = ProcessRunner(launch).run(
        RaceOrder(
            config=config,
            seconds=launch.trial_seconds,
            lr=lr,
            schedule=schedule,
            evaluations=evaluations,
        ),
        out / "run.log",
    )
    if result.race is None:
        print(f"{spec} {config.label()}: {result.status} {result.reason}", flush=True)
    return result.race


def _markdown(rows: list[dict[str, object]], seconds: float) -> str:
    lines = [
        "| example | run | configuration | global batch | lr | "
        f"time to the baseline's best {seconds:g}-s loss, each repeat | final loss (median) |",
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
        lines.append(
            f"- {Path(str(row['spec']).split(':')[0]).name}: tune {row['tune_s']:.0f} s, "
            f"{row['trials_ran']} search trials ran, "
            + (f"{share:.0%} at your batch or one that raced; " if share is not None else "")
            + f"target loss {row['target_loss']}; race: {row['verdict']}"
            + (f"; schedule: {_verdict(row['schedule'])}" if row.get("schedule") else "")
        )
    return "\n".join(lines) + "\n"


def _verdict(summary: Any) -> str:
    return str(summary["verdict"])


if __name__ == "__main__":
    main()
