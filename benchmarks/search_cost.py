"""Search cost: what a tune costs, against measuring every configuration of the same space.

    python benchmarks/search_cost.py [--specs examples/mlp.py:factory ...] [--trials 20]
                                     [--machines slow-forced slow fp32-speed]

Each machine but the first is simulated on this CPU (benchmarks/simulate), so that both kinds
are covered whatever the CPU computes natively:
  native       this CPU as it is (on the 2-core VM: bf16 emulated, its matmuls ~70x slower);
  slow         bf16 matmuls 20x slower than fp32 (a CPU without native bf16): the probe decides;
  slow-forced  the same machine, with amp forced into the search (--knobs classic,amp): the
               worst case for the search, every bf16 trial must be stopped;
  fp32-speed   bf16 as fast as fp32: amp stays in the search, nothing is far slower.
For each workload and machine:
  (a) the grid: every configuration of search_quality.py's reduced space, amp included, each
      measured whole (warm-up steps, then a window of whole optimizer cycles, no early stop),
      as a tuner without time budgets measures it; cached per machine in
      benchmarks/results/search_cost_grid.json; with --fresh-grid, measured just before the
      tune and again just after it, and the mean of the two walls taken (this VM's speed shifts
      in episodes, benchmarks/machine_drift.py: a grid cached hours earlier biases the ratio);
  (b) advisor.tune over the same space with `--trials` and default settings otherwise.
It reports the configurations measured (derived: from another trial's timed parts, at another
accumulation, `advisor.search.siblings`, at no cost), the wall per trial run (median, p95,
max), the search's wall (its trials) and the whole
tune's (re-runs, noise trial and race included), each over the grid's wall; the longest trial
that was not a finalist against 3 x (window + its start-up); and quality: the samples/s of the
fastest configuration the search found over the grid's best, both re-measured in interleaved
rounds (the race may then recommend another global batch: that is the objective's choice).
Results: benchmarks/results/search_cost.json and .md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from search_quality import HARNESS, SPACE, remeasure

import advisor
from advisor.api import make_settings, validate
from advisor.knobs import TrialConfig
from advisor.search.space import build_space
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.hardware import probe_isolated
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

RESULTS = Path(__file__).parent / "results"
GRID_CACHE = RESULTS / "search_cost_grid.json"
SIMULATE = str(Path(__file__).parent / "simulate")
MACHINES = {
    "native": ("", ()),
    "slow": ("slow:20", ()),
    "slow-forced": ("slow:20", ("classic", "amp")),
    "fp32-speed": ("fp32", ()),
}
WINDOW_S = 2.0  # advisor's default trial window and warm-up steps, for the grid too
WARMUP_STEPS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="*", default=["examples/mlp.py:factory"])
    parser.add_argument("--machines", nargs="*", default=list(MACHINES), choices=MACHINES)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="re-measurements for quality")
    parser.add_argument("--early-stop", type=float, default=None, help="advisor's --early-stop")
    parser.add_argument(
        "--fresh-grid",
        action="store_true",
        help="measure the grid just before the tune and again just after it, and divide by the "
        "mean of the two (a VM whose speed shifts in episodes biases a cached grid)",
    )
    args = parser.parse_args()
    rows = []
    for machine in args.machines:
        _simulate(machine)
        for spec in args.specs:
            rows.append(_compare(spec, machine, args))
            print(json.dumps(rows[-1]["summary"]))
    RESULTS.mkdir(exist_ok=True)
    name = "search_cost" if args.early_stop is None else f"search_cost.early_stop_{args.early_stop}"
    rows = _with_earlier_rows(rows, RESULTS / f"{name}.json")
    (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=2))
    table = _markdown(rows, args.trials)
    (RESULTS / f"{name}.md").write_text(table)
    print(table)


def _with_earlier_rows(rows: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """These rows, and the last run's for other workloads or machines (so that one can be
    measured again on its own)."""
    fresh = {(row["summary"]["spec"], row["summary"]["machine"]) for row in rows}
    earlier = json.loads(path.read_text()) if path.exists() else []
    kept = [r for r in earlier if (r["summary"]["spec"], r["summary"]["machine"]) not in fresh]
    order = list(MACHINES)
    return sorted([*kept, *rows], key=lambda r: order.index(r["summary"]["machine"]))


def _simulate(machine: str) -> None:
    """Every child process from here on runs on the simulated machine."""
    paths = [SIMULATE, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, paths)))
    os.environ["ADVISOR_SIMULATE_BF16"] = MACHINES[machine][0]


def _compare(spec: str, machine: str, args: argparse.Namespace) -> dict[str, Any]:
    grid = _grid(spec, machine, fresh=args.fresh_grid)
    knobs = MACHINES[machine][1] or ("classic",)
    with tempfile.TemporaryDirectory() as out:
        started = time.monotonic()
        stop = {} if args.early_stop is None else {"early_stop": args.early_stop}
        result = advisor.tune(spec, trials=args.trials, knobs=knobs, out=out, **SPACE, **stop)
        tune_s = time.monotonic() - started
    if args.fresh_grid:
        grid = _bracket(grid, _grid(spec, machine, fresh=True))
    trials = [t for t in result.trials if t.role in ("baseline", "search")]
    ran = [t for t in trials if t.derived_from is None]  # the others came from their parts
    finalists = {c.number for c in result.confirmations}
    walls = sorted(t.result.wall_s or 0.0 for t in ran)
    over = [
        (t.number, (t.result.wall_s or 0.0) / (WINDOW_S + (t.result.startup_s or 0.0)))
        for t in ran
        if t.number not in finalists
    ]
    worst = max(over, key=lambda pair: pair[1], default=(None, 0.0))
    # The search's quality is its fastest configuration (the race may then choose another
    # global batch: that is the objective's choice, not the search's).
    pick = result.recommendation.throughput_pick
    chosen = pick.config if pick is not None else result.recommendation.config
    best = TrialConfig.model_validate(grid["best"])
    rates = remeasure(spec, {"grid best": best, "advisor": chosen}, args.repeats)
    search_s = sum(walls)
    summary = {
        "spec": spec,
        "machine": machine,
        "amp": "fixed off"
        if any(k.name == "amp" and k.value == "off" for k in result.recommendation.fixed_knobs)
        else "searched",
        "grid_configs": grid["configs"],
        "grid_s": grid["wall_s"],
        "trials": len(trials),
        "derived": len(trials) - len(ran),
        "stopped": sum(t.result.status == "stopped" or t.result.stopped_early for t in ran),
        "estimated": sum(t.result.estimated for t in ran),
        "trial_s": {
            "median": statistics.median(walls),
            "p95": walls[min(len(walls) - 1, round(0.95 * (len(walls) - 1)))],
            "max": walls[-1],
        },
        "worst_non_finalist": {"trial": worst[0], "x_window_plus_startup": worst[1]},
        "search_s": search_s,
        "tune_s": tune_s,
        "search_over_grid": search_s / grid["wall_s"],
        "tune_over_grid": tune_s / grid["wall_s"],
        "chosen": chosen.label(),
        "recommended": result.recommendation.config.label(),
        "grid_best": best.label(),
        "quality": statistics.median(rates["advisor"]) / statistics.median(rates["grid best"]),
    }
    if "walls_s" in grid:
        summary["grid_walls_s"] = grid["walls_s"]
    return {
        "summary": summary,
        "trials": [_trial_row(t) for t in trials],
        "re_runs": [_trial_row(c) for c in result.confirmations],
        "remeasured": rates,
    }


def _trial_row(record: Any) -> dict[str, Any]:
    result = record.result
    return {
        "number": record.number,
        "config": result.config.label(),
        "status": result.status,
        "samples_per_s": result.samples_per_s,
        "wall_s": result.wall_s,
        "startup_s": result.startup_s,
        "estimated": result.estimated,
        "derived_from": record.derived_from,
        "reason": record.note,
    }


def _bracket(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The grid measured before the tune and after it: the mean of their walls, the best of
    the two measurements together."""
    rates = {k: (v + after["rates"][k]) / 2 for k, v in before["rates"].items()}
    best = before if max(before["rates"].values()) >= max(after["rates"].values()) else after
    return {
        "configs": before["configs"],
        "wall_s": (before["wall_s"] + after["wall_s"]) / 2,
        "walls_s": [before["wall_s"], after["wall_s"]],
        "best": best["best"],
        "rates": rates,
    }


def _grid(spec: str, machine: str, *, fresh: bool = False) -> dict[str, Any]:
    """Every configuration of the reduced space, amp included, measured whole; cached unless
    `fresh`."""
    hardware = probe_isolated()
    settings = make_settings(spec, knobs=("classic", "amp"), **SPACE)
    space = build_space(settings, hardware, validate(spec).task)
    terms = [spec, SPACE, MACHINES[machine][0], WINDOW_S, WARMUP_STEPS, advisor.__version__]
    terms.append(HARNESS)
    terms.append(hardware.model_dump(include={"cpu_model", "cores", "torch_version"}))
    key = hashlib.sha256(json.dumps(terms, sort_keys=True).encode()).hexdigest()[:16]
    cache = json.loads(GRID_CACHE.read_text()) if GRID_CACHE.exists() else {}
    if fresh:
        grid = _measure_grid(spec, space.all_configs())
        print(f"{spec} on {machine}: grid of {grid['configs']} in {grid['wall_s']:.0f} s (fresh)")
        return grid
    if key not in cache:
        cache[key] = _measure_grid(spec, space.all_configs())
        RESULTS.mkdir(exist_ok=True)
        GRID_CACHE.write_text(json.dumps(cache, indent=2))
    grid = cache[key]
    print(f"{spec} on {machine}: grid of {grid['configs']} in {grid['wall_s']:.0f} s")
    return grid


def _measure_grid(spec: str, configs: list[TrialConfig]) -> dict[str, Any]:
    launch = TrialLaunch(spec=spec, cwd=Path.cwd(), warmup_steps=WARMUP_STEPS,
                         trial_seconds=WINDOW_S, timeout_s=900)  # fmt: skip
    measured = []
    with tempfile.TemporaryDirectory() as logs:
        for index, config in enumerate(configs):
            result = ProcessRunner(launch).run(
                WindowOrder(config=config, whole_cycles=True), Path(logs) / f"{index}.log"
            )
            measured.append((config, result.samples_per_s or 0.0, result.wall_s or 0.0))
            rate, wall = result.samples_per_s or 0.0, result.wall_s or 0.0
            print(f"  {index + 1}/{len(configs)} {config.label()}: {rate:,.0f}/s, {wall:.1f} s")
    best = max(measured, key=lambda row: row[1])[0]
    return {
        "configs": len(configs),
        "wall_s": sum(wall for _, _, wall in measured),
        "best": best.model_dump(mode="json"),
        "rates": {config.label(): rate for config, rate, _ in measured},
    }


def _markdown(rows: list[dict[str, Any]], trials: int) -> str:
    lines = [
        f"Reduced space: batch sizes {SPACE['batch_sizes']}, accumulation "
        f"{SPACE['accumulation_steps']}, every parallel layout and worker count, amp off/bf16; "
        f"window {WINDOW_S:g} s; advisor with {trials} trials.",
        "",
        "| workload | machine | amp | grid (configs, wall) | configurations (derived; of the "
        "trials run: stopped, estimated) | per trial run median / p95 / max "
        "| longest non-finalist | search | search ÷ grid | whole tune | tune ÷ grid "
        "| fastest found | quality | recommended |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = row["summary"]
        t = s["trial_s"]
        lines.append(
            f"| {s['spec']} | {s['machine']} | {s['amp']} | {s['grid_configs']}, "
            f"{s['grid_s']:.0f} s{_fresh(s)} | {s['trials']} ({s.get('derived', 0)}; "
            f"{s['stopped']}, {s['estimated']}) | "
            f"{t['median']:.1f} / {t['p95']:.1f} / {t['max']:.1f} s | "
            f"{s['worst_non_finalist']['x_window_plus_startup']:.2f}x (window + start-up) | "
            f"{s['search_s']:.0f} s | {s['search_over_grid']:.2f} | {s['tune_s']:.0f} s | "
            f"{s['tune_over_grid']:.2f} | {s['chosen']} | {s['quality']:.2f} | "
            f"{s['recommended']} |"
        )
    return "\n".join(lines) + "\n"


def _fresh(summary: dict[str, Any]) -> str:
    """How a fresh grid's wall was found: before and after the tune."""
    walls = summary.get("grid_walls_s")
    return f" (fresh: {walls[0]:.0f} s before, {walls[1]:.0f} s after)" if walls else ""


if __name__ == "__main__":
    main()
