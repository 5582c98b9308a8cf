"""A real tuning run of a tiny workload, end to end, then its resumption."""

import contextlib
import csv
import json
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest

import advisor
from advisor import TuneResult
from advisor.report.render import render_html
from advisor.report.verdicts import bottleneck_text, race_verdict
from advisor.results import Recommendation
from tests.browser import needs_chromium, rendered_dom, screenshot
from tests.conftest import FAST_TUNE, ROOT, TINY, advisor_here, free_port, trials_counted

pytestmark = pytest.mark.slow

# One process only: DDP trials cost ~5 s of start-up each and have tests of their own
# (tests/trial/test_distributed.py, tests/search/test_study.py).
SETTINGS = {
    "max_world_size": 1,
    "trial_seconds": 0.3,
    "warmup_steps": 2,
    "confirm_top": 2,
    "batch_sizes": "16,32,64,128",
    "race_seconds": 1.0,
}


OUTPUTS = (
    "recommendation.json", "trials.csv", "report.md", "report.html", "train.py", "launch.sh",
    "exports/hf_training_args.json", "exports/lightning_trainer.py",
    "exports/accelerate_config.yaml",
)  # fmt: skip


def _cli_tune(out, *flags: str) -> subprocess.CompletedProcess[str]:
    """`advisor tune` on the tiny workload with the fast settings of these tests."""
    fast = ("--trial-seconds", "0.3", "--warmup-steps", "2", "--confirm-top", "2")
    fast += ("--max-world-size", "1", "--race-seconds", "1")
    return advisor_here("tune", f"{TINY}:factory", "--out", str(out), *fast, *flags)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> TuneResult:
    out = tmp_path_factory.mktemp("tune")
    return advisor.tune(f"{TINY}:factory", trials=4, out=out, **SETTINGS)


def test_python_api_returns_a_feasible_recommendation_not_slower_than_baseline(first_run):
    rec = first_run.recommendation
    assert isinstance(first_run, TuneResult)
    assert rec.config.batch_size in (16, 32, 64, 128)
    assert rec.baseline_config.batch_size == 32 and rec.baseline_config.amp == "off"
    unconfirmed = rec.confirmation is not None and not rec.confirmation.confirmed
    if unconfirmed:  # a loaded machine: never more than the re-runs' lowest round
        assert rec.confirmation is not None and rec.speedup == min(rec.confirmation.ratios)
    elif rec.config.global_batch_size == rec.baseline_config.global_batch_size:
        assert rec.speedup >= 1.0  # by re-measured samples/s: the baseline is always a finalist
    else:  # a race chose it by time to the user's loss, whatever its samples/s
        assert rec.time_to_loss_speedup is not None and rec.time_to_loss_speedup > 1.0
    assert len(rec.confirm_runs) >= 2 and all(run > 0 for run in rec.confirm_runs)
    reruns = [c for c in first_run.confirmations if c.result.config == rec.config]
    assert tuple(c.result.samples_per_s for c in reruns) == rec.confirm_runs  # re-runs only
    assert {knob.name for knob in rec.fixed_knobs} >= {"pin_memory", "cudnn_benchmark"}
    assert all(c.eligible for c in first_run.confirmations if c.result.config == rec.config)


def test_the_baseline_is_the_first_trial_and_every_trial_is_stored(first_run):
    trials = first_run.trials
    assert trials[0].role == "baseline" and trials[0].number == 0
    measured = [t for t in trials if t.role != "duplicate"]
    assert len({t.result.config for t in measured}) == len(measured)
    # as --trials counts: siblings derived from one trial's timed parts count as one
    ran = [t for t in measured if t.derived_from is None]
    assert len(ran) + len({t.derived_from for t in measured if t.derived_from is not None}) == 4
    # Every trial that ran started (one derived from another's timed parts ran nothing).
    ran = [t for t in trials if t.result.feasible and t.derived_from is None]
    assert ran and all(t.result.startup_s > 0 for t in ran)
    assert all(t.result.startup_s is None for t in trials if t.derived_from is not None)


def test_outputs_are_written(first_run):
    out = first_run.out_dir
    for name in (*OUTPUTS, "study.db"):
        assert (out / name).is_file(), name
    assert (out / "logs" / "trial-0.log").is_file()
    rec = Recommendation.model_validate_json((out / "recommendation.json").read_text())
    assert rec == first_run.recommendation and rec.schema_version == 4
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert len(rows) == len(first_run.trials) + len(first_run.confirmations)
    report = (out / "report.md").read_text()
    assert f"{rec.speedup:.2f}x your baseline" in report
    assert "no CUDA device: pinned memory only speeds host-to-GPU copies" in report
    for trial in first_run.trials:
        assert f"| {trial.number} | {trial.role} | {trial.result.config.label()} |" in report
    assert "## What each knob did" in report
    efficiency = rec.efficiency  # the tiny model's counted FLOPs at the re-measured rate
    assert efficiency.achieved_flops == pytest.approx(704 * rec.samples_per_s)
    peak = f"{efficiency.fraction_of_peak * 100:.1f} % of the {efficiency.dtype} matmul peak"
    assert peak in report  # bf16 where the recommendation uses it
    assert rec.bottleneck is not None
    assert bottleneck_text(rec.bottleneck, rec.knob_effects) in report
    assert set(rec.bottleneck.trials) <= {t.number for t in first_run.trials}
    for effect in rec.knob_effects:  # every effect cites stored trials
        assert all({a, b} <= {t.number for t in first_run.trials} for a, b in effect.pairs)


def test_generated_script_runs_as_is(first_run):
    completed = subprocess.run(
        [
            sys.executable,
            str(first_run.out_dir / "train.py"),
            "--max-steps",
            "3",
            "--checkpoint",
            str(first_run.out_dir / "ckpt.pt"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "done: 3 steps" in completed.stdout and "step 3: held-out loss" in completed.stdout
    assert (first_run.out_dir / "ckpt.pt").is_file()
    metrics = (first_run.out_dir / "metrics.csv").read_text().splitlines()
    assert metrics[0] == "step,samples,train_loss,held_out_loss,lr,samples_per_s"
    assert metrics[-1].startswith("3,")


def test_rerun_resumes_without_repeating_finished_trials(first_run):
    out = first_run.out_dir
    before = {t.number: t.result for t in first_run.trials if t.role != "duplicate"}
    resumed_at = time.time()
    completed = _cli_tune(out, "--trials", "6", "--batch-sizes", "16,32,64,128", "--json")
    assert completed.returncode == 0, completed.stderr
    Recommendation.model_validate_json(completed.stdout)  # --json: only the result on stdout
    assert "Warning" not in completed.stderr  # e.g. Optuna's ExperimentalWarning
    study = optuna.load_study(study_name="tiny-factory", storage=f"sqlite:///{out / 'study.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    measured = [t for t in done if t.user_attrs["role"] != "duplicate"]
    assert trials_counted([t.user_attrs for t in measured]) == 6
    assert len({tuple(sorted(t.params.items())) for t in measured}) == len(measured)
    rewritten = [p for p in (out / "logs").glob("trial-*.log") if p.stat().st_mtime >= resumed_at]
    new = [t for t in measured if t.number not in before and "derived_from" not in t.user_attrs]
    assert {p.name for p in rewritten} == {f"trial-{t.number}.log" for t in new}  # only they ran


def test_resuming_with_other_settings_is_refused(first_run):
    completed = _cli_tune(first_run.out_dir, "--trials", "6", "--batch-sizes", "16,32")
    assert completed.returncode == 2
    assert "was measured under other settings (domains differ)" in completed.stderr
    assert "Traceback" not in completed.stderr


def _count(out, query: str) -> int:
    """Read straight from the SQLite file: loading the study through Optuna takes seconds on a
    busy machine, and a tune can finish its search before the test sees two trials."""
    path = Path(out) / "study.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as connection:
        try:
            (count,) = connection.execute(query).fetchone()
        except sqlite3.OperationalError:  # no tables yet
            return 0
    return int(count)


def _completed_trials(out) -> int:
    return _count(out, "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'")


def _claimed_running_trials(out) -> int:
    """RUNNING trials their worker has claimed (`claim`): one killed in the milliseconds between
    asking for a trial and claiming it is failed by the next tune only after `STALE_AFTER_S`."""
    return _count(
        out,
        "SELECT COUNT(*) FROM trials JOIN trial_user_attributes USING (trial_id) "
        "WHERE state = 'RUNNING' AND key = 'advisor_process'",
    )


def test_ctrl_c_keeps_finished_trials_and_the_same_command_resumes(tmp_path):
    import signal

    import psutil

    command = [sys.executable, "-m", "advisor", "tune", f"{TINY}:factory", "--trials", "5"]
    command += ["--out", str(tmp_path), *FAST_TUNE]
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (_completed_trials(tmp_path) >= 2 and _claimed_running_trials(tmp_path)):
        assert process.poll() is None, "the tune ended before the test saw a third trial run"
        assert time.monotonic() < deadline, "no third trial started"
        time.sleep(0.05)
    children = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "run the same command to resume" in stderr
    assert "Traceback" not in stderr
    kept = _completed_trials(tmp_path)
    assert kept >= 2

    def alive() -> list[psutil.Process]:
        return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]

    gone_by = time.monotonic() + 10  # the trial launcher exits once it reads the end of input
    while alive() and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not alive()
    _check_provisional_reports(tmp_path, stderr)
    resumed = advisor_here(*command[3:])  # the same command, resumed in this process
    assert resumed.returncode == 0, resumed.stderr
    final = Recommendation.model_validate_json((tmp_path / "recommendation.json").read_text())
    assert not final.provisional and final.confirm_runs
    assert "Provisional" not in (tmp_path / "report.md").read_text()
    study = optuna.load_study(study_name="tiny-factory", storage=f"sqlite:///{tmp_path}/study.db")
    measured = [
        t
        for t in study.trials
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["role"] != "duplicate"
    ]
    assert trials_counted([t.user_attrs for t in measured]) == 5


def _check_provisional_reports(out, stderr: str) -> None:
    """An interrupted tune's reports: the best search window so far, marked provisional, no
    training script; `advisor report` renders the same from the study."""
    assert f"provisional reports of the trials so far (not re-measured): {out}/report.md" in stderr
    assert not (out / "train.py").exists()
    stored = advisor.load_result(out)
    rec = stored.recommendation
    search = [t for t in stored.trials if t.role in ("baseline", "search") and t.eligible]
    assert rec.provisional and not rec.confirm_runs and not stored.confirmations
    assert rec.samples_per_s == max(t.result.samples_per_s for t in search)
    baseline = next(t for t in search if t.role == "baseline")
    assert rec.speedup == pytest.approx(rec.samples_per_s / baseline.result.samples_per_s)
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert "Provisional: this tune was interrupted." in text
        assert f"{rec.samples_per_s:,.0f}" in text
        assert "Re-runs of the finalists" not in text and "train.py" not in text
    (out / "report.md").unlink()
    rendered = advisor_here("report", str(out))
    assert rendered.returncode == 0, rendered.stderr
    assert "the tune did not finish: these reports are provisional" in rendered.stdout
    assert "Provisional: this tune was interrupted." in (out / "report.md").read_text()
    assert not (out / "train.py").exists()
    assert not (out / "exports").exists()
    for command in (("codegen", str(out / "recommendation.json")), ("export", str(out))):
        refused = advisor_here(*command)
        assert refused.returncode == 2 and "recommendation.json is provisional" in refused.stderr


def test_a_killed_parent_leaves_no_trial_running_after_resume(tmp_path):
    import signal

    flags = ("--trials", "3", *FAST_TUNE)
    command = [sys.executable, "-m", "advisor", "tune", f"{TINY}:factory", "--out", str(tmp_path)]
    process = subprocess.Popen([*command, *flags], cwd=ROOT, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (_completed_trials(tmp_path) >= 1 and _claimed_running_trials(tmp_path)):
        assert process.poll() is None, "the tune ended before the test saw a second trial run"
        assert time.monotonic() < deadline, "no second trial started"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # while the second trial runs
    process.wait()  # its trial's process is gone: the resumed tune sees it at once
    resumed = advisor_here(*command[3:], *flags)  # the same command, resumed in this process
    assert resumed.returncode == 0, resumed.stderr
    study = optuna.load_study(study_name="tiny-factory", storage=f"sqlite:///{tmp_path}/study.db")
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.RUNNING not in states
    assert optuna.trial.TrialState.FAIL in states  # the trial the killed parent was running
    assert _completed_trials(tmp_path) >= 3


def test_report_re_renders_every_output_from_the_study_alone(first_run, tmp_path):
    out = first_run.out_dir
    names = OUTPUTS
    originals = {name: (out / name).read_text() for name in names}
    for name in names:
        (out / name).unlink()
    completed = advisor_here("report", str(out))
    assert completed.returncode == 0, completed.stderr
    for name in names:
        assert (out / name).read_text() == originals[name], name
    as_json = advisor_here("report", "--storage", f"sqlite:///{out}/study.db", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    stored = Recommendation.model_validate_json(originals["recommendation.json"])
    assert TuneResult.model_validate_json(as_json.stdout).recommendation == stored


def test_each_command_is_a_python_function_too(first_run, tmp_path):
    out = first_run.out_dir
    stored = Recommendation.model_validate_json((out / "recommendation.json").read_text())
    assert advisor.load_result(out).recommendation == stored  # a later test may have resumed it
    html = (out / "report.html").read_text()
    (out / "report.html").unlink()
    assert advisor.write_reports(out, fmt="html").out_dir == out
    assert (out / "report.html").read_text() == html
    script = tmp_path / "new folder" / "script.py"  # made as it is needed
    written = advisor.write_script(out / "recommendation.json", script)
    assert written == [script, script.parent / "launch.sh"]
    compile(written[0].read_text(), str(written[0]), "exec")
    assert written[1].stat().st_mode & 0o100  # executable
    assert advisor.export(out, to="hf") == [out / "exports" / "hf_training_args.json"]
    with pytest.raises(advisor.BadInputError, match="cannot export to 'tf': choose all, hf"):
        advisor.export(out, to="tf")  # type: ignore[arg-type]
    with pytest.raises(advisor.BadInputError, match=r"missing\.json does not exist"):
        advisor.write_script(tmp_path / "missing.json")


def test_report_of_an_unfinished_or_missing_study_says_what_to_do(tmp_path):
    missing = advisor_here("report", str(tmp_path))
    assert missing.returncode == 2
    assert (
        f"{tmp_path}/study.db does not exist: pass the folder advisor tune wrote" in missing.stderr
    )
    optuna.create_study(study_name="half", storage=f"sqlite:///{tmp_path}/study.db")
    unfinished = advisor_here("report", str(tmp_path))
    assert unfinished.returncode == 2
    assert (
        "study 'half' was not written by this advisor version (0 trials stored, no settings)"
        in (unfinished.stderr)
    )
    assert "Traceback" not in unfinished.stderr


def test_html_report_is_self_contained_and_every_headline_figure_is_stored(first_run):
    out = first_run.out_dir
    html = (out / "report.html").read_text()
    stored = advisor.load_result(out)  # what the files came from
    rec = stored.recommendation
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert html.count("<svg") >= 3  # history, batch x AMP, memory (+ importance with enough trials)
    assert f"{rec.speedup:.2f}x" in html and f"{rec.samples_per_s:,.0f} samples/s" in html
    reruns = [
        c.result.samples_per_s for c in stored.confirmations if c.number == rec.chosen_from_trial
    ]
    assert rec.samples_per_s == statistics.median(reruns)
    assert rec.chosen_from_trial in {t.number for t in stored.trials}
    for trial in stored.trials:
        assert f"<td>{trial.result.config.label()}</td>" in html
    assert "advisor report " in html and "advisor tune tests/workloads/tiny.py:factory" in html


@needs_chromium
def test_html_report_renders_offline_in_a_browser_with_its_plots(first_run, tmp_path):
    from matplotlib.image import imread

    png = tmp_path / "report.png"
    screenshot(first_run.out_dir / "report.html", png)
    pixels = imread(png)[..., :3]
    inked_rows = (pixels < 0.85).any(axis=2).any(axis=1)
    assert inked_rows.mean() > 0.15  # a page of content, not a blank or an error page
    # Matplotlib's first colour (#1f77b4): the plots' markers and lines were drawn.
    plot_blue = (abs(pixels - (0x1F / 255, 0x77 / 255, 0xB4 / 255)) < 0.08).all(axis=2)
    assert plot_blue.sum() > 500
    dom = rendered_dom(first_run.out_dir / "report.html", tmp_path / "profile")
    assert dom.count("<svg") >= 3 and "Why it won" in dom and "Trials" in dom


def test_html_report_escapes_user_strings(first_run):
    hostile = '<script>alert("x")</script>'
    rec = first_run.recommendation.model_copy(update={"spec": hostile, "study_name": hostile})
    html = render_html(first_run.model_copy(update={"recommendation": rec}))
    assert hostile not in html and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


def test_a_one_trial_study_reports_the_baseline_without_claims_it_cannot_back(tmp_path):
    result = advisor.tune(f"{TINY}:factory", trials=1, out=tmp_path, **SETTINGS)
    rec = result.recommendation
    assert [t.role for t in result.trials] == ["baseline"]
    assert rec.config == rec.baseline_config and rec.speedup == pytest.approx(1.0)
    assert rec.knob_effects == ()
    report = (tmp_path / "report.md").read_text()
    assert "**Your configuration was the fastest one measured**" in report
    assert "No two usable trials differed in one knob alone" in report
    html = (tmp_path / "report.html").read_text()
    assert html.count("<svg") == 4  # the race (yours alone); too few trials for importance
    assert "Parameter importance" not in html


def test_a_race_from_the_same_weights_decides_and_the_reports_show_it(first_run):
    rec = first_run.recommendation
    race = rec.race
    assert rec.objective == "time-to-loss" and race is not None
    assert (race.went_on_from or race.seconds) == 1.0  # 3 s if it kept your batch and went on
    baseline = race.racers[0]
    assert baseline.role == "baseline" and baseline.config == rec.baseline_config
    # Later replicates race what can still decide: where another configuration at your batch
    # computes other steps, it takes more than one; where only another global batch could win,
    # one replicate may settle that none can (`may_win_later`), but one never changes your batch.
    first = [r for r in race.racers if r.replicate == 0]
    own = [r for r in first if r.role == "your batch" and not r.steps_of_baseline]
    went_on_kept = race.went_on_from and not rec.global_batch_changed
    assert race.replicates >= 2 or not own or went_on_kept, race.verdict
    assert race.replicates >= 2 or not rec.global_batch_changed, race.verdict
    for replicate in range(race.replicates):  # the same initial weights within a replicate
        curves = [r.curve for r in race.racers if r.curve and r.replicate == replicate]
        assert len({c.points[0].loss for c in curves}) == 1
    starts = {r.curve.points[0].loss for r in race.racers if r.curve and r.role == "baseline"}
    assert len(starts) == race.replicates  # and other weights in each
    winner = race.racers[race.winner]
    assert (winner.config, winner.lr) == (rec.config, rec.lr)
    claim = rec.time_to_loss
    if rec.global_batch_changed:  # won by the margin at the low end of its interval
        later = race.replicates - 1 if race.replicates > 2 else race.replicates  # after the first
        assert claim is not None and claim.low >= 1.05 and claim.replicates == later
        assert claim.low <= claim.speedup <= claim.high
    assert rec.noise_scale is not None and rec.noise_scale.big_batch == 8 * 32
    # An earlier test resumed this study with more trials: the files hold that tune's race.
    stored = Recommendation.model_validate_json(
        (first_run.out_dir / "recommendation.json").read_text()
    )
    report = (first_run.out_dir / "report.md").read_text()
    assert "## Time to your loss" in report and race_verdict(stored.race) in report
    assert "| racer | role | global batch | lr |" in report
    html = (first_run.out_dir / "report.html").read_text()
    assert "Loss against training time" in html and "<svg" in html
    study = optuna.load_study(
        study_name="tiny-factory", storage=f"sqlite:///{first_run.out_dir}/study.db"
    )
    assert len(study.user_attrs["advisor_racers"]) >= len(race.racers)


def _strict_json(text: str):  # NaN or Infinity is not JSON: a browser's JSON.parse rejects it
    def refuse(constant: str):
        raise ValueError(f"{constant} in the dashboard's JSON")

    return json.loads(text, parse_constant=refuse)


def _get(url: str, until: float):
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return _strict_json(response.read().decode())
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > until:
                raise
            time.sleep(0.2)


def test_the_optuna_dashboard_serves_the_study_with_each_trials_figures(first_run):
    pytest.importorskip("optuna_dashboard")
    port = free_port()
    storage = f"sqlite:///{first_run.out_dir / 'study.db'}"
    server = subprocess.Popen(
        [sys.executable, "-m", "optuna_dashboard._cli", storage, "--port", str(port), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}/api/studies"
        studies = _get(base, until=time.monotonic() + 60)["study_summaries"]
        assert [s["study_name"] for s in studies] == [first_run.settings.resolved_study_name]
        detail = _get(f"{base}/{studies[0]['study_id']}?after=0", until=time.monotonic() + 30)
    finally:
        server.terminate()
        server.wait(timeout=10)
    study = optuna.load_study(study_name=None, storage=storage)
    assert len(detail["trials"]) == len(study.trials)
    for shown, stored in zip(detail["trials"], study.trials, strict=True):
        attrs = {attr["key"]: attr["value"] for attr in shown["user_attrs"]}
        if "result" not in stored.user_attrs:
            continue  # a proposal pruned before it ran: its reason only
        assert attrs["role"] == stored.user_attrs["role"]
        assert attrs["config"] == stored.user_attrs["config"]
        assert attrs["status"] == stored.user_attrs["status"]
        if "samples_per_s" in stored.user_attrs:
            assert float(attrs["samples_per_s"]) == stored.user_attrs["samples_per_s"]
