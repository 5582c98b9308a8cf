"""What a default tune costs at this commit against another, measured back to back.

    python benchmarks/tune_cost.py --against 2dcba6f [--specs examples/mlp.py:factory ...]
                                   [--trials 16] [--rounds 1]

For each example and round: a fresh default tune (`advisor tune SPEC --trials N` in a fresh
output folder, each its own process) at the other commit, then one at this commit, so the two
see the same machine within minutes. The other commit runs from a git worktree of it (its advisor
and its examples: `python -m advisor` imports the advisor of the folder it starts in, and its
trials follow). The ratio of the wall times is issue 50's "Affordable" (at most 1.3x).
Results: benchmarks/results/tune_cost.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXAMPLES = (
    "examples/mlp.py:factory",
    "examples/data_bound.py:factory",
    "examples/teacher.py:factory",
    "examples/large_data.py:factory",
    "examples/hf_gpt2.py:factory",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the commit to compare with")
    parser.add_argument("--specs", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--trials", type=int, default=16, help="each tune's --trials")
    parser.add_argument("--rounds", type=int, default=1, help="tunes per commit and example")
    args = parser.parse_args()
    other = _worktree(args.against)
    rows = []
    for spec in args.specs:
        for round_ in range(args.rounds):
            before = _tune(other, spec, args.trials)
            now = _tune(ROOT, spec, args.trials)
            rows.append({"spec": spec, "round": round_, "against_s": before, "now_s": now})
            print(f"{spec} round {round_ + 1}: {before:.0f} s at {args.against}, {now:.0f} s now")
    _write(rows, args.against, _head())


def _worktree(commit: str) -> Path:
    """A detached worktree of `commit` beside the system's temporary files (made once)."""
    folder = Path(tempfile.gettempdir()) / f"advisor-{commit}"
    if not folder.exists():
        command = ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit]
        subprocess.run(command, check=True, capture_output=True)
    return folder


def _tune(tree: Path, spec: str, trials: int) -> float:
    """Wall seconds of one default tune of `spec` run from `tree`; it must succeed."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "advisor", "tune", spec, "--trials", str(trials)]
        start = time.monotonic()
        done = subprocess.run(
            [*command, "--out", out, "--quiet"], cwd=tree, capture_output=True, text=True
        )
        took = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{spec} from {tree} failed: {done.stderr[-2000:]}")
    return took


def _head() -> str:
    command = ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def _write(rows: list[dict[str, object]], against: str, head: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tune_cost.json").write_text(json.dumps(rows, indent=2))
    lines = [
        f"| example | {against} (s) | {head} (s) | ratio |",
        "|---|---|---|---|",
    ]
    for spec in dict.fromkeys(str(row["spec"]) for row in rows):
        mine = [row for row in rows if row["spec"] == spec]
        before = statistics.median(float(str(row["against_s"])) for row in mine)
        now = statistics.median(float(str(row["now_s"])) for row in mine)
        name = spec.split("/")[-1].split(":")[0]
        lines.append(f"| {name} | {before:.0f} | {now:.0f} | {now / before:.2f}x |")
    (RESULTS / "tune_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
