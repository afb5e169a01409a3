"""The benchmark script runs end to end on the tiny preset (it is checked to work, not timed).

Running it takes a minute of timing workers, so those tests are marked `benchmark` (python -m pytest tests -m
benchmark); the FLOP count behind its MFU figures is a correctness test and stays in the default suite."""

import json

import pytest
import torch

from vaswani.scripts import benchmark, gpu_report


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("benchmarks")
    benchmark.main(
        [
            "--preset",
            "tiny",
            "--rounds",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--batch_tokens",
            "128",
            "--train_length",
            "16",
            "--gen_batch",
            "2",
            "--gen_source_length",
            "6",
            "--gen_length",
            "5",
            "--sweep_lengths",
            "32",
            "--sweep_batch_tokens",
            "256",
            "--output_dir",
            str(output_dir),
        ]
    )
    return output_dir


@pytest.mark.benchmark
def test_benchmark_writes_one_row_per_implementation(report):
    data = json.loads((report / "cpu_tiny_float32.json").read_text())
    names = [row["implementation"] for row in data["rows"]]
    assert names == ["vaswani", "marian", "ctranslate2:float32", "ctranslate2:int8"]
    for row in data["rows"]:
        assert row["beam1_sentences_per_s"]["median"] > 0 and row["beam4_tokens_per_s"]["median"] > 0
    for result in data["raw"].values():  # two processes of one timed repetition each, pooled
        assert all(len(measurement["times"]) == 2 for measurement in result.values())
    trained = [row for row in data["rows"] if "train_tokens_per_s" in row]
    assert [row["implementation"] for row in trained] == ["vaswani", "marian"]
    assert all(row["train_peak_memory_mib"] > 0 for row in trained)


@pytest.mark.benchmark
def test_benchmark_sweeps_length_and_batch_tokens(report):
    data = json.loads((report / "cpu_tiny_float32.json").read_text())
    by_axis = {(p["sweep_axis"], p["implementation"]): p for p in data["sweep"]}
    assert by_axis[("length", "vaswani")]["length"] == 32 and by_axis[("length", "vaswani")]["batch"] == 4
    assert by_axis[("batch_tokens", "marian")]["batch"] == 16
    markdown = (report / "cpu_tiny_float32.md").read_text()
    assert "| vaswani |" in markdown and "vs Marian" in markdown and "against sequence length" in markdown


@pytest.mark.benchmark
def test_benchmark_reports_mfu_against_the_measured_matmul_ceiling(report):
    data = json.loads((report / "cpu_tiny_float32.json").read_text())
    assert data["matmul_ceiling"]["flops_per_s"] > 0
    for row in data["rows"][:2]:
        assert 0 < row["train_mfu"] < 1
        assert row["train_mfu"] == row["train_flops_per_s"]["median"] / data["matmul_ceiling"]["flops_per_s"]
    assert "TFLOP/s (MFU)" in (report / "cpu_tiny_float32.md").read_text()


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_model_flops_of_a_training_step_match_torch_flop_counter(preset):
    """The MFU numerator: the counted FLOPs of an eager forward + backward equal the formula exactly."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration

    config = VaswaniConfig.from_preset(preset, vocab_size=500, attn_implementation="eager")
    model = VaswaniForConditionalGeneration(config)
    batch, length = 3, 7
    source, target = torch.randint(4, 500, (batch, length)), torch.randint(4, 500, (batch, length))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=source, labels=target).loss.backward()
    assert benchmark.training_step_flops(config, batch, length) == counter.get_total_flops()


@pytest.mark.slow
@pytest.mark.benchmark
def test_benchmark_compiled_generation_writes_its_own_table(tmp_path):
    benchmark.main(
        [
            "--preset",
            "tiny",
            "--rounds",
            "1",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--batch_tokens",
            "128",
            "--train_length",
            "16",
            "--gen_batch",
            "2",
            "--gen_source_length",
            "6",
            "--gen_length",
            "5",
            "--sweep_lengths",
            "32",
            "--sweep_batch_tokens",
            "256",
            "--no_ctranslate2",
            "--compile",
            "--output_dir",
            str(tmp_path),
        ]
    )
    data = json.loads((tmp_path / "cpu_tiny_float32_compile.json").read_text())
    assert [row["implementation"] for row in data["rows"]] == ["vaswani", "marian"]
    assert data["settings"]["compile"] and all(row["beam4_sentences_per_s"]["median"] > 0 for row in data["rows"])
    assert "static KV cache and torch.compile" in (tmp_path / "cpu_tiny_float32_compile.md").read_text()


# --- The GPU report (scripts/gpu_report.py): its code runs here in quick mode, its figures come from a GPU. ---


@pytest.fixture(scope="module")
def carried_corpus(tmp_path_factory):
    """What `benchmark.py --prepare` carries to the device, from a tiny word-for-word corpus."""
    from test_training import make_dataset, make_tokenizer

    root = tmp_path_factory.mktemp("carry")
    data = make_dataset(root / "data", {"train": 300, "validation": 10, "test": 20})
    gpu_report.prepare_corpus(data, make_tokenizer(root / "tokenizer"), root / "carry" / "corpus")
    return data, root / "carry"


def test_the_devices_padding_is_the_collators(carried_corpus):
    """time_to_bleu pads the carried numpy pairs itself (no pyarrow on the device): the same tensors as PairCollator
    gives train.py for the same pairs, read back from the carried files."""
    import numpy as np
    from transformers import AutoTokenizer

    from vaswani import VaswaniConfig
    from vaswani.training.data import PairCollator, load_translation_dataset, tokenize_split

    data, carry = carried_corpus
    tokenizer = AutoTokenizer.from_pretrained(carry / "corpus" / "tokenizer")
    split = tokenize_split(load_translation_dataset(data, "en", "es")["train"], tokenizer, "en", "es")
    rows = [0, 7, 42, 299]
    expected = PairCollator(tokenizer.pad_token_id, tokenizer.bos_token_id)(split.pairs.with_format("arrow")[rows])
    arrays = np.load(carry / "corpus" / "train.npz")
    sources, targets = (np.split(arrays[side], arrays[f"{side}_offsets"][1:-1]) for side in ("source", "target"))
    config = VaswaniConfig(vocab_size=len(tokenizer), pad_token_id=0, decoder_start_token_id=1)
    padded = gpu_report.pad_batch([sources[r] for r in rows], [targets[r] for r in rows], config, "cpu")
    assert padded.keys() == expected.keys()
    for key in expected:
        assert torch.equal(padded[key], expected[key]), key


def test_a_measurement_past_the_budget_or_failing_is_reported_as_not_measured(tmp_path):
    spent = gpu_report.Deadline(minutes=0)
    assert gpu_report.measured(spent, lambda left: {"x": 1}) == {
        "not_measured": "the section's time budget ran out before it"
    }
    assert gpu_report.measured(gpu_report.Deadline(1), lambda left: {"x": left})["x"] > 50

    def broken(left):
        raise ImportError("ctranslate2 is not installed here")

    assert gpu_report.measured(gpu_report.Deadline(1), broken) == {
        "not_measured": "it failed: ctranslate2 is not installed here"
    }


@pytest.mark.benchmark
def test_quick_mode_runs_every_section_and_assembles_the_page(carried_corpus, tmp_path):
    _, carry = carried_corpus
    report_dir, docs = tmp_path / "report", tmp_path / "docs"
    sections = list(gpu_report.SECTIONS)  # one command may run several
    benchmark.main(
        ["--device", "cpu", "--quick", "--section", *sections, "--report_dir", report_dir, "--carry_dir", carry]
    )
    benchmark.main(["--assemble", "--report_dir", report_dir, "--output_dir", docs])

    results = {name: json.loads((report_dir / f"{name}.json").read_text()) for name in gpu_report.SECTIONS}
    assert all(result["quick"] and result["minutes"] < 6 for result in results.values())
    correctness = results["correctness"]["results"]
    assert correctness["GPU tests (tests/test_gpu.py)"]["skip_reasons"] == ["needs a CUDA device"]
    assert all(run["passed"] > 20 and run["failed"] == 0 for name, run in correctness.items() if "generation" in name)
    training = results["training"]["results"]
    assert [(r["implementation"], r["compiled"]) for r in training["rows"]] == [
        ("vaswani", False), ("marian", False), ("vaswani", True), ("marian", True)
    ]  # fmt: skip
    assert all(0 < row["mfu"] < 1 and row["tokens_per_s"]["median"] > 0 for row in training["rows"])
    assert [point["chunk_elements"] for point in training["chunk_sweep"]] == [2**10, 2**14]
    assert "aten::mm" in training["profile"]["profile"]
    engines = {(row["batch"], row["engine"]) for row in results["generation"]["results"]["rows"]}
    assert engines == {
        (batch, engine)
        for batch in (1, 4)
        for engine in ("eager", "static cache + compile", "CTranslate2 float32", "CTranslate2 int8")
    }
    points = results["time_to_bleu"]["results"]["points"]
    assert len(points) >= 2 and all(0 <= point["bleu"] <= 100 for point in points)

    page = (docs / "gpu.md").read_text()
    assert page.startswith("# GPU report") and "transformers 5." in page and "Quick mode" in page
    for heading in ("## Targets", "## correctness", "## training", "## generation", "## time_to_bleu"):
        assert heading in page
    assert ">= 1.2x Marian" in page and ">= 1.5x eager at batch 1" in page and "time to BLEU" in page
    pictures = sorted(path.name for path in docs.glob("*.png"))
    assert pictures == ["gpu_generation.png", "gpu_time_to_bleu.png", "gpu_training.png"]


@pytest.mark.benchmark
def test_learning_curves_train_each_variant_and_marian_and_report_them(carried_corpus, tmp_path):
    """docs/benchmarks/learning_curves.py end to end on the tiny preset: a JSON per run, the table and the plot."""
    import subprocess
    import sys
    from pathlib import Path

    data, carry = carried_corpus
    script = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "learning_curves.py"
    command = [sys.executable, script, "--dataset_dir", data, "--tokenizer", carry / "corpus" / "tokenizer"]
    command += ["--output_dir", tmp_path, "--preset", "tiny", "--max_steps", "6", "--eval_every", "3"]
    command += ["--batch_tokens", "400", "--warmup_steps", "2", "--bleu_samples", "5", "--report_steps", "3", "6"]
    command += ["--variants", "vaswani:fairseq", "marian"]
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {path.stem: json.loads(path.read_text()) for path in (tmp_path / "runs").glob("*.json")}
    assert sorted(runs) == ["marian-seed1", "vaswani-fairseq-seed1"]
    assert not list((tmp_path / "runs").glob("*.pt"))  # the resume states go once a run is done
    for run in runs.values():
        assert [point["step"] for point in run["curve"]] == [3, 6]
        assert run["curve"][1]["val_nll"] < run["curve"][0]["val_nll"] and 0 <= run["test_bleu"] <= 100
    table = (tmp_path / "learning_curves.md").read_text()
    assert "| vaswani:fairseq | 1 |" in table and "| marian | 1 |" in table and "val NLL @ 6" in table
    assert (tmp_path / "learning_curves.png").stat().st_size > 0
