"""The convergence race: races on scripted workloads where a big batch loses or wins, run
in-process by a `ScriptedRunner`; the decision rules on described racers; an interrupt keeps the
finished racers."""

import math
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from advisor.decide.decision import race_choice
from advisor.decide.race.plan import RacePlan, lr_rule
from advisor.decide.race.run import run_race
from advisor.decide.race.verdict import RACE_MARGIN, decide_race, time_to_loss
from advisor.decide.reruns import Selection
from advisor.knobs import TrialConfig
from advisor.noise_scale import predict_batches, race_finalists
from advisor.progress import Progress
from advisor.report.verdicts import race_verdict
from advisor.results import (
    BatchPrediction,
    LrPlan,
    NoiseScale,
    RaceCurve,
    RacePoint,
    Racer,
    TrialRecord,
    TrialResult,
)
from advisor.search.context import SearchContext
from advisor.search.records import read_racers
from advisor.settings import TuneSettings
from advisor.trial.orders import RaceOrder
from tests.scripted_runner import ScriptedRunner, scripted_context
from tests.search.interrupts import StopAfterFirstRacer

SMALL = TrialConfig(batch_size=8)
BIG = TrialConfig(batch_size=256)
RACE_S = 2.5


def _context(
    tmp_path: Path, runner: ScriptedRunner, progress: Progress | None = None
) -> SearchContext:
    settings = TuneSettings(
        spec="train.py:task", race_seconds=RACE_S, max_world_size=1, out=tmp_path
    )
    return scripted_context(settings, runner, tmp_path, progress=progress)


def _progress(config: TrialConfig, lr: LrPlan, samples: int, noise_scale: float) -> float:
    """What SGD has learnt after `samples`: each optimizer step is worth its learning rate (ramped
    up linearly over the warm-up) times B / (B + phi), so a step of a global batch B far above
    the noise scale phi is worth little more than one of phi samples."""
    batch = config.global_batch_size
    steps, warmup = samples / batch, lr.warmup_steps
    lr_steps = steps - warmup / 2 if steps >= warmup else steps**2 / (2 * warmup)
    return lr.scale * lr_steps * batch / (batch + noise_scale)


def big_batch_loses() -> ScriptedRunner:
    """Samples/s that do not grow with the batch, and exact labels (phi 8): per sample, batch 256
    learns at most half as much as batch 8, even at the linear rule's 8x lr."""

    def loss(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        return 0.3 + 2.0 * math.exp(-_progress(config, lr, samples, noise_scale=8.0) / 150.0)

    return ScriptedRunner(rate=lambda config: 2000.0, loss=loss)


def big_batch_wins() -> ScriptedRunner:
    """Steps that cost 20 ms whatever the batch, and noisy labels (phi 200): batch 256 takes as
    many steps as batch 8, each worth 15x one of batch 8's, and 8x that at the linear rule's lr."""

    def loss(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        return 0.3 + 2.0 * math.exp(-_progress(config, lr, samples, noise_scale=200.0) / 12.0)

    return ScriptedRunner(rate=lambda config: 50.0 * config.global_batch_size, loss=loss)


def _plans() -> list[RacePlan]:
    """Batch 8 (the user's), and 32x that with the user's SGD lr and with the linear rule."""
    rule = lr_rule("SGD", 8, 256)
    assert (rule.scale, rule.warmup_steps, rule.rule) == (8.0, 20, "linear")  # capped at 8
    return [
        RacePlan("baseline", 0, SMALL, LrPlan(), 1000.0),
        RacePlan("candidate", 1, BIG, LrPlan(), 1000.0),
        RacePlan("candidate", 1, BIG, rule, 1000.0),
    ]


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")


def _raced(runner: ScriptedRunner) -> list[tuple[TrialConfig, LrPlan]]:
    return [(o.config, o.lr) for o in runner.orders if isinstance(o, RaceOrder)]


def test_the_race_keeps_the_small_batch_where_a_big_one_loses(tmp_path):
    """Samples/s do not grow with the batch and the labels are exact (`big_batch_loses`): batch
    8 takes 32x the steps of batch 256 at the same samples/s, each worth half of one of batch
    256's, or a sixteenth at the linear rule's 8x lr."""
    runner = big_batch_loses()
    race = decide_race(run_race(_study(tmp_path), _context(tmp_path, runner), _plans()), RACE_S)
    assert race.loss_kind == "held-out"
    assert race.racers[race.winner].config == SMALL, race.verdict
    assert race.verdict.kind == "kept"
    assert "no other global batch" in race_verdict(race)
    # Past 85 % of the baseline's time to its loss a candidate can no longer win: it stops there.
    baseline = race.racers[0]
    assert baseline.curve.points[-1].seconds >= RACE_S  # the baseline sets the target: all of it
    horizon = (1 - RACE_MARGIN) * baseline.time_to_target_s
    for candidate in race.racers[1:]:
        assert candidate.time_to_target_s is None
        assert candidate.curve.points[-1].seconds <= horizon + 0.2 < RACE_S
    assert [o.seconds for o in runner.orders] == pytest.approx([RACE_S, horizon, horizon])


def test_the_race_picks_the_big_batch_and_its_lr_where_it_wins(tmp_path):
    """Each step costs the same whatever the batch and the labels are noisy (`big_batch_wins`):
    batch 256 takes as many steps, each far less noisy, and the linear rule's 8x lr pays off."""
    context = _context(tmp_path, big_batch_wins())
    race = decide_race(run_race(_study(tmp_path), context, _plans()), RACE_S)
    winner = race.racers[race.winner]
    assert winner.config == BIG and winner.lr.rule == "linear", race.verdict
    assert race.verdict.kind == "won"
    baseline = race.racers[0]
    assert winner.time_to_target_s < 0.85 * baseline.time_to_target_s


def test_an_interrupted_race_keeps_its_finished_racers_and_resumes_after_them(tmp_path):
    progress = StopAfterFirstRacer()
    with pytest.raises(KeyboardInterrupt):
        run_race(_study(tmp_path), _context(tmp_path, big_batch_wins(), progress), _plans())
    study = optuna.load_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")
    [kept] = read_racers(study)
    assert kept.config == SMALL and kept.curve is not None

    resumed = StopAfterFirstRacer()
    resumed.started.append("(already stopped once)")
    runner = big_batch_wins()
    racers = run_race(study, _context(tmp_path, runner, resumed), _plans())
    assert len(resumed.started) == 1 + 2  # only the two racers that had not finished
    assert _raced(runner) == [(p.config, p.lr) for p in _plans()[1:]]
    assert racers[0] == kept
    assert len(read_racers(study)) == 3


def test_a_loss_that_does_not_fall_decides_no_race_and_skips_the_other_racers(tmp_path):
    """At lr 0 the held-out loss stays where it started: time to it says nothing about a
    global batch, so only the baseline trains and the user's global batch is kept."""
    progress = StopAfterFirstRacer()
    progress.started.append("(never stop)")
    runner = ScriptedRunner(loss=lambda config, lr, samples: 2.30)  # lr 0: the weights stay
    racers = run_race(_study(tmp_path), _context(tmp_path, runner, progress), _plans())
    assert [r.role for r in racers] == ["baseline"] and len(progress.started) == 1 + 1
    assert _raced(runner) == [(SMALL, LrPlan())]
    assert not racers[0].curve.fell

    race = decide_race(racers, RACE_S)

    assert race.winner is None and race.target_loss is None
    assert race.verdict.kind == "no-fall"
    assert race_verdict(race).startswith("your loss did not fall beyond its noise")


def test_a_loss_that_rises_from_the_start_did_not_fall():
    """Overfitting from the first steps (e.g. labels it cannot learn): its lowest loss is its
    initial one, which every racer matches at once."""
    rising = [2.30, 2.32, 2.33, 2.36, 2.35, 2.41, 2.45, 2.52, 2.60, 2.67, 2.78]
    racers = [
        _racer("baseline", SMALL, rising),
        _racer("candidate", BIG, [2.30, 2.29, 2.31, 2.33, 2.34, 2.36, 2.40, 2.41, 2.45, 2.5, 2.6]),
    ]
    assert not racers[0].curve.fell

    race = decide_race(racers, 10)

    assert race.winner is None and race.target_loss is None
    assert "2.3 at the start, lowest 2.3, 2.78 after 10.0 s" in race_verdict(race)


def test_a_short_flat_curve_did_not_fall_though_one_evaluation_dipped():
    """Seven evaluations (steps of seconds): too few for the noise about the trend, but a dip
    of one evaluation within the others' wobble is not a fall, nor a racer's win."""
    flat = [2.302, 2.3015, 2.305, 2.31, 2.32, 2.33, 2.34]
    racers = [
        _racer("baseline", SMALL, flat),
        _racer("candidate", BIG, [2.302, 2.3012, 2.306, 2.31, 2.32, 2.33, 2.34]),
    ]
    assert racers[0].curve.noise == 0.0 and not racers[0].curve.fell
    assert decide_race(racers, 6).winner is None


def test_one_spike_does_not_hide_a_fall():
    falling = [1.0 - 0.39 * (1 - 0.86**i) for i in range(21)]
    falling[12] += 0.8  # one evaluation of a bad batch of held-out samples, say
    assert _racer("baseline", SMALL, falling).curve.fell


def test_a_loss_that_fell_then_rose_sets_its_lowest_as_the_target():
    """Overfitting after a fall (a small dataset): the race is timed to the lowest loss."""
    curve = _racer("baseline", SMALL, [0.64, 0.50, 0.52, 0.57, 0.61, 0.64, 0.70, 0.8]).curve
    assert curve.fell and curve.target_losses[0] == 0.50


def _racer(role: str, config: TrialConfig, losses: list[float], lr: LrPlan | None = None) -> Racer:
    lr = lr or LrPlan()
    points = tuple(
        RacePoint(seconds=float(i), samples=i * 8, steps=i, loss=loss)
        for i, loss in enumerate(losses)
    )
    result = TrialResult(
        config=config, status="ok", race=RaceCurve(loss_kind="held-out", lr=lr, points=points)
    )
    return Racer(role=role, config=config, lr=lr, race_seconds=len(losses) - 1, result=result)


def test_time_to_loss_interpolates_between_evaluations():
    curve = _racer("baseline", SMALL, [4.0, 2.0, 1.0]).curve
    assert time_to_loss(curve, 3.0) == pytest.approx(0.5)
    assert time_to_loss(curve, 1.0) == pytest.approx(2.0)
    assert time_to_loss(curve, 0.5) is None


def _plateau(reached_s: float, dips: dict[float, float]) -> list[float]:
    """A held-out loss that falls from 2.3164 to a plateau of 2.3025 by `reached_s`, then
    wiggles by +-0.0003 about it (evaluations every 0.5 s for 10 s), with `dips` below it."""
    wiggle = [0.0002, -0.0001, 0.0003, -0.0002, 0.0001, -0.0003, 0.0, 0.0002]
    losses = []
    for i in range(21):
        seconds = i * 0.5
        fall = max(0.0, 1 - seconds / reached_s)
        losses.append(2.3025 + 0.0139 * fall**2 + wiggle[i % len(wiggle)] * (fall == 0))
        losses[-1] = dips.get(seconds, losses[-1])
    return losses


def _half_seconds(role: str, config: TrialConfig, losses: list[float]) -> Racer:
    racer = _racer(role, config, losses)
    points = tuple(p.model_copy(update={"seconds": p.seconds / 2}) for p in racer.curve.points)
    result = racer.result.model_copy(
        update={"race": racer.curve.model_copy(update={"points": points})}
    )
    return racer.model_copy(update={"race_seconds": 10.0, "result": result})


def test_a_chance_dip_on_a_plateau_wins_no_race():
    # Both reach the plateau at 1.5 s; the baseline's lowest evaluation is a dip at 8.5 s, and
    # the candidate dips as low at 1.5 s: matching the lowest evaluation alone, it would have
    # won 5.7x sooner.
    racers = [
        _half_seconds("baseline", SMALL, _plateau(1.5, {8.5: 2.3020})),
        _half_seconds("candidate", BIG, _plateau(1.5, {1.5: 2.3019})),
    ]
    assert time_to_loss(racers[1].curve, 2.3020) == pytest.approx(1.5, abs=0.05)
    assert time_to_loss(racers[0].curve, 2.3020) == pytest.approx(8.5, abs=0.05)

    race = decide_race(racers, 10)

    noise = racers[0].curve.noise
    assert 0.0001 < noise < 0.0004  # the wiggle's spread
    assert race.target_loss == pytest.approx(2.3020 + 2 * noise)
    assert race.racers[race.winner].config == SMALL
    assert race.racers[1].time_to_target_s > 0.85 * race.racers[0].time_to_target_s


def test_a_racer_that_settles_below_the_band_wins_at_the_lowest_loss():
    """The baseline's evaluations are so noisy that the band above its lowest loss is reached by
    every racer within a second; the candidate then settles far below that lowest loss, so
    matching it was no chance dip, and the lowest loss decides."""
    wobble = [0.12, -0.1, 0.09, -0.12, 0.1, -0.08, 0.12, -0.11, 0.08, -0.1, 0.11]
    baseline = [1.0, 0.6] + [0.75 - 0.015 * i + wobble[i % 11] for i in range(1, 20)]
    candidate = [1.0, 0.62, 0.5, 0.4, 0.3, 0.2, 0.1] + [0.06 - 0.001 * i for i in range(14)]
    racers = [_racer("baseline", SMALL, baseline), _racer("candidate", BIG, candidate)]
    low, high = racers[0].curve.target_losses
    assert high - low > 0.2  # the band is most of the fall
    assert time_to_loss(racers[1].curve, high) > 0.9 * time_to_loss(racers[0].curve, high)

    race = decide_race(racers, 20)

    assert race.racers[race.winner].config == BIG, race.verdict
    assert race.target_loss == low
    assert race.racers[1].time_to_target_s == pytest.approx(3.3)
    # On a plateau both end at (chance dip aside), the band still decides: see the test above.


def test_a_win_that_holds_at_every_target_claims_the_smaller_speedup():
    # The baseline reaches its lowest loss, 1.0, at 10 s, then wobbles by 0.1 about 1.15; the
    # candidate falls three times as fast. Within the band above 1.0 it wins by more.
    wobble = [0.1, -0.08, 0.06, -0.1, 0.08, -0.06, 0.1, -0.09, 0.07, -0.05]
    baseline = [4 - 0.3 * i for i in range(11)] + [1.15 + w for w in wobble]
    candidate = [max(1.0, 4 - 0.9 * i) - 0.01 * i for i in range(21)]
    racers = [_racer("baseline", SMALL, baseline), _racer("candidate", BIG, candidate)]
    low, high = racers[0].curve.target_losses
    assert low == 1.0 and high > 1.1

    def speedup(target: float) -> float:
        return time_to_loss(racers[0].curve, target) / time_to_loss(racers[1].curve, target)

    assert speedup(high) > speedup(low) > 1 / (1 - RACE_MARGIN)

    race = decide_race(racers, 20)

    assert race.winner == 1 and race.target_loss == low
    assert race.racers[0].time_to_target_s == pytest.approx(10.0)


def test_a_falling_curve_keeps_its_targets_close():
    losses = [2.0 * 0.8**i + 0.1 for i in range(21)]  # still falling at the end, noiseless
    curve = _racer("baseline", SMALL, losses).curve
    assert max(curve.target_losses) - curve.best_loss < 0.01 * (losses[0] - losses[-1])


def test_a_curve_too_short_for_its_noise_has_its_lowest_loss_as_its_one_target():
    curve = _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0]).curve
    assert curve.noise == 0.0 and curve.target_losses == (1.0,)


def test_a_candidate_must_beat_the_best_at_your_batch_by_more_than_the_noise():
    faster = TrialConfig(batch_size=8, num_workers=1)
    racers = [
        _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0]),
        _racer("your batch", faster, [4, 2.5, 1.5, 1.0, 0.9, 0.8]),  # reaches 1.0 at 3 s
        _racer("candidate", BIG, [4, 2.6, 1.6, 1.0, 0.9, 0.8]),  # also 3 s: within the noise
    ]
    race = decide_race(racers, 5)
    assert race.target_loss == 1.0 and race.racers[race.winner].config == faster
    racers[2] = _racer("candidate", BIG, [4, 1.0, 0.5, 0.4, 0.3, 0.2])  # 1 s: 3x sooner
    assert decide_race(racers, 5).winner == 2


def test_each_candidate_ships_the_lr_that_ended_lower():
    rule = LrPlan(scale=2.0, rule="sqrt")
    racers = [
        _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0]),
        _racer("candidate", BIG, [4, 0.9, 0.8, 0.8, 0.8, 0.8]),  # sooner, but ends higher
        _racer("candidate", BIG, [4, 1.5, 1.0, 0.6, 0.4, 0.3], rule),
    ]
    race = decide_race(racers, 5)
    assert race.winner == 2 and race.racers[2].lr == rule


def test_a_faster_config_at_your_batch_that_learns_worse_gives_way_to_yours():
    """E.g. low precision that costs more in loss than it gains in speed."""
    racers = [
        _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0]),
        _racer("your batch", TrialConfig(batch_size=8, amp="bf16"), [4, 3.5, 3, 2.5, 2, 1.8]),
    ]
    race = decide_race(racers, 5)
    assert race.winner == 0


def test_a_change_of_precision_at_your_batch_must_earn_its_place_by_the_margin():
    """bf16 that wins by less than the margin, in the race and in samples/s, gives way to your
    precision; by the margin in either, it stands. A knob that keeps the precision needs no
    margin: it trains the same steps."""
    bf16 = TrialConfig(batch_size=8, amp="bf16")
    baseline = _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0]).model_copy(
        update={"samples_per_s": 100.0}
    )
    level = _racer("your batch", bf16, [4, 2.9, 1.9, 1.4, 1.1, 1.0, 0.9])  # 1.0 at 5 s

    def kept(faster: Racer, rate: float) -> TrialConfig:
        racers = [baseline, faster.model_copy(update={"samples_per_s": rate})]
        race = decide_race(racers, 5)
        return race.racers[race.winner].config

    assert kept(level, 110.0) == SMALL
    slow = decide_race([baseline, level.model_copy(update={"samples_per_s": 110.0})], 5)
    assert slow.verdict.precision_kept and "your precision is kept" in race_verdict(slow)
    assert kept(level, 120.0) == bf16  # 1.2x the samples/s
    sooner = _racer("your batch", bf16, [4, 2, 1.2, 1.0, 0.9, 0.8])  # 1.0 at 3 s
    assert kept(sooner, 103.0) == bf16
    workers = level.model_copy(update={"config": TrialConfig(batch_size=8, num_workers=1)})
    assert kept(workers, 103.0) == workers.config


def _record(number: int, batch: int, rate: float) -> TrialRecord:
    config = TrialConfig(batch_size=batch)
    result = TrialResult(config=config, status="ok", samples_per_s=rate)
    return TrialRecord(number=number, role="baseline" if batch == 8 else "search", result=result)


def test_the_noise_scale_chooses_which_batches_race():
    """phi = 100: batch 64 needs (100 + 64)/(100 + 8) = 1.5x the samples, so at 4x the samples/s
    it is predicted 2.6x sooner; batch 1024 at 5x the samples/s needs 10.3x the samples."""
    records = [_record(0, 8, 100.0), _record(1, 64, 400.0), _record(2, 1024, 500.0)]
    noise = NoiseScale(value=100.0, low=80.0, high=120.0, small_batch=8, big_batch=64, steps=50)
    predictions = predict_batches(noise, records, SMALL)
    by_batch = {p.global_batch: p for p in predictions}
    assert by_batch[64].predicted_speedup == pytest.approx(4 / (164 / 108))
    assert by_batch[1024].predicted_speedup == pytest.approx(5 / (1124 / 108))
    marked, finalists = race_finalists(predictions, noise, records, SMALL)
    assert [p.global_batch for p in marked if p.raced] == [64]
    assert [r.number for r in finalists] == [0, 1]


def test_when_no_batch_is_predicted_to_win_the_best_faster_one_races_anyway():
    """phi = 10 at batch 8: every larger batch is predicted slower to the loss, but phi grows
    as training goes on; the race measures the best-predicted batch with more samples/s."""
    records = [_record(0, 8, 100.0), _record(1, 64, 110.0), _record(2, 1024, 90.0)]
    noise = NoiseScale(value=10.0, low=8.0, high=12.0, small_batch=8, big_batch=64, steps=50)
    predictions = predict_batches(noise, records, SMALL)
    assert all(p.predicted_speedup < 1 for p in predictions if p.global_batch != 8)
    marked, finalists = race_finalists(predictions, noise, records, SMALL)
    assert [p.global_batch for p in marked if p.raced] == [64]  # 1024 has fewer samples/s
    assert [r.number for r in finalists] == [0, 1]


def test_without_a_noise_scale_the_fastest_batches_race():
    records = [_record(0, 8, 100.0), _record(1, 64, 400.0), _record(2, 1024, 500.0)]
    predictions = predict_batches(None, records, SMALL)
    marked, _ = race_finalists(predictions, None, records, SMALL)
    assert [p.global_batch for p in marked if p.raced] == [64, 1024]
    assert isinstance(marked[0], BatchPrediction)


def test_without_a_race_a_tie_at_your_batch_goes_as_the_re_runs_broke_it():
    """--race-seconds 0: the re-runs found bf16 and the baseline within the noise and kept the
    baseline, which changes fewer knobs; the recommendation must be that one, not the higher
    median the tie-break judged to be noise."""
    baseline = _record(0, 8, 100.0)
    bf16 = TrialRecord(
        number=1,
        role="search",
        result=TrialResult(config=SMALL.model_copy(update={"amp": "bf16"}), status="ok"),
    )
    tied = Selection(
        winner=baseline,
        winner_runs=(100.0, 101.0),
        baseline_runs=(100.0, 101.0),
        confirmations=(),
        close_call="trials 1 and 0 stayed within measurement noise",
        finalists=(baseline, bf16),
        confirmed_rates={0: 100.5, 1: 102.0},
    )
    assert race_choice(tied, None, SMALL) == (baseline, LrPlan())
    ahead = replace(tied, winner=bf16, close_call=None)
    assert race_choice(ahead, None, SMALL)[0] is bf16
