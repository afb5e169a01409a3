"""The development tools of benchmarks/ (not installed) run from the checkout's root, as their README says:
`python -m benchmarks.NAME`. They are run here in subprocesses from the root, the one place their package imports.

Running the benchmark and the GPU report's sections takes minutes of timing workers, so those tests are marked
`benchmark` (python -m pytest tests -m benchmark); what the figures rest on stays in the default suite: the FLOP
count behind MFU, the training measurement taking the recipe's own step, the GPU report's batches."""

import json
import sys

import datasets
import pytest
import torch
from helpers import PAIRS, make_dataset, run_command, script_env, word_tokenizer
from packaging.version import Version


def run_in_checkout(*arguments, timeout=900):
    """`python ARGUMENTS` from the checkout's root, one thread per process: `-m benchmarks.NAME ...` as
    benchmarks/README.md runs a tool, or `-c CODE` that imports them; fails the test with its output if it fails."""
    return run_command([sys.executable, *arguments], timeout=timeout, check=True)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("benchmarks")
    run_in_checkout(
        "-m", "benchmarks.benchmark", "--preset", "tiny", "--rounds", "2", "--repeats", "1", "--warmup", "0",
        "--batch_tokens", "128", "--train_length", "16", "--gen_batch", "2", "--gen_source_length", "6",
        "--gen_length", "5", "--sweep_lengths", "32", "--sweep_batch_tokens", "256", "--output_dir", output_dir,
    )  # fmt: skip
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
    for implementation in ("ctranslate2:float32", "ctranslate2:int8"):  # timed where torch never ran
        assert [m["torch_loaded"] for m in data["raw"][implementation].values()] == [False, False]
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
def test_benchmark_reports_mfu_against_the_measured_matrix_multiply_ceiling(report):
    data = json.loads((report / "cpu_tiny_float32.json").read_text())
    assert data["matmul_ceiling"]["flops_per_s"] > 0
    for row in data["rows"][:2]:
        assert 0 < row["train_mfu"] < 1
        assert row["train_mfu"] == row["train_flops_per_s"]["median"] / data["matmul_ceiling"]["flops_per_s"]
    assert "TFLOP/s (MFU)" in (report / "cpu_tiny_float32.md").read_text()


@pytest.mark.benchmark
def test_decoding_benchmark_times_every_engine_on_the_same_sentences(trained_text_model, tmp_path):
    """benchmarks/decoding.py end to end on a model that knows its test pairs by heart: every engine translates them,
    each alone (CTranslate2 where torch never ran), and MarianMTModel holding the model's weights translates as
    transformers' beam search of the model does."""
    from datasets import Dataset, DatasetDict

    _, _, folder = trained_text_model
    test = Dataset.from_dict({"translation": [{"en": source, "es": target} for source, target in PAIRS]})
    DatasetDict(train=test, validation=test, test=test).save_to_disk(str(tmp_path / "data"))
    run_in_checkout(
        "-m", "benchmarks.decoding", "--model", folder, "--dataset_dir", tmp_path / "data", "--batch_size", "3",
        "--rounds", "1", "--output_dir", tmp_path / "out",
    )  # fmt: skip
    results = json.loads((tmp_path / "out" / "decoding_cpu.json").read_text())
    rows = results["rows"]
    assert results["sentences"] == len(PAIRS)
    assert rows["vaswani, the paper's beam search (default)"]["bleu"] == pytest.approx(100.0)
    for quantized in ("int8", "bfloat16"):  # what it learnt, in int8 and bfloat16 too
        assert rows[f"vaswani {quantized}, the paper's beam search"]["chrf"] == pytest.approx(100.0), quantized
    assert rows["MarianMTModel, beam 4"]["bleu"] == pytest.approx(rows["vaswani, transformers' beam search"]["bleu"])
    assert rows["CTranslate2 float32, greedy"]["same_as_default"] == len(PAIRS)
    # Each engine alone: CTranslate2 timed in processes where torch never ran (no export, no other engine before it).
    ctranslate2_rows = [row for name, row in rows.items() if name.startswith("CTranslate2")]
    assert len(ctranslate2_rows) == 3 and all(row["torch_loaded"] is False for row in ctranslate2_rows)
    assert (
        rows["ONNX Runtime, greedy"]["same_as_default"] == len(PAIRS)
        and not rows["ONNX Runtime, greedy"]["torch_loaded"]
    )
    assert "| CTranslate2 int8, beam 4 |" in (tmp_path / "out" / "decoding_cpu.md").read_text()


# --- What the figures rest on, checked in one process from the checkout's root. ---

PROBE = """
import contextlib, copy, io, json, sys, time
from pathlib import Path
import torch
from torch.utils.flop_counter import FlopCounterMode
from accelerate import Accelerator
from benchmarks import benchmark, decoder_call, decoding_steps, gpu_report_measure, gpu_report_prepare
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.modeling.generation_vaswani import cpu_step_kernels
from vaswani.modeling.modeling_vaswani import shift_tokens_right
from vaswani.training import step

facts = {"train_step_is_the_recipes": benchmark.train_step is step.train_step}

# The MFU numerator: training_step_flops against torch's count of an eager forward + backward.
facts["flops"] = {}
for preset in ("tiny", "small"):
    config = VaswaniConfig.from_preset(preset, vocab_size=500, attn_implementation="eager")
    model = VaswaniForConditionalGeneration(config)
    source, target = torch.randint(4, 500, (3, 7)), torch.randint(4, 500, (3, 7))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=source, labels=target).loss.backward()
    facts["flops"][preset] = [benchmark.training_step_flops(config, 3, 7), counter.get_total_flops()]

# The training measurement's steps, recorded as they go into train_step: the weights, batches, random state and
# settings of each call; then its first step replayed by train_step itself on a copy of those weights.
calls = []
def recorded(accelerator, model, optimizer, scheduler, batches, *settings):
    weights = copy.deepcopy(accelerator.unwrap_model(model).state_dict())
    calls.append((weights, batches, torch.get_rng_state(), settings, scheduler))
    return step.train_step(accelerator, model, optimizer, scheduler, batches, *settings)

benchmark.train_step = recorded
args = benchmark.BenchmarkArguments(preset="tiny", batch_tokens=64, train_length=8, repeats=2, warmup=1)
args.baseline_rss = 0
torch.manual_seed(0)
measured = benchmark.measure_training(benchmark.build_model("vaswani", "tiny", 9), args, 8, 64)
weights, batches, rng, settings, scheduler = calls[0]
model = benchmark.build_model("vaswani", "tiny", 9)
model.load_state_dict(weights)
accelerator = Accelerator(cpu=True)
model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
torch.set_rng_state(rng)
replayed = step.train_step(accelerator, model, optimizer, None, batches, *settings)
(batch,) = batches
facts["training"] = {
    "calls": len(calls),
    "settings": list(settings),
    "scheduler": scheduler,
    "keys": sorted(batch),
    "decoder_input_ids_are_shifted_labels": bool(
        torch.equal(batch["decoder_input_ids"], shift_tokens_right(batch["labels"], 0, 1))
    ),
    "losses": measured["losses"],
    "replayed_loss": replayed.loss / replayed.target_tokens,
    "tokens": [measured["tokens"], replayed.tokens],
}

# The decoder's row-steps: 3 sentences held to 5 new tokens, greedy and in beams of 4; and CTranslate2's estimate.
model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=500)).eval()
facts["decoder_steps"] = []
for beams in (1, 4):
    steps = decoding_steps.DecoderSteps(model)
    model.generate(input_ids=torch.randint(4, 500, (3, 7)), num_beams=beams, max_new_tokens=5, min_new_tokens=5)
    facts["decoder_steps"].append(steps.counts())
# Its time in the model's calls: each call made 20 ms longer, the search between them as it is.
steps, started = decoding_steps.DecoderSteps(model), time.perf_counter()
slower = model.register_forward_pre_hook(lambda module, args: time.sleep(0.02))
model.generate(input_ids=torch.randint(4, 500, (3, 7)), num_beams=4, max_new_tokens=5, min_new_tokens=5)
facts["model_seconds"] = [steps.counts()["model_seconds"], time.perf_counter() - started]
slower.remove()
facts["estimated_steps"] = decoding_steps.estimated_steps([4, 2, 6], 2, {"beam_size": 4})

# benchmarks/decoder_call.py: a step's layers as one kernel call, as the searches run them, against their modules.
with torch.no_grad(), cpu_step_kernels(model, True):
    filled = decoder_call.FilledStep(model, 3, 4, 6)
    filled.rewind()
    by_modules = filled.model_call(layers_kernel=False)
    filled.rewind()
    with torch.profiler.profile() as profile:
        by_kernel = filled.model_call()
    filled.rewind()
    model.model.decoder.layers[-1].final_layer_norm.weight.mul_(2)  # a changed weight: both must see it
    changed = [filled.model_call(layers_kernel=False), filled.rewind(), filled.model_call()]
facts["decoder_call"] = {
    "same": torch.equal(by_kernel, by_modules),
    "same_after_change": torch.equal(changed[2], changed[0]),
    "change": (changed[0] - by_modules).abs().max().item(),
    "kernel_calls": sum(e.count for e in profile.key_averages() if e.key == "vaswani::decoder_layers_step"),
}

# The worker's flags stay out of --help.
shown = io.StringIO()
with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
    benchmark.main(["--help"])
facts["help"] = shown.getvalue()

# A section's budget: what runs past it, or fails, is reported as not measured.
Deadline, measured_in = gpu_report_measure.Deadline, gpu_report_measure.measured
def broken(left):
    raise ImportError("ctranslate2 is not installed here")
deadline = Deadline(60)
facts["budget"] = [
    measured_in(Deadline(0), lambda left: {"x": 1}, "spent"),
    measured_in(deadline, lambda left: {"x": left}, "in time"),
    measured_in(deadline, broken, "broken"),
]
facts["timings"] = sorted(deadline.timings)

# The GPU report's corpus, prepared from the dataset and tokenizer given, and its batches for the rows given.
data, tokenizer, carry, rows = *sys.argv[1:4], json.loads(sys.argv[4])
gpu_report_prepare.prepare_corpus(data, tokenizer, Path(carry) / "corpus")
pairs = gpu_report_prepare.CarriedPairs(carry + "/corpus/train.npz", 0, 1)
torch.save(pairs[rows], carry + "/batch.pt")
print(json.dumps(facts))
"""
ROWS = [0, 7, 42, 299]


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """PROBE's facts, and the corpus it prepared as `benchmarks.gpu_report_prepare` carries it to a GPU machine
    (from a tiny word-for-word corpus): one process from the checkout's root for all the default suite's checks."""
    root = tmp_path_factory.mktemp("carry")
    data = make_dataset(root / "data", {"train": 300, "validation": 10, "test": 20})
    tokenizer, carry = word_tokenizer(root / "tokenizer"), root / "carry"
    done = run_in_checkout("-c", PROBE, data, tokenizer, carry, json.dumps(ROWS))
    return json.loads(done.stdout.strip().splitlines()[-1]), data, carry


@pytest.fixture(scope="module")
def carried_corpus(probed):
    """The dataset and the folder `benchmarks.gpu_report_prepare` wrote from it (its corpus/)."""
    return probed[1:]


def test_model_flops_of_a_training_step_match_torch_flop_counter(probed):
    """The MFU numerator: the counted FLOPs of an eager forward + backward equal the formula exactly."""
    for preset, (formula, counted) in probed[0]["flops"].items():
        assert formula == counted, preset


def test_the_benchmarks_training_measurement_takes_the_recipes_step(probed):
    """`measure_training` times `vaswani.training.step.train_step` (label smoothing 0.1, no schedule) on a batch of
    the model's inputs, and the loss it reports is the one train_step gives for the same weights, batch and dropout."""
    facts = probed[0]
    training = facts["training"]
    assert facts["train_step_is_the_recipes"]
    assert training["calls"] == 3  # one warm-up and two timed steps, each one train_step
    assert training["settings"] == [0.1] and training["scheduler"] is None
    assert training["keys"] == ["attention_mask", "decoder_input_ids", "input_ids", "labels"]
    assert training["decoder_input_ids_are_shifted_labels"]
    assert len(training["losses"]) == 3 and training["losses"][0] == pytest.approx(training["replayed_loss"], rel=1e-6)
    assert training["tokens"] == [128, 128]  # 8 pairs of 8 source and 8 target tokens


def test_decoding_steps_counts_every_decoder_call_and_row_the_start_tokens_included(probed):
    """benchmarks/decoding_steps.py's counter: a call and a row per sentence and beam for each token, the first
    step's apart, and the time in the model's calls; CTranslate2's estimate from lengths: each sentence's length + 1
    steps on its beam's rows, a batch's calls those of its longest."""
    greedy, beam = probed[0]["decoder_steps"]
    assert {key: value for key, value in greedy.items() if key != "model_seconds"} == {
        "decoder_calls": 5, "row_steps": 15, "first_step_rows": 3
    }  # fmt: skip
    assert {key: value for key, value in beam.items() if key != "model_seconds"} == {
        "decoder_calls": 5, "row_steps": 60, "first_step_rows": 12
    }  # fmt: skip
    in_model, whole = probed[0]["model_seconds"]  # 5 calls of at least 20 ms each, within the whole generate()
    assert 5 * 0.02 <= in_model < whole
    estimated = {"decoder_calls": 5 + 7, "row_steps": 4 * (5 + 3 + 7), "first_step_rows": 12}
    assert probed[0]["estimated_steps"] == estimated


def test_a_decoder_call_by_the_layers_kernel_gives_the_layers_modules_logits(probed):
    """benchmarks/decoder_call.py times the model's own step both ways: the layers kernel runs (once a call) and gives
    the logits of the layers' modules bit for bit, and follows a change to a weight as they do."""
    facts = probed[0]["decoder_call"]
    assert facts["kernel_calls"] == 1 and facts["same"] and facts["same_after_change"]
    assert facts["change"] > 1e-3


def test_worker_flags_stay_out_of_the_benchmarks_help(probed):
    shown = probed[0]["help"]
    assert "--preset" in shown
    assert not any(flag in shown for flag in ("--implementation", "--sweep_point", "--measure"))


def test_a_measurement_past_the_budget_or_failing_is_reported_as_not_measured(probed):
    spent, in_time, failed = probed[0]["budget"]
    assert spent == {"not_measured": "its section's time ran out before it"}
    assert in_time["x"] > 50
    assert failed == {"not_measured": "it failed: ctranslate2 is not installed here"}
    assert probed[0]["timings"] == ["broken", "in time"]  # how long each took, failed or not, for the sizing


def test_the_gpu_reports_batches_are_the_collators(carried_corpus):
    """time_to_bleu batches the carried numpy pairs (`CarriedPairs`, over `vaswani.training.padding.pair_batch`):
    the same tensors as PairCollator gives train.py for the same pairs of the dataset."""
    from transformers import AutoTokenizer

    from vaswani.training.data import PairCollator, load_translation_dataset, tokenize_split

    data, carry = carried_corpus
    tokenizer = AutoTokenizer.from_pretrained(carry / "corpus" / "tokenizer")
    split = tokenize_split(load_translation_dataset(data, "en", "es")["train"], tokenizer, "en", "es")
    expected = PairCollator(tokenizer.pad_token_id, tokenizer.bos_token_id)(split.pairs.with_format("arrow")[ROWS])
    batch = torch.load(carry / "batch.pt")
    assert batch.keys() == expected.keys()
    for key in expected:
        assert torch.equal(batch[key], expected[key]), key


# --- The GPU report end to end, in quick mode, as the GPU machine runs it: its code runs here, its figures come from a
# GPU. ---


def machine_like_environment(folder, record):
    """A fresh virtual environment that stands in for the GPU machine's Python: torch (this one's version) and the
    packages the carry leaves to the machine or replaces there, at the machine's versions where the carry's
    requirements.json gives them (its older transformers among them, which the carried one must override), from the
    package index; the carry then installs offline."""
    versions = dict(record["machine_versions"])
    versions.pop("torch", None)
    if sys.version_info < (3, 12):
        versions["numpy"] = None  # the machine's numpy 2.5 is built for Python 3.12 and later
    pins = [f"{name}=={version}" if version else name for name, version in sorted(versions.items())]
    run_command([sys.executable, "-m", "venv", folder], check=True)
    python = folder / "bin" / "python"
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    run_command([python, "-m", "pip", "install", "--quiet", torch_pin, *pins], timeout=1800, check=True)
    return folder / "bin"


@pytest.mark.slow  # a fresh virtual environment, then every section of the report on tiny sizes: about 20 minutes
def test_the_carry_installs_offline_and_two_commands_write_every_section_and_the_page(carried_corpus, tmp_path):
    """`benchmarks.gpu_report_prepare` builds the carry, `bash CARRY/run.sh DIR --part 1|2 --device cpu --quick`
    run in an environment like the GPU machine's (no PYTHONPATH; the carry installs without an index) from start to
    end: every section of both parts writes its JSON, the page renders them all, and the report ran on the carried
    transformers, not the older one."""
    data, corpus = carried_corpus
    carry, output = tmp_path / "carry", tmp_path / "report"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    run_in_checkout(
        "-m", "benchmarks.gpu_report_prepare", "--dataset_dir", data, "--tokenizer", corpus / "corpus" / "tokenizer",
        "--carry_dir", carry, "--python_version", python_version,
    )  # fmt: skip
    record = json.loads((carry / "requirements.json").read_text())
    assert "transformers" in record["carried"] and not {"torch", "accelerate"} & set(record["carried"])
    wheels = sorted(path.name.split("-")[:2] for path in (carry / "wheels").iterdir())
    assert wheels == [[name.replace("-", "_"), version] for name, version in sorted(record["carried"].items())]
    assert Version(record["machine_versions"]["transformers"]) < Version(record["carried"]["transformers"])
    # What builds the checkout travels too: the stand-in keeps its venv's own setuptools, older than pyproject's floor.
    assert [path.name.split("-")[0] for path in (carry / "build").iterdir()] == ["setuptools"]
    bin_dir = machine_like_environment(tmp_path / "machine", record)
    env = {key: value for key, value in script_env().items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["TMPDIR"] = str(temporary := tmp_path / "tmp")
    temporary.mkdir()
    for part in ("1", "2"):  # the report's two commands
        command = ["bash", carry / "run.sh", output, "--part", part, "--device", "cpu", "--quick"]
        done = run_command(command, env=env, timeout=2700)
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        assert not list(temporary.glob("vaswani-gpu-report-*")), "run.sh left its installed wheels behind"

    sections = ["correctness", "generation", "training", "time_to_bleu", "compiled_training", "profile", "chunk_sweep"]
    results = {name: json.loads((output / f"{name}.json").read_text()) for name in sections}
    for result in results.values():
        assert result["complete"] and result["quick"] and result["timings"]
        assert result["environment"]["transformers"] == record["carried"]["transformers"]
    for name, compiled in (("training", False), ("compiled_training", True)):
        rows = results[name]["results"]["rows"]
        assert [(row["implementation"], row["compiled"]) for row in rows] == [
            ("vaswani", compiled),
            ("marian", compiled),
        ]
        assert all(0 < row["mfu"] < 1 and row["target_tokens_per_s"]["median"] > 0 for row in rows)
    generation = {(row["batch"], row["model"], row["engine"]): row for row in results["generation"]["results"]["rows"]}
    assert generation[(4, "vaswani", "static cache + compile")]["paper_beam4_tokens_per_s"]["median"] > 0
    for batch in (1, 4):  # every eager vaswani row has Marian's beside it
        assert generation[(batch, "vaswani", "eager")]["paper_beam4_tokens_per_s"]["median"] > 0
        assert generation[(batch, "marian", "eager")]["beam4_tokens_per_s"]["median"] > 0
    assert "not installed" in generation[(1, "vaswani", "CTranslate2 float32")]["not_measured"]
    correctness = results["correctness"]["results"]
    assert correctness["GPU tests (tests/test_gpu.py)"]["skip_reasons"] == ["needs a CUDA device"]
    bfloat16 = correctness["generation tests in bfloat16"]
    assert bfloat16["passed"] >= 3 and bfloat16["failed"] == 0
    bleu = results["time_to_bleu"]["results"]
    assert len(bleu["points"]) >= 2 and all(0 <= point["bleu"] <= 100 for point in bleu["points"])
    assert (
        bleu["points"][-1]["bleu"] > 0
    )  # the section measures something: the tiny model learns the word-for-word pairs
    assert bleu["taken_steps"] > 0 and bleu["warmup_steps"] == max(1, round(0.04 * bleu["planned_steps"]))
    for run in results["profile"]["results"]["runs"]:  # compiled, then eager: the loss told by the range it runs in
        assert sum(run["shares"].values()) == pytest.approx(1.0) and run["top"][0]["ms"] > 0
        assert "aten::sub" in [top["kernel"] for top in run["top"] if top["kind"] == "loss"]
    assert all(point["tokens_per_s"]["median"] > 0 for point in results["chunk_sweep"]["results"]["points"])

    page = (output / "gpu.md").read_text()
    assert page.startswith("# GPU report") and "Quick mode" in page and "cut off" not in page
    for heading in ("## Targets", *(f"## {name}" for name in sections)):
        assert heading in page
    assert sorted(path.name for path in output.glob("*.png")) == [
        "gpu_compiled_training.png", "gpu_generation.png", "gpu_time_to_bleu.png", "gpu_training.png"
    ]  # fmt: skip


@pytest.mark.benchmark
def test_learning_curves_train_each_variant_and_marian_and_report_them(carried_corpus, tmp_path):
    """benchmarks/learning_curves.py end to end on the tiny preset: a JSON per run, the table and the plot."""
    data, carry = carried_corpus
    tokenizer = carry / "corpus" / "tokenizer"
    command = ["-m", "benchmarks.learning_curves", "--dataset_dir", data, "--tokenizer", tokenizer]
    command += ["--output_dir", tmp_path, "--preset", "tiny", "--max_steps", "6", "--eval_steps", "3"]
    command += ["--batch_tokens", "400", "--warmup_steps", "2", "--bleu_samples", "5", "--report_steps", "3", "6"]
    run_in_checkout(*command, "--variants", "vaswani:fairseq", "vaswani:bart+bias", "marian")
    runs = {path.stem: json.loads(path.read_text()) for path in (tmp_path / "runs").glob("*.json")}
    assert sorted(runs) == ["marian-seed1", "vaswani-bart+bias-seed1", "vaswani-fairseq-seed1"]
    assert not list((tmp_path / "runs").glob("*.pt"))  # the resume states go once a run is done
    for run in runs.values():
        assert [point["step"] for point in run["curve"]] == [3, 6]
        assert run["curve"][1]["val_nll"] < run["curve"][0]["val_nll"] and 0 <= run["test_bleu"] <= 100
        assert all(point["val_nll_other_source"] != point["val_nll"] for point in run["curve"])
    table = (tmp_path / "learning_curves.md").read_text()
    assert "| vaswani:fairseq | 1 |" in table and "| marian | 1 |" in table and "val NLL @ 6" in table
    assert "| vaswani:bart+bias | 1 |" in table and "reads its source from step" in table
    # The biases of the query, key, value and output projections: 4 x d_model each, in 6 attention blocks of the tiny preset.
    assert runs["vaswani-bart+bias-seed1"]["parameters"] - runs["vaswani-fairseq-seed1"]["parameters"] == 6 * 4 * 64
    assert (tmp_path / "learning_curves.png").stat().st_size > 0


def test_a_paired_bias_run_differs_from_the_run_without_biases_by_the_biases_alone():
    """benchmarks.learning_curves' vaswani:SCHEME+bias-paired: from one seed, the same initial weights as vaswani:SCHEME
    (where vaswani:SCHEME+bias draws them anew) with the attention projections' biases at zero, and the same random
    state after it is built, so that its dropout masks are the other run's: the two compute the same training loss
    until the biases learn."""
    from benchmarks.learning_curves import build_model
    from vaswani import VaswaniConfig

    def built(variant):
        torch.manual_seed(3)
        model = build_model(variant, VaswaniConfig.from_preset("tiny", vocab_size=64))
        return model, torch.get_rng_state()

    without, state = built("vaswani:bart")
    paired, paired_state = built("vaswani:bart+bias-paired")
    seeded, _ = built("vaswani:bart+bias")
    weights, paired_weights = without.state_dict(), paired.state_dict()
    biases = sorted(set(paired_weights) - set(weights))
    assert len(biases) == 6 * 4 and all(name.endswith("proj.bias") for name in biases)
    assert all(torch.equal(paired_weights[name], weights[name]) for name in weights)
    assert all(not paired_weights[name].any() for name in biases) and torch.equal(paired_state, state)
    assert not torch.equal(seeded.state_dict()["model.shared.weight"], weights["model.shared.weight"])

    batch = {"input_ids": torch.randint(3, 64, (4, 9)), "decoder_input_ids": torch.randint(3, 64, (4, 7))}
    batch["labels"] = batch["decoder_input_ids"]
    losses = []
    for model in (without, paired):
        torch.manual_seed(0)  # the same dropout masks, as both runs' shared random state gives them
        model.train()
        losses.append(model(**batch).loss)
    assert torch.equal(losses[0], losses[1])
    losses[1].backward()
    assert all(paired.get_parameter(name).grad.abs().sum() > 0 for name in biases[:3])


def test_other_sources_pair_each_target_with_the_source_before_it():
    """benchmarks.learning_curves.other_sources: what the model predicts without its own source is measured on the
    same targets, each beside the previous pair's source and that source's padding."""
    from benchmarks.learning_curves import other_sources

    batch = {
        "input_ids": torch.tensor([[5, 6, 2], [7, 2, 0], [8, 9, 2]]),
        "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]]),
        "decoder_input_ids": torch.tensor([[1, 10], [1, 11], [1, 12]]),
        "labels": torch.tensor([[10, 2], [11, 2], [12, 2]]),
    }
    moved = other_sources(batch)
    assert moved["input_ids"].tolist() == [[8, 9, 2], [5, 6, 2], [7, 2, 0]]
    assert moved["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0]]
    assert moved["labels"] is batch["labels"] and moved["decoder_input_ids"] is batch["decoder_input_ids"]


def test_the_step_a_run_starts_to_read_its_source_is_the_first_its_source_is_worth_a_tenth_of_a_nat():
    """benchmarks.learning_curves.reads_source_from: the first evaluation at which the NLL beside other sources exceeds
    the true NLL by 0.1 nats or more; a run that never reads it, and one measured before the measure existed, say so."""
    from benchmarks.learning_curves import reads_source_from

    def run(*worth):
        return {
            "curve": [
                {"step": 50 * (i + 1), "val_nll": 5.0, "val_nll_other_source": 5.0 + w} for i, w in enumerate(worth)
            ]
        }

    assert reads_source_from(run(0.0, 0.04, 0.099, 0.15, 0.6, 0.05)) == "200"
    assert reads_source_from(run(0.0, 0.09)) == ">100"
    assert reads_source_from({"curve": [{"step": 50, "val_nll": 5.0}]}) == "n/a"


def test_a_redrawn_report_names_the_recipe_its_runs_trained_with(tmp_path, monkeypatch):
    """benchmarks.learning_curves.write_report under --report_only: the plot's title is the runs' batch and peak, not
    the defaults of the command that redraws it."""
    from types import SimpleNamespace

    import matplotlib.figure

    from benchmarks.learning_curves import write_report

    (tmp_path / "runs").mkdir()
    curve = [{"step": 50, "val_nll": 5.0, "val_nll_other_source": 5.2, "train_loss": 5.5}]
    settings = {"preset": "small", "batch_tokens": 4096, "peak_lr": 1.28e-3}
    run = {"variant": "marian", "seed": 1, "settings": settings, "curve": curve}
    (tmp_path / "runs" / "marian-seed1.json").write_text(json.dumps(run))
    titles = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda figure, *a, **k: titles.append(figure.axes[0].get_title())
    )
    table = write_report(
        SimpleNamespace(report_steps=[50], preset="tiny", batch_tokens=4000, peak_lr=1.3e-3), tmp_path
    )
    assert titles == ["small preset, 4096 tokens/step, peak lr 0.00128"]
    assert "| marian | 1 | 5.000 (5.000) | n/a | 50 |" in table


def test_a_study_stopped_while_it_writes_a_result_resumes_that_run(tmp_path, monkeypatch):
    """benchmarks.learning_curves.finish_run, killed half-way through writing a run's result (as a stopped job is, or
    read by another process of the study sharing runs/): no half-written result counts as finished, and the run's
    resume state is still there for the next start."""
    from pathlib import Path
    from types import SimpleNamespace

    from accelerate import Accelerator

    from benchmarks.learning_curves import finish_run

    run_path = tmp_path / "vaswani-fairseq-seed1.json"
    run_path.with_suffix(".pt").write_bytes(b"resume state")
    write_text = Path.write_text

    def stopped_half_way(path, text, *args, **kwargs):
        write_text(path, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", stopped_half_way)
    with pytest.raises(KeyboardInterrupt):
        finish_run(
            run_path,
            {"variant": "vaswani:fairseq", "curve": [1.0] * 100},
            SimpleNamespace(accelerator=Accelerator(cpu=True)),
        )
    monkeypatch.undo()
    assert not run_path.exists() and run_path.with_suffix(".pt").read_bytes() == b"resume state"
    finish_run(run_path, {"variant": "vaswani:fairseq"}, SimpleNamespace(accelerator=Accelerator(cpu=True)))
    assert (
        json.loads(run_path.read_text()) == {"variant": "vaswani:fairseq"} and not run_path.with_suffix(".pt").exists()
    )


@pytest.mark.benchmark
def test_preprocess_times_vaswani_and_fairseq_preprocess_on_the_same_tokens(fairseq_python, tmp_path):
    """benchmarks/preprocess.py: the same pairs through fairseq-preprocess (after the BPE text) and vaswani's first
    tokenization, with the same token counts, each step's figures and its page."""
    from vaswani.corpora.tokenizer import train_bpe_tokenizer

    corpus = make_dataset(tmp_path / "corpus", {"train": 300, "validation": 20, "test": 20})
    texts = [text for row in datasets.load_from_disk(str(corpus))["train"]["translation"] for text in row.values()]
    train_bpe_tokenizer(texts, vocab_size=300).save_pretrained(tmp_path / "tokenizer")
    run_in_checkout(
        "-m", "benchmarks.preprocess", "--corpus", corpus, "--tokenizer", tmp_path / "tokenizer",
        "--workdir", tmp_path / "work", "--fairseq_python", fairseq_python, "--output", tmp_path / "preprocess",
    )  # fmt: skip
    result = json.loads((tmp_path / "preprocess.json").read_text())
    assert result["train_source_tokens"]["fairseq"] == result["train_source_tokens"]["vaswani"] > 300
    assert result["train_sentences"] == {"fairseq": 300, "vaswani": 300}
    for step in ("bpe", "fairseq", "bpe + fairseq", "vaswani"):
        row = result["rows"][step]
        assert row["wall_seconds"] > 0 and row["peak_rss"] > 0 and row["pairs_per_second_per_worker"] > 0, step
    assert result["rows"]["fairseq"]["bytes"] > 0 and result["rows"]["vaswani"]["bytes"] > 0
    assert "| 3. vaswani's first tokenization (text to ids) |" in (tmp_path / "preprocess.md").read_text()


@pytest.mark.benchmark
def test_data_scale_measures_a_first_and_a_cached_start_on_a_corpus_copied_to_size(tmp_path):
    """benchmarks/data_scale.py memory: the corpus copied to N pairs (each copy's words shuffled), then per process
    count a first start of train.py (which tokenizes) and a cached one, each a row of the page."""
    from datasets import load_from_disk

    bible = make_dataset(tmp_path / "bible", {"train": 300, "validation": 20, "test": 20})
    run_in_checkout(
        "-m", "benchmarks.data_scale", "memory", "--dataset_dir", bible, "--workdir", tmp_path / "work",
        "--sizes", "700", "--processes", "1", "--results", tmp_path / "data_scale", timeout=1200,
    )  # fmt: skip
    copied = load_from_disk(str(tmp_path / "work" / "corpus_700"))["train"]
    assert copied.num_rows == 700 and len(set(copied["id"])) == 700
    entries = json.loads((tmp_path / "data_scale.json").read_text())["results"]
    assert [(e["mode"], e["rows"], e["processes"], e["cache"]) for e in entries] == [
        ("memory", 700, 1, "first run"),
        ("memory", 700, 1, "cached"),
    ]
    for entry in entries:
        assert entry["status"] == "ok" and entry["peak_rss_anon_per_process"] > 0 and entry["tokens_per_sec"] > 0
    assert entries[0]["cache_files_before"] == 0 < entries[1]["cache_files_before"]
    page = (tmp_path / "data_scale.md").read_text()
    assert "| 700 | 1 | first run |" in page and "| 700 | 1 | cached |" in page


@pytest.mark.benchmark
def test_data_scale_follows_a_user_from_the_hubs_layout_to_the_first_step(tmp_path):
    """benchmarks/data_scale.py pipeline: corpus_N as Parquet shards in a configuration folder, prepare_data.py,
    train_tokenizer.py on a sample, and a first and a cached start of two training processes, with their page."""
    bible = make_dataset(tmp_path / "bible", {"train": 300, "validation": 20, "test": 20})
    run_in_checkout(
        "-m", "benchmarks.data_scale", "pipeline", "--dataset_dir", bible, "--workdir", tmp_path / "work",
        "--sizes", "2000", "--results", tmp_path / "data_scale", timeout=1200,
    )  # fmt: skip
    assert sorted(path.name for path in (tmp_path / "work" / "hub_2000" / "en-es").iterdir()) == [
        "test-00000-of-00001.parquet",
        "train-00000-of-00001.parquet",
        "validation-00000-of-00001.parquet",
    ]
    steps = {entry["cache"]: entry for entry in json.loads((tmp_path / "data_scale.json").read_text())["results"]}
    assert sorted(steps) == ["cached", "first run", "prepare_data", "train_tokenizer"]
    assert all(entry["bytes"] > 0 for entry in steps.values())
    assert steps["first run"]["status"] == steps["cached"]["status"] == "ok"
    assert steps["first run"]["cache_files_before"] == 0 < steps["cached"]["cache_files_before"]
    assert len(steps["first run"]["training_processes"]) == 2
    page = (tmp_path / "data_scale.md").read_text()
    assert "## A user's path at 2,000 pairs" in page and "The first tokenization:" in page
