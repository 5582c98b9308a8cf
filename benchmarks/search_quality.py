"""Search quality and cost: advisor's search against random search and the exhaustive grid.

    python benchmarks/search_quality.py [--specs examples/mlp.py:factory ...] [--budget 0.25]

For each example workload, over one reduced space (stated in the output):
  (a) grid: every configuration, each for its whole window (the oracle), cached per machine and
      space in benchmarks/results/search_quality_oracle.json, so it is not re-run needlessly;
  (b) random: Optuna's RandomSampler with `--budget` x the grid's trials;
  (c) advisor: the default (TPE) search with the same number of trials.
Random and advisor stop trials far slower than the best early (`--early-stop`, the default).
Each runs as `advisor.tune` does, re-measuring its finalists. Then the configuration each chose,
and the baseline, are re-measured by one independent harness (isolated trials, interleaved,
`--repeats` rounds, median). Quality = chosen / oracle's choice; cost = search wall time / grid
wall time. Results: benchmarks/results/search_quality.json and .md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import advisor
from advisor.knobs import TrialConfig
from advisor.trial.child.hardware import probe
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

RESULTS = Path(__file__).parent / "results"
ORACLE_CACHE = RESULTS / "search_quality_oracle.json"
EXAMPLES = ("examples/mlp.py:factory", "examples/data_bound.py:factory", "examples/cnn.py:factory")
# A reduced space: every parallel layout, AMP setting and loader worker count the machine offers,
# with two micro-batches and two accumulation steps (the full default space has several hundred
# configurations: hours of grid on 2 cores).
SPACE = {"batch_sizes": "32,512", "accumulation_steps": "1,4"}
# Bumped when the trial harness's cost changes (2: trials fork from a pre-imported launcher;
# 3: loader workers are killed at a trial's end), so that the grid's wall time is measured again.
HARNESS = 3
TRIAL = {"trial_seconds": 1.0, "warmup_steps": 2, "confirm_top": 2, "confirm_repeats": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--budget", type=float, default=0.25, help="trials / grid trials")
    parser.add_argument("--repeats", type=int, default=5, help="independent re-measurements")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = [_compare(spec, args) for spec in args.specs]
    RESULTS.mkdir(exist_ok=True)
    rows = _with_earlier_rows(rows, args.budget)
    report = {"space": SPACE, "trial": TRIAL, "budget": args.budget, "rows": rows}
    (RESULTS / "search_quality.json").write_text(json.dumps(report, indent=2))
    table = _markdown(rows)
    (RESULTS / "search_quality.md").write_text(table)
    print(table)


def _with_earlier_rows(rows: list[dict[str, Any]], budget: float) -> list[dict[str, Any]]:
    """These rows, and those of other workloads from the last run under the same terms (so one
    workload can be measured again on its own)."""
    path = RESULTS / "search_quality.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    same_terms = [earlier.get(k) for k in ("space", "trial", "budget")] == [SPACE, TRIAL, budget]
    fresh = {row["spec"] for row in rows}
    kept = [row for row in earlier.get("rows", []) if same_terms and row["spec"] not in fresh]
    order = {spec: index for index, spec in enumerate(EXAMPLES)}
    return sorted([*kept, *rows], key=lambda row: order.get(row["spec"], len(order)))


def _compare(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    oracle = _oracle(spec)
    trials = max(2, round(args.budget * oracle["trials"]))
    methods = {"grid": oracle}
    for name, sampler in (("random", "random"), ("advisor", "tpe")):
        methods[name] = _search(spec, sampler, trials, args.seed)
        print(f"{spec} {name}: {methods[name]['chosen']} in {methods[name]['wall_s']:.0f} s")
    baseline = TrialConfig.model_validate(oracle["baseline"])
    chosen = {name: TrialConfig.model_validate(m["config"]) for name, m in methods.items()}
    rates = remeasure(spec, {**chosen, "baseline": baseline}, args.repeats)
    best = statistics.median(rates["grid"])
    return {
        "spec": spec,
        "grid_trials": oracle["trials"],
        "methods": {
            name: {
                "chosen": methods[name]["chosen"],
                "trials": methods[name]["trials"],
                "stopped_early": methods[name].get("stopped_early", 0),
                "re_runs": methods[name].get("re_runs", 0),
                "wall_s": methods[name]["wall_s"],
                "samples_per_s": rates[name],
                "quality": statistics.median(rates[name]) / best,
                "cost": methods[name]["wall_s"] / oracle["wall_s"],
                "speedup": statistics.median(rates[name]) / statistics.median(rates["baseline"]),
            }
            for name in methods
        },
    }


def _oracle(spec: str) -> dict[str, Any]:
    """The grid over the whole reduced space, from the cache when this machine ran it."""
    key = _cache_key(spec)
    cache = json.loads(ORACLE_CACHE.read_text()) if ORACLE_CACHE.exists() else {}
    if key not in cache:
        cache[key] = _search(spec, "grid", 10_000, seed=0, early_stop=0.0)
        RESULTS.mkdir(exist_ok=True)
        ORACLE_CACHE.write_text(json.dumps(cache, indent=2))
    print(f"{spec} grid: {cache[key]['chosen']} ({cache[key]['trials']} trials)")
    return cache[key]


def _cache_key(spec: str) -> str:
    machine = probe().model_dump(include={"cpu_model", "cores", "memory_bytes", "torch_version"})
    text = json.dumps([spec, SPACE, TRIAL, machine, advisor.__version__, HARNESS], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _search(
    spec: str, sampler: str, trials: int, seed: int, early_stop: float = 0.5
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        started = time.monotonic()
        result = advisor.tune(spec, sampler=sampler, trials=trials, seed=seed, out=out,
                              early_stop=early_stop, **SPACE, **TRIAL)  # fmt: skip
        wall_s = time.monotonic() - started
    rec = result.recommendation
    return {
        "config": rec.config.model_dump(mode="json"),
        "chosen": rec.config.label(),
        "baseline": rec.baseline_config.model_dump(mode="json"),
        "trials": sum(t.role in ("baseline", "search") for t in result.trials),
        "stopped_early": sum(t.result.stopped_early for t in result.trials),
        "re_runs": len(result.confirmations),
        "wall_s": wall_s,
    }


def remeasure(spec: str, configs: dict[str, TrialConfig], repeats: int) -> dict[str, list[float]]:
    """Each chosen configuration re-measured by the same harness, in interleaved rounds; a
    configuration chosen by several methods is measured once per round and shared."""
    launch = TrialLaunch(spec=spec, cwd=Path.cwd(), warmup_steps=3, trial_seconds=3.0,
                         timeout_s=600)  # fmt: skip
    distinct = list(dict.fromkeys(configs.values()))
    measured: dict[TrialConfig, list[float]] = {config: [] for config in distinct}
    with tempfile.TemporaryDirectory() as logs:
        for round_index in range(repeats):
            for index, config in enumerate(distinct):
                log = Path(logs) / f"{round_index}-{index}.log"
                measured[config].append(
                    ProcessRunner(launch).run(WindowOrder(config=config), log).samples_per_s or 0.0
                )
    return {name: measured[config] for name, config in configs.items()}


def _markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"Reduced space: batch sizes {SPACE['batch_sizes']}, accumulation "
        f"{SPACE['accumulation_steps']}, every parallel layout, AMP setting and worker count "
        f"this machine offers; trial window {TRIAL['trial_seconds']} s.",
        "",
        "| workload | method | trials (stopped early) | re-runs | chosen | samples/s (median) "
        "| quality | cost | speed-up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for name, method in row["methods"].items():
            lines.append(
                f"| {row['spec']} | {name} | {method['trials']} ({method['stopped_early']}) | "
                f"{method['re_runs']} | {method['chosen']} | "
                f"{statistics.median(method['samples_per_s']):,.0f} | {method['quality']:.2f} | "
                f"{method['cost']:.2f} | {method['speedup']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
