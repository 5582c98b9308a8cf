"""A tune over a workload with a fault in every corner of its space still ends with a
feasible recommendation, every failure kept and explained."""

import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from advisor.report.verdicts import rejection_text
from advisor.results import Recommendation
from tests.conftest import FAST_TUNE, ROOT, TINY, advisor_here, survivors

pytestmark = pytest.mark.slow
# A tmpfs this small fills after a few of a tune's trials: its study, WAL and trial logs.
SMALL_DISK = "600k"


def test_a_tune_over_every_fault_recommends_what_trained_and_explains_the_rest(tmp_path, marked):
    completed = advisor_here(
        "tune",
        "tests/workloads/faults.py:mixed",
        "--sampler", "grid",
        "--knobs", "classic,amp",  # searched even where the probe finds bf16 slow
        "--trials", "12",
        "--batch-sizes", "32,128",
        "--accumulation-steps", "1",
        "--max-world-size", "1",
        "--trial-seconds", "0.3",
        "--warmup-steps", "2",
        "--trial-timeout", "8",
        "--confirm-top", "1", "--confirm-max-repeats", "2",
        "--objective", "throughput",  # one configuration trains: nothing to race
        "--out", str(tmp_path),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    rec = Recommendation.model_validate_json((tmp_path / "recommendation.json").read_text())
    assert (rec.config.batch_size, rec.config.amp, rec.config.num_workers) == (32, "off", 0)
    report = (tmp_path / "report.md").read_text()
    assert "12 configurations measured: " in report
    for status in ("ok", "diverged", "oom", "crashed", "timeout", "error"):
        assert f" | {status} | " in report, status
    for reason in (
        "non-finite",  # diverged under autocast
        "simulated: tried to allocate 8.00 GiB",  # oom
        "SIGABRT",  # crashed
        "no result after 8 s",  # a hung loader worker
        "simulated: cannot decode sample",  # an error inside a loader worker
    ):
        assert reason in report, reason
    rejected = {(r.knob, r.value): r for r in rec.rejected_values}
    assert set(rejected) == {("amp", "bf16"), ("batch_size", "128"), ("num_workers", "1"),
                             ("num_workers", "2")}  # fmt: skip
    amp = rejected[("amp", "bf16")]
    assert amp.counterparts  # a usable trial and a failed one that differ in amp alone
    assert " diverged (the loss became non-finite" in rejection_text(amp)
    assert f"- {rejection_text(amp)}." in report
    assert survivors(marked) == []


def test_user_strings_full_of_markup_stay_inert_everywhere(tmp_path, marked):
    workload = tmp_path / 'we"ird\n<b>[bold]model.py'
    workload.write_text(
        "from tests.workloads.faults import hostile  # noqa: F401\n"
    )  # a spec with quotes, a newline, HTML and rich markup in it
    out = tmp_path / "out"
    completed = advisor_here(
        "tune", f"{workload}:hostile",
        "--sampler", "grid", "--trials", "4", "--batch-sizes", "32,64",
        "--accumulation-steps", "1", "--max-world-size", "1",
        "--trial-seconds", "0.2", "--warmup-steps", "1", "--confirm-top", "1",
        "--confirm-max-repeats", "2", "--objective", "throughput",
        "--out", str(out),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "Traceback" not in completed.stderr
    assert "rich [/] markup" in completed.stderr  # printed as text, not read as markup
    html = (out / "report.html").read_text()
    assert "<script" not in html and "<b>[bold]" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert "&lt;b&gt;[bold]model.py:hostile" in html
    markdown = (out / "report.md").read_text()
    assert "<script" not in markdown and "<b>" not in markdown
    assert "&lt;b>[bold]model.py:hostile" in markdown
    for line in markdown.splitlines():  # every table row stays one row
        if line.startswith("| ") and "ValueError" in line:
            assert line.endswith(" |") and "\\| a pipe" in line
    script = out / "train.py"
    compile(script.read_text(), str(script), "exec")
    trained = subprocess.run(
        [sys.executable, str(script), "--max-steps", "2", "--checkpoint", str(out / "c.pt")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert survivors(marked) == []


def test_a_tune_whose_baseline_and_next_trials_raise_alike_stops_and_says_why(tmp_path):
    """A corrupt record fails every configuration alike: after three trials the search stops,
    rather than measure the same error --trials times."""
    completed = advisor_here(
        "tune", "tests/workloads/faults.py:corrupt",
        "--trials", "10", "--trial-seconds", "0.3", "--warmup-steps", "2",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert completed.returncode == 3, completed.stderr
    assert "your baseline and the next 2 trials all raised ValueError" in completed.stderr
    assert "all 3 trials failed: 3 error (trial 0: ValueError: simulated: corrupt record)" in (
        completed.stderr
    )
    assert "Traceback" not in completed.stderr


def _mount_small_disk(path: Path, size: str) -> bool:
    """A size-limited tmpfs at `path`; False where this process may not mount one (not root)."""
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    return subprocess.run(mount, capture_output=True, check=False).returncode == 0


def _finished(folder: Path) -> set[tuple[str, ...]]:
    """The configurations of the finished trials a study folder holds."""
    study = optuna.load_study(storage=f"sqlite:///{folder / 'study.db'}", study_name=None)
    return {
        tuple(sorted(f"{k}={v}" for k, v in trial.params.items()))
        for trial in study.get_trials(states=(TrialState.COMPLETE,))
    }


def test_a_disk_that_fills_mid_tune_is_one_line_exit_1_and_the_same_command_resumes(tmp_path):
    disk = tmp_path / "disk"
    if not _mount_small_disk(disk, SMALL_DISK):
        pytest.skip("mounting a size-limited tmpfs needs root")
    roomy = tmp_path / "roomy"
    try:
        completed = advisor_here(
            "tune", f"{TINY}:factory", "--out", str(disk), "--trials", "6", *FAST_TUNE
        )
        shutil.copytree(disk, roomy)  # what the full disk kept
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert completed.returncode == 1, completed.stderr
    lines = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert "the disk is full" in lines[0] and "run the same command to resume" in lines[0]
    kept = _finished(roomy)
    assert kept, "no trial finished before the disk filled: make SMALL_DISK larger"

    resumed = advisor_here(
        "tune", f"{TINY}:factory", "--out", str(roomy), "--trials", "6", *FAST_TUNE
    )
    assert resumed.returncode == 0, resumed.stderr
    assert kept <= _finished(roomy)  # every trial the full disk kept, and more
