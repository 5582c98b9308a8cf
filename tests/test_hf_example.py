"""examples/hf_gpt2.py, a Hugging Face GPT-2, tuned end to end from the command line; its exports
load into the real TrainingArguments and Lightning Trainer."""

import importlib.util
import json

import pytest

from tests.conftest import run_advisor

pytestmark = pytest.mark.slow


def test_the_hf_example_tunes_and_its_exports_load_in_the_real_libraries(tmp_path):
    # Imported here, not at collection: every xdist worker collects this module, and the two
    # libraries take 3.7 s to import.
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    # Throughput alone: the race has tests of its own; this one is for the model and the exports.
    completed = run_advisor(
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
        "lightning_export", tmp_path / "exports" / "lightning.py"
    )
    assert spec is not None and spec.loader is not None
    snippet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snippet)
    trainer = snippet.make_trainer(logger=False, enable_checkpointing=False)
    assert trainer.accumulate_grad_batches == recommendation["config"]["accumulation_steps"]
