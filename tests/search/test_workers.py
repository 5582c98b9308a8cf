"""Several `advisor tune` workers on one study, over each kind of storage; stale trials of dead
workers; refusal to mix machines."""

import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy.exc import ProgrammingError

from advisor.api import validate
from advisor.errors import SettingsError, StorageError
from advisor.knobs import TrialConfig
from advisor.progress import NullProgress
from advisor.search import storage
from advisor.search.context import SearchContext
from advisor.search.records import StudyKey, TrialKey, claim, fail_abandoned
from advisor.search.space import build_space
from advisor.search.storage import load_study, open_study, optimize_one
from advisor.search.study import bind_study, make_sampler, run_search
from advisor.settings import TuneSettings
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import CPU_PROFILE, ROOT, TINY, advisor_here, trials_counted
from tests.postgres import PASSWORD, postgres_url  # noqa: F401 (a fixture)
from tests.scripted_runner import ScriptedRunner, scripted_context

FAST = ("--trial-seconds", "0.3", "--warmup-steps", "2", "--confirm-top", "1")
FAST += ("--objective", "throughput", "--confirm-max-repeats", "2")


def _arguments(name: str, storage: str, out, trials: int) -> list[str]:
    command = ["tune", f"{TINY}:factory", "--trials", str(trials), "--worker", name]
    command += ["--storage", storage, "--study-name", "shared", "--out", str(out)]
    return [*command, "--max-world-size", "1", *FAST]


def _worker(name: str, storage: str, out, trials: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "advisor", *_arguments(name, storage, out, trials)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _run_two_workers(storage: str, tmp_path) -> optuna.Study:
    """Worker a in a process of its own, worker b in this one meanwhile (its own interpreter
    and trial launcher would cost 3.7 s of CPU and measure nothing more)."""
    a = _worker("a", storage, tmp_path / "a", 3)
    b = advisor_here(*_arguments("b", storage, tmp_path / "b", 3))
    stdout, stderr = a.communicate(timeout=600)
    for completed in (subprocess.CompletedProcess(a.args, a.returncode, stdout, stderr), b):
        assert completed.returncode == 0, completed.stderr
        assert PASSWORD not in completed.stdout + completed.stderr
    return load_study(storage, "shared")


def _check_sum(study: optuna.Study) -> None:
    measured = [
        t
        for t in study.get_trials(states=(TrialState.COMPLETE,))
        if t.user_attrs["role"] != "duplicate"
    ]
    by_worker = {name: [t for t in measured if t.user_attrs["worker"] == name] for name in "ab"}
    # As --trials counts: each trial that ran, and the siblings one derived from its timed parts
    # (on a busy machine, accumulation 8 may not fit these 0.3-s windows) together as one more.
    counted = {name: trials_counted([t.user_attrs for t in ts]) for name, ts in by_worker.items()}
    assert counted == {"a": 3, "b": 3}  # 3 + 3: the sum requested
    ran = [t for t in measured if t.user_attrs.get("derived_from") is None]
    assert len({tuple(sorted(t.params.items())) for t in ran}) == len(ran)  # none ran twice
    # A sibling derived from a trial's parts (free) is added unless another worker measures
    # it: re-read right before the write, only a start within those milliseconds slips by.
    assert len({tuple(sorted(t.params.items())) for t in measured}) >= len(measured) - 1
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_two_workers_on_one_file_storage_measure_the_sum_of_their_trials(kind, tmp_path):
    storage = f"{kind}:///{tmp_path}/study.{'db' if kind == 'sqlite' else 'log'}"
    _check_sum(_run_two_workers(storage, tmp_path))


@pytest.mark.slow
def test_two_workers_on_postgresql_and_the_password_stays_out_of_everything(
    postgres_url,  # noqa: F811
    tmp_path,
):
    study = _run_two_workers(postgres_url, tmp_path)
    _check_sum(study)
    for name in "ab":
        for path in (tmp_path / name).rglob("*"):
            if path.is_file() and path.suffix in (".json", ".md", ".html", ".csv", ".py", ".sh"):
                assert PASSWORD not in path.read_text(), path
        assert "postgres:***@127.0.0.1" in (tmp_path / name / "report.md").read_text()


def test_a_dead_workers_running_trial_is_failed_when_a_journal_study_is_resumed(tmp_path):
    url = f"journal:///{tmp_path}/study.log"
    study = open_study(url, "s", optuna.samplers.RandomSampler())
    code = "import os; print(os.getpid())"
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    stale = study.ask()
    stale.set_user_attr(TrialKey.PROCESS, f"{socket.gethostname()}:{dead.stdout.strip()}:0")
    alive = study.ask()
    claim(alive)  # this process: alive
    reopened = open_study(url, "s", optuna.samplers.RandomSampler())
    fail_abandoned(reopened)  # as advisor tune does right after opening
    states = {t.number: t.state for t in reopened.get_trials()}
    assert states == {stale.number: TrialState.FAIL, alive.number: TrialState.RUNNING}


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask() stands for a worker here
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_worker_killed_before_it_claimed_its_trial_leaves_no_running_trial(kind, tmp_path):
    # Killed between asking for a trial and claiming it: no owner, and no heartbeat either.
    url = f"{kind}:///{tmp_path}/study.{'db' if kind == 'sqlite' else 'log'}"
    open_study(url, "s", optuna.samplers.RandomSampler())
    code = (
        "import os, signal, optuna; from advisor.search.storage import open_study; "
        f"open_study({url!r}, 's', optuna.samplers.RandomSampler()).ask(); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    killed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    time.sleep(1.5)
    reopened = open_study(url, "s", optuna.samplers.RandomSampler())
    asking = reopened.ask()  # a live worker that has not claimed its trial yet
    fail_abandoned(reopened, unclaimed_after_s=1)
    states = [t.state for t in reopened.get_trials()]
    assert states == [TrialState.FAIL, TrialState.RUNNING] and asking.number == 1


def test_a_study_recorded_before_a_knob_existed_resumes_while_it_stays_at_its_default(tmp_path):
    settings = TuneSettings(spec=f"{TINY}:factory")
    task = validate(settings.spec).task
    study = optuna.create_study(direction="maximize")
    bind_study(study, _context(settings, CPU_PROFILE, task, tmp_path))
    terms = study.user_attrs[StudyKey.TERMS]
    del terms["fixed"]["cudnn_deterministic"]  # as an advisor without that knob recorded them
    study.set_user_attr(StudyKey.TERMS, terms)
    bind_study(study, _context(settings, CPU_PROFILE, task, tmp_path))  # resumes
    del terms["fixed"]["optimizer_impl"]
    study.set_user_attr(StudyKey.TERMS, terms)
    searched = settings.model_copy(update={"knobs": ("classic", "optimizer")})
    with pytest.raises(SettingsError, match="domains differ"):  # now it is searched
        bind_study(study, _context(searched, CPU_PROFILE, task, tmp_path))


def test_a_worker_on_other_hardware_is_refused(tmp_path):
    settings = TuneSettings(spec=f"{TINY}:factory")
    task = validate(settings.spec).task
    study = optuna.create_study(direction="maximize")
    bind_study(study, _context(settings, CPU_PROFILE, task, tmp_path))
    bigger = CPU_PROFILE.model_copy(update={"cores": 64, "cpu_model": "Other CPU"})
    with pytest.raises(SettingsError, match="was measured on other hardware") as refused:
        bind_study(study, _context(settings, bigger, task, tmp_path))
    assert "(test CPU, 2 cores, 24 GiB, torch 2.13.0+cpu; this worker: Other CPU, 64 cores" in (
        str(refused.value)
    )
    assert "not comparable" in str(refused.value)
    # The allocator changes the speed, and on CPU the peaks: a study is not resumed under another.
    mimalloc = CPU_PROFILE.model_copy(update={"allocator": "mimalloc"})
    with pytest.raises(SettingsError, match="measured on other hardware") as refused:
        bind_study(study, _context(settings, mimalloc, task, tmp_path))
    assert "this worker: test CPU, 2 cores, 24 GiB, torch 2.13.0+cpu, mimalloc malloc)" in (
        str(refused.value)
    )


def _context(settings, hardware, task, logs) -> SearchContext:
    space = build_space(settings, hardware, task)
    launch = TrialLaunch(
        spec=settings.spec, cwd=ROOT, warmup_steps=1, trial_seconds=0.2, timeout_s=60
    )
    return SearchContext(settings, space, hardware, ProcessRunner(launch), logs, NullProgress())


def test_a_wrong_password_is_one_masked_line(postgres_url, tmp_path):  # noqa: F811
    wrong = postgres_url.replace(PASSWORD, "wrong-pw-123")
    completed = advisor_here(
        "tune", f"{TINY}:factory", "--storage", wrong, "--out", str(tmp_path), *FAST
    )
    assert completed.returncode == 2
    assert "wrong-pw-123" not in completed.stdout + completed.stderr
    [line] = [text for text in completed.stderr.splitlines() if text.startswith("error:")]
    assert "cannot open storage postgresql+psycopg2://postgres:***@127.0.0.1" in line
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    ("message", "opens"),
    [('relation "studies" already exists', True), ('syntax error at or near "SELEC"', False)],
)
def test_a_schema_another_worker_is_creating_is_waited_for(tmp_path, monkeypatch, message, opens):
    """Two workers creating Optuna's tables at once on PostgreSQL: one is told that a table
    'already exists' (seen in CI). It retries; any other database error is reported."""
    real = storage.make_storage
    calls = []

    def racing(url):
        calls.append(url)
        if len(calls) == 1:
            raise ProgrammingError("CREATE TABLE studies", {}, Exception(message))
        return real(url)

    monkeypatch.setattr(storage, "make_storage", racing)
    url = f"sqlite:///{tmp_path}/study.db"
    if opens:
        assert open_study(url, "s", optuna.samplers.RandomSampler()).study_name == "s"
        assert len(calls) == 2
    else:
        with pytest.raises(StorageError, match="SELEC"):
            open_study(url, "s", optuna.samplers.RandomSampler())
        assert len(calls) == 1


ASK_UNTIL_NEW = """
import sys, time, warnings, optuna
from advisor.search.storage import make_storage
warnings.simplefilter("ignore")  # "heartbeat is supposed to be used with optimize": ask() is enough
study = optuna.load_study(study_name="s", storage=make_storage(sys.argv[1]))
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # every worker starts at once
while (trial := study.ask()).number < int(sys.argv[3]):
    print(trial.number)
"""


def test_workers_on_sqlite_never_take_the_same_enqueued_trial(tmp_path):
    """SQLite ignores the SELECT ... FOR UPDATE Optuna relies on to pop an enqueued trial once:
    two workers measured the same trial and the second could not tell it (seen in CI; Optuna
    issue 4621). Three workers ask at once for 40 enqueued trials; each goes to one of them."""
    url, enqueued = f"sqlite:///{tmp_path}/study.db", 40
    study = optuna.create_study(study_name="s", storage=storage.make_storage(url))
    for x in range(enqueued):
        study.enqueue_trial({"x": x})
    start = str(time.time() + 2)
    command = [sys.executable, "-c", ASK_UNTIL_NEW, url, start, str(enqueued)]
    workers = [
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    taken = [int(n) for worker in workers for n in worker.communicate(timeout=120)[0].split()]
    assert all(worker.returncode == 0 for worker in workers)
    assert sorted(taken) == list(range(enqueued))


def _hold(path, begin: str) -> sqlite3.Connection:
    """Another program's connection to the study file, inside an open transaction."""
    connection = sqlite3.connect(path, timeout=1, isolation_level=None)
    connection.execute(begin)
    connection.execute("SELECT COUNT(*) FROM trials").fetchone()
    return connection


def test_a_reader_that_keeps_the_study_open_does_not_stop_the_search(tmp_path, monkeypatch):
    """optuna-dashboard or the sqlite3 shell holding a read transaction: in SQLite's default
    journal every commit waits for it and fails after the busy timeout (seen in CI, as a
    traceback); with the write-ahead log the search goes on."""
    monkeypatch.setattr(storage, "SQLITE_BUSY_TIMEOUT_S", 0.5)
    url = f"sqlite:///{tmp_path}/study.db"
    study = open_study(url, "s", optuna.samplers.RandomSampler())
    reader = _hold(tmp_path / "study.db", "BEGIN")
    try:
        for _ in range(3):
            optimize_one(study, lambda trial: trial.suggest_float("x", 0, 1), url)
    finally:
        reader.close()
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 3


def test_a_storage_that_stays_locked_ends_the_search_with_one_line_and_keeps_trials(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(storage, "SQLITE_BUSY_TIMEOUT_S", 0.5)
    url = f"sqlite:///{tmp_path}/study.db"
    study = open_study(url, "s", optuna.samplers.RandomSampler())
    optimize_one(study, lambda trial: trial.suggest_float("x", 0, 1), url)
    writer = None

    def objective(trial: optuna.Trial) -> float:
        nonlocal writer
        writer = _hold(tmp_path / "study.db", "BEGIN IMMEDIATE")  # another writer, stuck
        return 1.0

    try:
        with pytest.raises(StorageError) as failed:
            optimize_one(study, objective, url)
        running = study.get_trials(states=(TrialState.RUNNING,))[0]
        storage.make_storage(url).record_heartbeat(running._trial_id)  # skipped, not raised
    finally:
        assert writer is not None
        writer.close()
    assert str(failed.value).startswith(f"cannot save a trial to {url} (database is locked);")
    assert "run the same command to resume" in str(failed.value)
    assert len(load_study(url, "s").get_trials(states=(TrialState.COMPLETE,))) == 1


def _slow_at_small_batches(config: TrialConfig) -> float:
    """Samples/s that grow steeply with the micro-batch: your batch 32 runs under a quarter of
    the best, and once two trials at it have, the value 32 is rejected."""
    return 1000.0 * config.batch_size * config.world_size


def test_two_workers_never_propose_a_rejected_move_twice(tmp_path):
    """The README's scale-out, in-process: two workers, one after the other, on one study with
    `--trials 10` each. At 2dcba6f the staged walk proposed one layout of a rejected batch size
    again and again: 200 pruned proposals of it in 3 s, until a cap stopped the worker."""
    storage = optuna.storages.InMemoryStorage()
    for name in ("w1", "w2"):
        settings = TuneSettings(spec=f"{TINY}:factory", trials=10, worker=name)
        runner = ScriptedRunner(rate=_slow_at_small_batches)
        context = scripted_context(settings, runner, tmp_path)
        study = optuna.create_study(
            storage=storage, study_name="shared", direction="maximize", load_if_exists=True,
            sampler=make_sampler(settings, context.space),
        )  # fmt: skip
        bind_study(study, context)
        run_search(study, context)
    pruned = study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
    proposed = [tuple(sorted(trial.params.items())) for trial in pruned]
    assert len(proposed) == len(set(proposed)), Counter(proposed).most_common(1)
    assert any("rejected" in trial.user_attrs[TrialKey.PRUNED_REASON] for trial in pruned) or (
        len(pruned) < 20
    )
    assert trials_counted([trial.user_attrs for trial in study.trials]) == 20
