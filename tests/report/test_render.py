"""report.md and report.html name each knob with what it is, from the knob table."""

import warnings
from pathlib import Path

from advisor.decide.analysis import search_effort
from advisor.decide.race.verdict import decide_race
from advisor.knobs import KNOB, TrialConfig
from advisor.report.change import change_line
from advisor.report.plots import race_svg
from advisor.report.render import effort_summary, render_html, render_markdown
from advisor.report.verdicts import race_verdict
from advisor.results import (
    BatchPrediction,
    Confirmation,
    Efficiency,
    FixedKnob,
    KnobEffect,
    LrPlan,
    NoiseScale,
    Racer,
    RaceSummary,
    RaceVerdict,
    Recommendation,
    RejectedValue,
    ThroughputPick,
    Tie,
    TrialRecord,
    TrialResult,
    TuneResult,
)
from advisor.settings import TuneSettings
from tests.conftest import CPU_PROFILE
from tests.decide.test_race import BIG, SMALL, YOURS, _racer, _replicates
from tests.search.test_space import TASK

WINNER = TrialConfig(parallel_mode="ddp", world_size=2, batch_size=256, accumulation_steps=2)


def _result() -> TuneResult:
    recommendation = Recommendation(
        advisor_version="test",
        spec="m.py:f",
        workdir="/work",
        config=WINNER,
        samples_per_s=2000.0,
        peak_memory_bytes=2**30,
        baseline_config=TrialConfig(batch_size=32),
        baseline_samples_per_s=1000.0,
        speedup=2.0,
        chosen_from_trial=4,
        confirm_runs=(1990.0, 2010.0),
        baseline_runs=(1000.0,),
        global_batch_changed=True,
        fixed_knobs=(FixedKnob(name="pin_memory", value="False", reason="no CUDA device"),),
        hardware=CPU_PROFILE,
        task=TASK,
        storage="sqlite:///x.db",
        study_name="s",
        created_at="2026-11-23T00:00:00+00:00",
    )
    return TuneResult(
        settings=TuneSettings(spec="m.py:f"),
        recommendation=recommendation,
        trials=(),
        confirmations=(),
        out_dir=Path("reports/s"),
    )


def test_the_recommendation_table_lists_one_row_per_knob_with_what_it_is():
    report = render_markdown(_result())
    batch = KNOB["batch_size"]
    assert f"| batch_size | {batch.title} ({batch.unit}) | 256 | 32 |" in report
    assert f"| parallel | {KNOB['parallel'].title} | ddp-2 | none |" in report
    assert "| global batch | samples per optimizer step | 1024 | 32 |" in report
    pin = f"| pin_memory | {KNOB['pin_memory'].title} | fixed at False | no CUDA device |"
    assert pin in report


def test_the_html_report_says_what_each_knob_is_too():
    html = render_html(_result())
    assert f"<td>parallel</td><td>{KNOB['parallel'].title}</td><td>ddp-2</td>" in html
    assert f"<td>pin_memory</td><td>{KNOB['pin_memory'].title}</td><td>False</td>" in html


def test_the_first_line_names_every_changed_knob_from_and_to_and_one_figure():
    report = render_markdown(_result())
    recommendation = report.split("## Recommendation", 1)[1].strip().splitlines()[0]
    assert recommendation.startswith("**Change parallel none → ddp-2, batch_size 32 → 256, ")
    assert "accumulation_steps 1 → 2; keep everything else. 2.00x your samples/s" in recommendation
    kept = _result().recommendation
    same = kept.model_copy(update={"config": kept.baseline_config, "speedup": 1.0})
    assert change_line(same).startswith("Keep your configuration")


def test_no_efficiency_above_the_peak_is_printed_where_the_probe_was_disturbed():
    """A peak probed while another program ran can sit below what training achieves: 227 % of
    it was printed on a held-out run. The share is left out and the reason given."""
    result = _result()
    efficiency = Efficiency(
        flops_per_sample=1e6, achieved_flops=2.27e11, peak_flops=1e11, dtype="bf16",
        devices="2 CPU cores", fraction_of_peak=2.27,
    )  # fmt: skip
    rec = result.recommendation.model_copy(update={"efficiency": efficiency})
    disturbed = result.model_copy(update={"recommendation": rec})
    for report in (render_markdown(disturbed), render_html(disturbed)):
        assert "227.0 %" not in report and "% of the bf16 matmul peak" not in report
        assert "the probe ran while another program took the machine" in report
    fine = efficiency.model_copy(update={"fraction_of_peak": 0.4})
    rec = result.recommendation.model_copy(update={"efficiency": fine})
    report = render_markdown(result.model_copy(update={"recommendation": rec}))
    assert "40.0 % of the bf16 matmul peak" in report


def _kept(race: RaceSummary | None) -> str:
    """report.md of a tune that recommends the baseline, though a faster configuration with
    another global batch was measured."""
    result = _result()
    rec = result.recommendation.model_copy(
        update={
            "config": result.recommendation.baseline_config,
            "objective": "time-to-loss",
            "throughput_pick": ThroughputPick(config=WINNER, trial=4, samples_per_s=2000.0),
            "race": race,
        }
    )
    return render_markdown(result.model_copy(update={"recommendation": rec}))


def test_a_kept_baseline_is_said_to_have_won_a_race_only_where_one_ran():
    race = RaceSummary(
        seconds=15.0, loss_kind="train", target_loss=1.0, racers=(), winner=None, verdict="-"
    )
    assert "**Your configuration reached your loss soonest**" in _kept(race)
    unraced = _kept(None)  # --race-seconds 0: no race, the global batch is kept
    assert "soonest" not in unraced and "in the race" not in unraced
    assert "**Your configuration was the fastest with your global batch**" in unraced
    assert "its global batch 1024 did not race, so it is not recommended" in unraced
    result = _result()
    rec = result.recommendation.model_copy(update={"config": TrialConfig(batch_size=32)})
    html = render_html(result.model_copy(update={"recommendation": rec}))
    assert "<b>Your configuration was the fastest one measured</b>" in html


def test_the_report_states_the_claim_with_its_interval_and_a_close_call_as_one():
    from advisor.report.race_view import _target_text
    from tests.decide.test_race import BIG, SMALL, YOURS, _replicates

    fast, slow = [4, 2, 1.0, 0.9, 0.8, 0.7], [4, 3.2, 2.4, 1.8, 1.4, 1.1, 1.0]
    won = decide_race(
        _replicates(
            ("baseline", SMALL, 100.0, [YOURS, YOURS]),
            ("candidate", BIG, 100.0, [fast, fast]),
        ),
        5,
    )
    claim = won.time_to_loss
    assert claim is not None and claim.low < 2.5 < claim.high
    interval = f"({claim.low:.2f}x-{claim.high:.2f}x, 2 replicates)"
    assert f"reaches your loss 2.50x {interval} sooner" in race_verdict(won)
    assert "the median over the race's 2 replicates" in _target_text(won)
    close = decide_race(
        _replicates(
            ("baseline", SMALL, 100.0, [YOURS, YOURS]),
            ("candidate", BIG, 100.0, [fast, slow]),
        ),
        5,
    )
    assert race_verdict(close).startswith("a close call: ")
    best = close.verdict.best_claim
    assert best is not None
    interval = f"({best.low:.2f}x-{best.high:.2f}x, 2 replicates)"
    assert f"{interval} sooner than yours); your configuration" in race_verdict(close)


def _with_race(race: RaceSummary, config: TrialConfig, *, html: bool = False) -> str:
    """The reports of a time-to-loss tune with this race and a noise scale that planned to race
    global batches 64 (predicted 1.6x sooner) and 1024 (0.66x: 1.52x later)."""

    def predicted(batch: int, rate: float, samples: float, speedup: float) -> BatchPrediction:
        return BatchPrediction(
            global_batch=batch,
            samples_per_s=rate,
            samples_ratio=samples,
            predicted_speedup=speedup,
            raced=batch != 32,
        )

    predictions = (
        predicted(32, 1e3, 1, 1),
        predicted(64, 1900, 1.2, 1.6),
        predicted(1024, 2e3, 3, 0.66),
    )
    noise = NoiseScale(value=1e2, small_batch=32, big_batch=256, steps=20, predictions=predictions)
    result = _result()
    rec = result.recommendation.model_copy(
        update={
            "config": config,
            "objective": "time-to-loss",
            "race": race,
            "noise_scale": noise,
            "global_batch_changed": config.global_batch_size != 32,
            "throughput_pick": ThroughputPick(config=WINNER, trial=4, samples_per_s=2000.0),
        }
    )
    tuned = result.model_copy(update={"recommendation": rec})
    return render_html(tuned) if html else render_markdown(tuned)


def test_a_race_whose_loss_did_not_fall_says_which_batches_it_skipped():
    rising = [2.30, 2.32, 2.33, 2.36, 2.35, 2.41, 2.45, 2.52, 2.60, 2.67, 2.78]
    race = decide_race([_racer("baseline", TrialConfig(batch_size=32), rising)], 10)
    kept = TrialConfig(batch_size=32, channels_last=True)  # the fastest at your batch

    markdown = _with_race(race, kept)

    assert "your loss did not fall beyond its noise in the race" in markdown
    assert "| 64 | 1,900 | 1.20x | 1.60x sooner | skipped: your loss did not fall |" in markdown
    assert "| 1024 | 2,000 | 3.00x | 1.52x later | skipped: your loss did not fall |" in markdown
    assert "The target is" not in markdown
    assert "the dashed line is the target" not in _with_race(race, kept, html=True)


def test_a_batch_that_was_to_race_but_did_not_is_not_said_skipped_where_the_loss_fell():
    """E.g. its finalist failed its re-runs: the race ran, to a target."""
    falling = [2.3, 2.0, 1.8, 1.7, 1.6, 1.55, 1.5, 1.45, 1.42, 1.4, 1.38]
    small, big = TrialConfig(batch_size=32), TrialConfig(batch_size=64)
    race = decide_race([_racer("baseline", small, falling), _racer("candidate", big, falling)], 10)
    assert race.target_loss is not None

    markdown = _with_race(race, small)

    assert "| 64 | 1,900 | 1.20x | 1.60x sooner | yes |" in markdown
    assert "| 1024 | 2,000 | 3.00x | 1.52x later | no |" in markdown
    assert "The target is" in markdown


def test_the_reports_say_where_the_search_went_and_the_best_at_your_batch():
    def record(number, config, rate, role="search", derived_from=None):
        result = TrialResult(config=config, status="ok", samples_per_s=rate)
        return TrialRecord(number=number, role=role, result=result, derived_from=derived_from)

    yours = TrialConfig(batch_size=32)
    workers = TrialConfig(batch_size=32, num_workers=2)
    big = TrialConfig(batch_size=256)
    trials = (
        record(0, yours, 1000.0, role="baseline"),
        record(1, workers, 1500.0),
        record(2, big, 5000.0),
        record(3, TrialConfig(batch_size=256, accumulation_steps=2), 5200.0, derived_from=2),
        record(4, TrialConfig(batch_size=512), 6000.0),
    )
    reruns = (
        record(0, yours, 900.0, role="confirm"),
        record(1, workers, 1260.0, role="confirm"),
    )
    rec = _result().recommendation  # no race: no batch raced
    effort = search_effort(trials, reruns, rec)
    batches = [(b.global_batch, b.ran, b.derived, b.yours) for b in effort.batches]
    assert batches == [(32, 2, 0, True), (256, 1, 0, False), (512, 1, 1, False)]
    assert effort.best_at_yours == 1 and effort.on_re_runs
    # The re-runs choose it, as the race does: a search window that ran high does not.
    lucky = (*trials, record(5, TrialConfig(batch_size=16, accumulation_steps=2), 1700.0))
    assert search_effort(lucky, reruns, rec).best_at_yours == 1
    assert abs(effort.best_at_yours_speedup - 1.4) < 1e-9  # re-runs: 1,260 / 900
    assert effort.share == 2 / 4  # two of the four that ran are at batch 32; none raced
    result = _result().model_copy(update={"trials": trials, "effort": effort})
    report = render_markdown(result)
    assert "## Where the search went" in report
    assert "| 32 (yours) | 2 | 0 | yours |" in report
    assert (
        "trial 1, bs=32 acc=1 amp=off workers=2, 1.40x your baseline's samples/s (re-runs)"
        in report
    )
    assert "Where the search went" in render_html(result)
    assert effort_summary(effort).startswith("4 trials ran, 50% at your global batch 32")
    assert not effort.best_is_yours

    slower = (trials[0], record(1, workers, 800.0), *trials[2:])
    kept = search_effort(slower, (), rec)
    assert kept.best_is_yours and not kept.on_re_runs
    assert effort_summary(kept).endswith("; nothing at 32 beat your configuration")
    kept_report = render_markdown(result.model_copy(update={"trials": slower, "effort": kept}))
    assert "**Best at your global batch:** your configuration;" in kept_report


def _in_replicates(racers: list[Racer], count: int = 3) -> list[Racer]:
    """The racers again in each of `count` replicates, alike."""
    return [r.model_copy(update={"replicate": i}) for i in range(count) for r in racers]


def test_a_throughput_pick_is_judged_by_the_lr_that_ended_lower_as_the_verdict_judged_it():
    """On an H200, batch 256 dipped below the race loss sooner with lr x4 than the winner, then
    rose far above where your lr left it: a dip it did not hold is no crossing (its settled
    curve pools the rise), and the report must not say the winner was sooner without saying
    why the faster run did not count."""
    from tests.decide.test_race import SMALL, _racer

    mid = TrialConfig(batch_size=64)
    rule = LrPlan(scale=4.0, rule="sqrt")
    racers = [
        _racer("baseline", SMALL, [4.0, 3.0, 2.0, 1.5, 1.2, 1.0, 1.0, 1.0]),
        _racer("candidate", mid, [4.0, 2.0, 1.5, 1.2, 1.0, 0.9]),
        _racer("candidate", WINNER, [4.0, 2.5, 2.2, 2.1, 2.0, 1.9]),
        _racer("candidate", WINNER, [4.0, 0.9, 2.0, 2.5, 2.8, 3.0], rule),
    ]
    race = decide_race(_in_replicates(racers), 5)
    assert race.racers[race.winner].config == mid
    report = _with_race(race, mid)
    assert "it raced and did not reach your loss within the race (your lr)" in report
    assert "| lr x4 (sqrt rule) | 8 | 3 | not within the race |" in report
    assert "the recommendation reached it after 4.0 s" in report
    assert "the recommendation was sooner" not in report


def test_a_race_that_went_on_says_so_and_which_racers_did_not():
    """The baseline went on from 10 s to 30 s; the candidate stopped at 10 s."""
    small, big = TrialConfig(batch_size=32), TrialConfig(batch_size=64)
    longer = [2.3 - 0.03 * i for i in range(31)]
    baseline = _racer("baseline", small, longer)
    candidate = _racer("candidate", big, [2.3 - 0.04 * i for i in range(11)])  # 1.9 at 10 s
    race = decide_race([baseline, candidate], 30).model_copy(
        update={
            "went_on_from": 10.0,
            "first_race": decide_race([baseline, candidate], 30).model_copy(
                update={"verdict": RaceVerdict(kind="stated", reason="the best at 32 won")}
            ),
        }
    )

    markdown = _with_race(race, small)

    assert "Each racer trained for 10 s of training time" in markdown
    assert "The race went on: after 10 s, the best at 32 won." in markdown
    assert "bs=32 acc=1 amp=off workers=0, your lr went on from where they stopped" in markdown
    assert "to 30 s of training" in markdown
    assert "not within its 10 s (it did not go on)" in markdown
    assert "The race went on: after 10 s" in _with_race(race, small, html=True)


def test_a_stored_race_keeps_its_figures_and_is_worded_when_rendered():
    """The decision stores a kind and its racers, not a sentence: a race read back from its
    JSON renders the same words, and a race stored when verdicts were sentences keeps its
    sentence (and the sentence of the race before it went on)."""
    from tests.decide.test_race import BIG, SMALL

    baseline = _racer("baseline", SMALL, [2.3 - 0.03 * i for i in range(11)])
    candidate = _racer("candidate", BIG, [2.3 - 0.06 * i for i in range(11)])
    race = decide_race(_in_replicates([baseline, candidate]), 10)
    stored = race.model_dump_json()
    assert race.verdict.kind == "won" and "reached your race loss" not in stored
    assert race_verdict(RaceSummary.model_validate_json(stored)) == race_verdict(race)

    old = {**race.model_dump(), "verdict": "batch 64 won", "first_verdict": "batch 32 won"}
    old.pop("first_race")
    legacy = RaceSummary.model_validate(old)
    assert race_verdict(legacy) == "batch 64 won"
    assert legacy.first_race is not None and race_verdict(legacy.first_race) == "batch 32 won"


def test_stored_explanations_are_data_worded_today_and_old_sentences_are_kept():
    """A tie, a rejected value, compilation's pay-off and an unconfirmed claim are stored as
    kinds and figures, worded when rendered; one stored when they were sentences keeps them."""
    tie = Tie(fast=5, slow=4, runs=4, gap=0.012, fast_spread=0.02, slow_spread=0.01, kept=4)
    rejected = RejectedValue(
        knob="amp",
        value="bf16",
        trials=(1, 3),
        failures="2 diverged",
        counterparts=((0, 1),),
        cited=1,
        cited_kind="diverged",
        cited_reason="loss became nan",
    )
    compiled = KnobEffect(
        knob="compile",
        from_value="off",
        to_value="default",
        ratio=1.2,
        pairs=((0, 1),),
        pair_ratios=(1.2,),
        compile_extra_s=12.0,
        compile_saved_s=0.004,
    )
    confirmation = Confirmation(
        confirmed=False,
        ratios=(1.2, 2.0, 1.5),
        low=1.1,
        high=2.1,
        claimed_speedup=1.2,
        unconfirmed="spread",
        tolerance=0.15,
    )
    rec = _result().recommendation.model_copy(
        update={
            "close_call": tie,
            "rejected_values": (rejected,),
            "knob_effects": (compiled,),
            "confirmation": confirmation,
        }
    )
    stored = Recommendation.model_validate_json(rec.model_dump_json())
    report = render_markdown(_result().model_copy(update={"recommendation": stored}))
    assert "trials 5 and 4 stayed within measurement noise after 4 re-runs each" in report
    assert "advisor recommends trial 4, which changes fewer knobs" in report
    assert "amp=bf16 rejected: trial 1 diverged (loss became nan) where trial 0" in report
    assert "it pays off after 3,000 steps" in report
    assert "ranged from 1.20x to 2.00x over 3 rounds, more than ±15%" in report
    assert "with nothing else seen running" in (stored.confirmation.why or "")

    old = rec.model_dump(mode="json")
    old["close_call"] = "trials 5 and 4 tied"
    old["rejected_values"][0] = {**old["rejected_values"][0], "explanation": "bf16 failed"}
    old["confirmation"] = {**old["confirmation"], "why": "two rounds"}
    del old["confirmation"]["unconfirmed"]
    legacy = Recommendation.model_validate(old)
    report = render_markdown(_result().model_copy(update={"recommendation": legacy}))
    assert "**A close call:** trials 5 and 4 tied." in report and "- bf16 failed." in report
    assert legacy.confirmation is not None and legacy.confirmation.why == "two rounds"


def test_a_knob_searched_over_fewer_values_is_named_limited_not_fixed():
    result = _result()
    limited = FixedKnob(name="amp", value="off|bf16", reason="fp16 needs CUDA", kind="limited")
    rec = result.recommendation.model_copy(
        update={"fixed_knobs": (*result.recommendation.fixed_knobs, limited)}
    )
    report = render_markdown(result.model_copy(update={"recommendation": rec}))
    assert "## Knobs fixed or limited" in report
    assert "| searched over off\\|bf16 | fp16 needs CUDA |" in report
    assert "| fixed at False | no CUDA device |" in report


def test_the_race_plot_of_six_replicates_keeps_one_legend_entry_per_racer(tmp_path):
    """Later replicates share their racer's colour, out of the legend: forty lines in it made
    matplotlib collapse the plot and warn on the user's console."""
    racers = _replicates(
        ("baseline", SMALL, 100.0, [YOURS] * 6),
        ("candidate", BIG, 300.0, [YOURS] * 6),
        ("candidate", TrialConfig(batch_size=64), 200.0, [YOURS] * 6),
    )
    race = decide_race(racers, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        svg = race_svg(race)
    assert svg is not None and svg.count("yours: bs 8") == 1 and svg.count("bs 256,") == 1
