"""Decoding speed of a trained model next to its peers, on the same test sentences, in one run.

    python -m benchmarks.decoding --model outputs/main_job/model --dataset_dir outputs/main_job/data
                                  [--samples 200] [--batch_size 32] [--threads 2] [--rounds 2]
                                  [--output_dir docs/benchmarks]

Writes `decoding_cpu.{json,md}` in --output_dir: the time of vaswani's three decodings in float32, two in int8 and
two in bfloat16, `MarianMTModel` holding the same weights, CTranslate2 float32 and int8 and ONNX Runtime where
installed, on the first --samples test sentences; how many translations equal the default decoding's, their BLEU and
chrF. How it measures: docs/benchmarks/README.md.
"""

import argparse
import importlib.util
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import MarianMTModel

from benchmarks import harness
from benchmarks.benchmark import marian_config
from benchmarks.ctranslate2_timing import batches
from vaswani.cli import command, parse_arguments
from vaswani.evaluation.bleu import corpus_bleu, corpus_chrf, load_pairs, load_translation_model, translate
from vaswani.modeling.pipeline_vaswani import translate_batch


BEAM = {"num_beams": 4, "length_penalty": 0.6}
GREEDY = {"num_beams": 1}
VASWANI_DECODINGS = {
    "vaswani, the paper's beam search (default)": BEAM,
    "vaswani, transformers' beam search": {**BEAM, "paper_decoding": False},
    "vaswani, greedy": GREEDY,
    "vaswani int8, the paper's beam search": {**BEAM, "int8": True},
    "vaswani int8, greedy": {**GREEDY, "int8": True},
    "vaswani bfloat16, the paper's beam search": {**BEAM, "dtype": "bfloat16"},
    "vaswani bfloat16, greedy": {**GREEDY, "dtype": "bfloat16"},
}


def marian_twin(model):
    """`MarianMTModel` computing what `model` computes: the same weights, zero attention and final-logits biases,
    and the model's own (interleaved) sinusoidal table in place of Marian's (sines and cosines in two halves)."""
    marian = MarianMTModel(marian_config(model.config)).eval()
    weights = {
        key.replace("feed_forward.", ""): value
        for key, value in model.state_dict().items()
        if not key.startswith("lm_head") or not model.config.tie_word_embeddings
    }
    missing, unexpected = marian.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected
    tensors = marian.state_dict(keep_vars=True)
    with torch.no_grad():
        for name in missing:
            parameter = tensors[name]
            if name.endswith("embed_positions.weight"):
                positions = torch.arange(parameter.shape[0])
                parameter.copy_(model.model.encoder.embed_positions(positions, parameter.dtype))
            elif name.endswith("bias"):
                parameter.zero_()
            elif name != "lm_head.weight":
                raise AssertionError(f"{name} has no counterpart in the model")
    marian.tie_weights()
    return marian


@dataclass
class DecodingBenchmarkArguments:
    model: str = field(metadata={"help": "a trained model folder (scripts/main_job.sh leaves outputs/main_job/model)"})
    dataset_dir: str = field(metadata={"help": "the dataset folder whose test split is translated"})
    source_lang: str = "en"
    target_lang: str = "es"
    samples: int = field(default=200, metadata={"help": "the first N test sentences"})
    batch_size: int = 32
    threads: int = field(default=2, metadata={"help": "torch's and CTranslate2's threads"})
    rounds: int = field(default=2, metadata={"help": "timed rounds, engines alternating; each row's fastest"})
    output_dir: str = "docs/benchmarks"
    engine: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})  # a measuring process's one engine


ONNX = "ONNX Runtime, greedy"
# The export, in a process of its own; then each timing in a process that loads the export's translate.py alone.
ONNX_EXPORT = """import sys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
import vaswani.export.onnx
model_dir, output_dir = sys.argv[1:]
model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
vaswani.export.onnx.export(model, tokenizer, output_dir)
print("{}")"""
ONNX_TIMING = """import importlib.util, json, sys, time
folder, job = sys.argv[1], json.load(open(sys.argv[2]))
spec = importlib.util.spec_from_file_location("onnx_translate", folder + "/translate.py")
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)
translator = runner.OnnxTranslator(folder, job["threads"])
start = time.perf_counter()
translations = translator.translate(job["sentences"], job["batch_size"])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "translations": translations, "torch_loaded": "torch" in sys.modules}))"""


def engine_names() -> list[str]:
    """The engines measured: vaswani's decodings, Marian's, and CTranslate2's and ONNX Runtime's where installed."""
    names = [*VASWANI_DECODINGS, "MarianMTModel, beam 4", "MarianMTModel, greedy"]
    if importlib.util.find_spec("ctranslate2") is not None:
        names += ["CTranslate2 float32, beam 4", "CTranslate2 float32, greedy", "CTranslate2 int8, beam 4"]
    if importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnxscript") is not None:
        names.append(ONNX)
    return names


def engine(name: str, args, model, tokenizer):
    """The function that translates a list of sentences into a list of translations, in order, as `name` does
    (vaswani's decodings and Marian's; CTranslate2's run in `benchmarks.ctranslate2_timing`)."""
    from vaswani.evaluation.bleu import int8_linear_layers

    if name in VASWANI_DECODINGS:
        options = {"batch_size": args.batch_size, **VASWANI_DECODINGS[name]}
        if options.pop("int8", False):
            model = int8_linear_layers(model)
        elif "dtype" in options:  # as `--dtype` loads it
            model = model.to(getattr(torch, options.pop("dtype")))
        return lambda sentences: translate(model, tokenizer, sentences, **options)
    marian = marian_twin(model)
    options = BEAM if name.endswith("beam 4") else GREEDY
    return lambda sentences: marian_translate(marian, tokenizer, sentences, args.batch_size, options)


def marian_translate(marian, tokenizer, sentences, batch_size, options):
    """`MarianMTModel.generate` in the same batches, limited as transformers' beam search of vaswani is: the padded
    source length + 50 (section 6.1; Marian's default limit is 20 tokens)."""
    answers = [None] * len(sentences)
    for chunk in batches(sentences, batch_size):
        texts = [sentences[i] for i in chunk]
        longest = max(len(ids) for ids in tokenizer(texts).input_ids)
        translated = translate_batch(marian, tokenizer, texts, max_new_tokens=longest + 50, **options)
        for i, hypotheses in zip(chunk, translated):
            answers[i] = hypotheses[0]["translation_text"]
    return answers


def markdown(results: dict) -> str:
    rows, sentences = results["rows"], results["sentences"]
    reference = rows.get("CTranslate2 float32, beam 4", {}).get("seconds")
    greedy_reference = rows.get("CTranslate2 float32, greedy", {}).get("seconds")
    cells = []
    for name, row in rows.items():
        peer = greedy_reference if name.endswith("greedy") else reference
        ratio = f"{row['seconds'] / peer:.2f}x" if peer else ""
        same = f"{row['same_as_default']} of {sentences}"
        cells.append([name, f"{row['seconds']:.2f}", ratio, same, f"{row['bleu']:.2f}", f"{row['chrf']:.2f}"])
    header = ["engine", "seconds", "x CTranslate2 float32 (same search)", "same translation as the default"]
    header += ["BLEU", "chrF"]
    return (
        f"Decoding {sentences} test sentences, batches of {results['batch_size']}, {results['threads']} threads, "
        f"fastest of {results['rounds']} alternating rounds; {harness.describe(results)}{results['conditions']}. "
        "Each engine alone: every decoding in a fresh process, the CTranslate2 model exported beforehand in another, "
        f"CTranslate2 timed in processes where torch was never loaded.\n\n{harness.table(header, cells)}\n"
    )


def ctranslate2_job(name: str, model: str, export: Path, sentences: list[str], batch_size: int, threads: int) -> dict:
    """The `benchmarks.ctranslate2_timing` job that decodes the sentences once as CTranslate2's row `name` does, in
    the batches vaswani decodes, to the same limit (the longest source + 50 tokens)."""
    decoding = {"name": name, "beam_size": 4 if name.endswith("beam 4") else 1, "length_penalty": 0.6}
    job = {"model_dir": str(export), "tokenizer": str(Path(model) / "tokenizer.json")}
    job |= {"device": "cpu", "threads": threads, "decodings": [decoding], "extra_length": 50}
    job |= {"batches": [[sentences[i] for i in batch] for batch in batches(sentences, batch_size)]}
    return job | {"warmup": 0, "repeats": 1}


def measure_once(args, name: str, sentences: list[str], tokenizer, exports: dict[str, Path]) -> dict:
    """One decoding of the sentences by `name`, in a fresh process: vaswani's and Marian's in this module's own
    (`--engine`), CTranslate2's in `benchmarks.ctranslate2_timing`, which imports no torch."""
    if name == ONNX:
        job = Path(exports["onnx"]).parent / "onnx_job.json"
        job.write_text(json.dumps({"threads": args.threads, "batch_size": args.batch_size, "sentences": sentences}))
        return harness.run_json(["-c", ONNX_TIMING, exports["onnx"], job])
    if not name.startswith("CTranslate2"):
        forwarded = [f"--{key}={value}" for key, value in asdict(args).items() if key != "engine"]
        return harness.run_json(["-m", "benchmarks.decoding", *forwarded, "--engine", name])
    quantization, order = name.split()[1].rstrip(","), batches(sentences, args.batch_size)
    job = ctranslate2_job(name, args.model, exports[quantization], sentences, args.batch_size, args.threads)
    measured = harness.time_ctranslate2(job, exports[quantization].parent)
    # Back in the order of the sentences, from the order of the batches, detokenized as vaswani's translations are
    # (transformers' tokenizer), so that translations are compared, not two detokenizers.
    translations = [None] * len(sentences)
    for i, tokens in zip([i for batch in order for i in batch], measured["decodings"][name]["tokens"]):
        translations[i] = tokenizer.decode(tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True).strip()
    seconds = measured["decodings"][name]["times"][0]
    return {"seconds": seconds, "translations": translations, "torch_loaded": measured["torch_loaded"]}


@command
def main(argv=None) -> dict:
    (args,) = parse_arguments([DecodingBenchmarkArguments], argv, description=__doc__.split("\n\n")[0])
    torch.set_num_threads(args.threads)
    model, tokenizer = load_translation_model(args.model, device="cpu")
    sources, references, _, _ = load_pairs(args.dataset_dir, "test", args.source_lang, args.target_lang, args.samples)
    sentences, references = sources.to_pylist(), references.to_pylist()
    if args.engine:
        decode = engine(args.engine, args, model, tokenizer)
        start = time.perf_counter()
        with torch.inference_mode():
            translations = decode(sentences)
        print(json.dumps({"seconds": time.perf_counter() - start, "translations": translations}))
        return {}
    names = engine_names()
    with tempfile.TemporaryDirectory(prefix="decoding-") as folder:
        exports = {}
        if any("CTranslate2" in name for name in names):
            exports = {q: harness.export_ctranslate2(args.model, Path(folder) / q, q) for q in ("float32", "int8")}
        if ONNX in names:
            exports["onnx"] = Path(folder) / "onnx"
            harness.run_json(["-c", ONNX_EXPORT, args.model, exports["onnx"]])

        def measure(name, index):
            measured = measure_once(args, name, sentences, tokenizer, exports)
            print(f"round {index + 1}: {name}: {measured['seconds']:.2f} s", flush=True)
            return measured

        rounds = harness.alternating_rounds(names, args.rounds, measure)
    default = rounds[next(iter(VASWANI_DECODINGS))][-1]["translations"]
    conditions = f", OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}" if "OMP_WAIT_POLICY" in os.environ else ""
    results = {**harness.environment("torch", "transformers"), "conditions": conditions, "sentences": len(sentences)}
    results |= {"batch_size": args.batch_size, "threads": args.threads, "rounds": args.rounds}
    results |= {"arguments": asdict(args), "rows": {}}
    for name, measured in rounds.items():
        times, outputs = [m["seconds"] for m in measured], measured[-1]["translations"]
        differing = [i for i, (ours, theirs) in enumerate(zip(outputs, default)) if ours != theirs]
        row = {"seconds": min(times), "times": times, "same_as_default": len(default) - len(differing)}
        row |= {"differing_sentences": differing, "bleu": corpus_bleu(outputs, references)[0].score}
        row["chrf"] = corpus_chrf(outputs, references)[0].score
        if "torch_loaded" in measured[0]:
            row["torch_loaded"] = any(m["torch_loaded"] for m in measured)
        results["rows"][name] = row
    harness.write_page(Path(args.output_dir) / "decoding_cpu", results, markdown(results))
    return results


if __name__ == "__main__":
    main()
