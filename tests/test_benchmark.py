"""The benchmark script runs end to end on the tiny preset (it is checked to work, not timed).

Running it takes a minute of timing workers, so those tests are marked `benchmark` (python -m pytest tests -m
benchmark); the FLOP count behind its MFU figures is a correctness test and stays in the default suite."""

import json

import pytest

from vaswani.scripts import benchmark


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
