"""examples/hf_gpt2.py, a Hugging Face GPT-2, tuned end to end from the command line; its exports
load into the real TrainingArguments and Lightning Trainer."""

import importlib.util
import json

import pytest

from advisor.memory import mimalloc_library
from tests.conftest import advisor_here, run_advisor

pytestmark = pytest.mark.slow


def test_the_hf_example_tunes_and_its_exports_load_in_the_real_libraries(tmp_path):
    # Imported here, not at collection: every xdist worker collects this module, and the two
    # libraries take 3.7 s to import.
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    # Throughput alone: the race has tests of its own; this one is for the model and the exports.
    completed = advisor_here(
        "tune", "examples/hf_gpt2.py:factory", "--out", str(tmp_path), "--trials", "2",
        "--trial-seconds", "0.3", "--warmup-steps", "1", "--confirm-top", "1",
        "--confirm-repeats", "1",
        "--max-world-size", "1", "--objective", "throughput",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "exports/ (for HF Trainer, Lightning, accelerate)" in completed.stdout
    recommendation = json.loads((tmp_path / "recommendation.json").read_text())

    document = json.loads((tmp_path / "exports" / "hf_training_args.json").read_text())
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), report_to="none", **document["training_args"]
    )
    assert args.per_device_train_batch_size == recommendation["config"]["batch_size"]
    assert args.gradient_accumulation_steps == recommendation["config"]["accumulation_steps"]

    spec = importlib.util.spec_from_file_location(
        "lightning_export", tmp_path / "exports" / "lightning_trainer.py"
    )
    assert spec is not None and spec.loader is not None
    snippet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snippet)
    trainer = snippet.make_trainer(logger=False, enable_checkpointing=False)
    assert trainer.accumulate_grad_batches == recommendation["config"]["accumulation_steps"]


def test_the_narrow_example_under_mimalloc_keeps_its_batch_within_the_budget(tmp_path):
    """examples/narrow_gpt2.py as its docstring runs it, under a looser budget (your batch of 64
    peaks near 730 MiB, 32 x 2 near 540): under mimalloc the tune records the allocator and
    keeps the budget, and launch.sh preloads what it measured under. Whether checkpointing
    pays is a measurement (docs/benchmarks.md), not asserted here."""
    pytest.importorskip("transformers")
    library = mimalloc_library()
    if library is None:
        pytest.skip("cmeel-mimalloc is not installed")
    completed = run_advisor(
        "tune", "examples/narrow_gpt2.py:factory", "--out", str(tmp_path), "--trials", "2",
        "--trial-seconds", "0.5", "--warmup-steps", "1", "--confirm-repeats", "1",
        "--confirm-top", "1", "--memory-budget", "640MiB", "--global-batch-size", "64",
        "--race-seconds", "0", "--max-world-size", "1", env={"LD_PRELOAD": str(library)},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    recommendation = json.loads((tmp_path / "recommendation.json").read_text())
    assert recommendation["hardware"]["allocator"] == "mimalloc"
    assert recommendation["memory_budget"]["baseline_peak"] > 640 * 2**20
    assert recommendation["peak_memory_bytes"] <= 640 * 2**20
    config = recommendation["config"]
    assert config["batch_size"] * config["accumulation_steps"] == 64  # one process: your batch
    assert "your configuration does not fit the memory budget" in completed.stdout
    assert f'export LD_PRELOAD="${{LD_PRELOAD:-{library}}}"' in (tmp_path / "launch.sh").read_text()
