"""Does the claimed speed-up hold in the user's framework? Train the recommendation and the
baseline from advisor's exports in HF Trainer, Lightning and accelerate, and compare.

    python -m benchmarks.frameworks reports/mlp-factory [--seconds 15] [--repeats 3]

For each framework, the recommendation and the baseline are written as that framework's export
(`advisor export`'s files), then trained in fresh processes under the export's own launch line
(`benchmarks/framework_run.py`: the factory's model, data, loss and optimizer), interleaved,
`--repeats` pairs, each run about `--seconds` long at advisor's measured rate. Prints one
Markdown row per framework: the speed-up advisor claimed, the one delivered (the median of the
pairs' ratios of steady-state samples/s), and the second as a share of the first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import cast

from advisor.knobs import Framework, TrialConfig
from advisor.report.exports import EXPORT_FILES, write_exports
from advisor.results import Recommendation

FRAMEWORKS: tuple[Framework, ...] = ("hf", "lightning", "accelerate")
RUNNER = Path(__file__).with_name("framework_run.py")
WARMUP_STEPS = 5
# The launch lines' programs, as this interpreter's modules.
PROGRAMS = {
    "python": [sys.executable],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "accelerate": [sys.executable, "-m", "accelerate.commands.launch"],
}


def launch_line(exports: Path, framework: Framework) -> str:
    """The export's launch line, as it prints it."""
    if framework == "hf":
        return str(json.loads((exports / EXPORT_FILES["hf"]).read_text())["launch"])
    text = (exports / EXPORT_FILES[framework]).read_text()
    line = next(line for line in text.splitlines() if "Launch: " in line)
    return line.split("Launch: ", 1)[1].strip()


def command(line: str, arguments: list[str]) -> tuple[dict[str, str], list[str]]:
    """The environment and argv of a launch line, its script replaced by the runner."""
    words = shlex.split(line)
    env = {}
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    program = PROGRAMS[words[0]]
    if words[0] == "accelerate":
        words = words[1:]  # "launch"
    script = next(i for i, word in enumerate(words) if word == "your_script.py")
    return env, [*program, *words[1:script], str(RUNNER), *arguments]


def run_once(
    rec: Recommendation, config: TrialConfig, rate: float, framework: Framework, seconds: float
) -> float:
    """Steady-state samples/s of `config` trained in `framework` from its export."""
    as_recommended = rec.model_copy(update={"config": config, "samples_per_s": rate})
    with tempfile.TemporaryDirectory() as folder:
        write_exports(as_recommended, Path(folder))
        steps = WARMUP_STEPS + math.ceil(seconds * rate / config.global_batch_size)
        exports = Path(folder) / "exports"
        arguments = [framework, rec.spec, rec.workdir, str(exports), str(steps), str(WARMUP_STEPS)]
        env, argv = command(launch_line(exports, framework), arguments)
        root = str(Path(__file__).resolve().parents[1])
        completed = subprocess.run(
            argv, cwd=folder, capture_output=True, text=True, timeout=1200,
            env={**os.environ, **env, "PYTHONPATH": root},
        )  # fmt: skip
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        raise SystemExit(
            f"{framework} {config.label()} failed ({completed.returncode}):\n"
            f"{completed.stderr[-3000:]}"
        )
    return float(json.loads(lines[-1])["samples_per_s"])


def row(rec: Recommendation, framework: Framework, repeats: int, seconds: float) -> str:
    assert rec.baseline_samples_per_s is not None and rec.speedup is not None
    pairs = []
    for index in range(repeats):
        both = [(rec.config, rec.samples_per_s), (rec.baseline_config, rec.baseline_samples_per_s)]
        order = both if index % 2 == 0 else both[::-1]
        rates = {cfg.label(): run_once(rec, cfg, rate, framework, seconds) for cfg, rate in order}
        pairs.append((rates[rec.config.label()], rates[rec.baseline_config.label()]))
    delivered = statistics.median(r / b for r, b in pairs)
    runs = "; ".join(f"{r:,.0f} / {b:,.0f}" for r, b in pairs)
    return (
        f"| {framework} | {rec.config.label()} | {rec.speedup:.2f}x | {delivered:.2f}x "
        f"| {delivered / rec.speedup:.2f} | {runs} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a tune's --out folder")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="of each timed run")
    args = parser.parse_args()
    rec = Recommendation.model_validate_json((args.folder / "recommendation.json").read_text())
    if rec.speedup is None or rec.config == rec.baseline_config:
        raise SystemExit("the recommendation is your configuration: no speed-up to deliver")
    print("| framework | recommended | claimed | delivered | share of the claim "
          "| samples/s, recommended / baseline |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in args.frameworks.split(","):
        if name not in FRAMEWORKS:
            raise SystemExit(f"--frameworks: {name!r} is not one of {', '.join(FRAMEWORKS)}")
        framework = cast(Framework, name)
        print(row(rec, framework, args.repeats, args.seconds), flush=True)


if __name__ == "__main__":
    main()
