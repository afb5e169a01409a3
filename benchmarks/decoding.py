"""Decoding speed of a trained model next to its peers, on the same test sentences, in one run.

    python -m benchmarks.decoding --model outputs/main_job/model --dataset_dir outputs/main_job/data
                                  [--samples 200] [--batch_size 32] [--threads 2] [--rounds 2] [--profile]
                                  [--output_dir docs/benchmarks]

Run from the root of a checkout, with the package and its `test` extra installed (benchmarks/README.md).

The first --samples sentences of the test split are translated the way `vaswani-evaluate` translates them
(`vaswani.evaluation.bleu.translations`: batches of --batch_size sentences of similar length, longest first),
by each engine in turn, --rounds times in alternating order; each row gives the fastest round:
- vaswani: the paper's beam search (the default decoding), transformers' beam search (`paper_decoding=False`),
  greedy decoding;
- `MarianMTModel` holding the same weights (its attention biases and final-logits bias zero, its positional table
  the model's interleaved one), decoded by transformers' `generate()` as Marian users do: beam 4 and greedy;
- CTranslate2, where it is installed: the model exported by `vaswani.export.ctranslate2`, float32 and int8, beam 4 and
  greedy, in the same batches.
Beam searches use 4 beams and length penalty 0.6. Each row says how many sentences translate as the default decoding
does, and the BLEU of the engine's translations. `--profile` adds where the time of one decoding of the sentences
goes for each of vaswani's decodings (torch's profiler, the model's parts marked by module hooks). The tables are
printed and written as `decoding_<device>.{json,md}` in --output_dir.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from vaswani.cli import command, parse_arguments


BEAM = {"num_beams": 4, "length_penalty": 0.6}
GREEDY = {"num_beams": 1}
VASWANI_DECODINGS = {
    "vaswani, the paper's beam search (default)": BEAM,
    "vaswani, transformers' beam search": {**BEAM, "paper_decoding": False},
    "vaswani, greedy": GREEDY,
}


def marian_twin(model):
    """`MarianMTModel` computing what `model` computes: the same weights, zero attention and final-logits biases,
    and the model's own (interleaved) sinusoidal table in place of Marian's (sines and cosines in two halves)."""
    from transformers import MarianMTModel

    from benchmarks.benchmark import marian_config

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
    profile: bool = field(default=False, metadata={"help": "also profile one decoding of each of vaswani's decodings"})
    no_ctranslate2: bool = field(default=False, metadata={"help": "leave out the CTranslate2 rows"})
    output_dir: str = "docs/benchmarks"
    engine: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})  # a measuring process's one engine


def engine_names(args) -> list[str]:
    """The engines measured: vaswani's decodings, Marian's, and CTranslate2's where it is installed."""
    names = [*VASWANI_DECODINGS, "MarianMTModel, beam 4", "MarianMTModel, greedy"]
    if args.no_ctranslate2 or importlib.util.find_spec("ctranslate2") is None:
        return names
    return [*names, "CTranslate2 float32, beam 4", "CTranslate2 float32, greedy", "CTranslate2 int8, beam 4"]


def engine(name: str, args, model, tokenizer):
    """The function that translates a list of sentences into a list of translations, in order, as `name` does."""
    from vaswani.evaluation.bleu import translate

    options = BEAM if name.endswith("beam 4") else GREEDY
    if name in VASWANI_DECODINGS:
        return lambda sentences: translate(model, tokenizer, sentences, **VASWANI_DECODINGS[name])
    if name.startswith("MarianMTModel"):
        marian = marian_twin(model)
        return lambda sentences: marian_translate(marian, tokenizer, sentences, args.batch_size, options)
    import tempfile

    import ctranslate2

    from vaswani.export.ctranslate2 import export

    folder = tempfile.mkdtemp(prefix="ct2-")
    export(model, folder, tokenizer=tokenizer, quantization=name.split()[1].rstrip(","))
    translator = ctranslate2.Translator(folder, device="cpu", intra_threads=args.threads)
    return lambda sentences: ctranslate2_translate(
        translator, tokenizer, sentences, args.batch_size, options["num_beams"]
    )


def batches(sentences: list[str], batch_size: int):
    """The batches `translations` decodes: indices of sentences of similar length, longest (in characters) first."""
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def marian_translate(marian, tokenizer, sentences, batch_size, options):
    """`MarianMTModel.generate` in the same batches, limited as transformers' beam search of vaswani is: the padded
    source length + 50 (section 6.1; Marian's default limit is 20 tokens)."""
    from vaswani.modeling.pipeline_vaswani import translate_batch

    answers = [None] * len(sentences)
    for chunk in batches(sentences, batch_size):
        texts = [sentences[i] for i in chunk]
        longest = max(len(ids) for ids in tokenizer(texts).input_ids)
        translated = translate_batch(marian, tokenizer, texts, max_new_tokens=longest + 50, **options)
        for i, hypotheses in zip(chunk, translated):
            answers[i] = hypotheses[0]["translation_text"]
    return answers


def ctranslate2_translate(translator, tokenizer, sentences, batch_size, beam_size):
    """CTranslate2 in the same batches, limited alike (the padded source length + 50), length penalty 0.6."""
    answers = [None] * len(sentences)
    for chunk in batches(sentences, batch_size):
        ids = tokenizer([sentences[i] for i in chunk]).input_ids
        tokens = [tokenizer.convert_ids_to_tokens(row) for row in ids]
        results = translator.translate_batch(
            tokens, beam_size=beam_size, length_penalty=0.6, max_decoding_length=max(map(len, ids)) + 50
        )
        for i, result in zip(chunk, results):
            ids = tokenizer.convert_tokens_to_ids(result.hypotheses[0])
            answers[i] = tokenizer.decode(ids, skip_special_tokens=True).strip()
    return answers


PARTS = {  # profiler range -> the module of the model it times
    "encoder": lambda m: [m.model.encoder],
    "decoder self-attention": lambda m: [layer.self_attn for layer in m.model.decoder.layers],
    "encoder-decoder attention": lambda m: [layer.encoder_attn for layer in m.model.decoder.layers],
    "decoder feed-forward": lambda m: [layer.feed_forward for layer in m.model.decoder.layers],
    "decoder Add & Norm": lambda m: [
        norm
        for layer in m.model.decoder.layers
        for norm in (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm)
    ],
    "output projection": lambda m: [m.lm_head],
}


def profile(model, decode, sentences) -> dict:
    """Seconds of one decoding under torch's profiler, and the share of each part: the model's parts (PARTS, marked
    by module hooks, Python inside them included), the operators the search runs outside the model (log-softmax,
    cache reordering and selection, top-k), and the rest: the search's other operators and Python between them
    (`generate()`'s set-up, the length limit, masks, the bookkeeping of hypotheses)."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    hooks, open_ranges = [], []
    for name, modules in PARTS.items():
        for module in modules(model):

            def enter(module, args, name=name):
                open_ranges.append(record_function(name).__enter__())

            def leave(module, args, output):
                open_ranges.pop().__exit__(None, None, None)

            hooks += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            decode(sentences)
            seconds = time.perf_counter() - start
    finally:
        for hook in hooks:
            hook.remove()
    events = prof.key_averages()
    total_us = seconds * 1e6
    shares = {name: sum(e.cpu_time_total for e in events if e.key == name) / total_us for name in PARTS}
    # The model's parts call no log-softmax, top-k or index_select: their time is all the search's.
    outside = {
        "log-softmax": ("aten::log_softmax", "aten::_log_softmax"),
        "cache reordering and selection": ("aten::index_select",),
        "top-k": ("aten::topk",),
    }
    for label, names in outside.items():
        shares[label] = sum(e.self_cpu_time_total for e in events if e.key in names) / total_us
    shares["the rest: the search's other operators and Python"] = max(0.0, 1.0 - sum(shares.values()))
    return {"seconds": seconds, "shares": shares}


def markdown(results: dict) -> str:
    rows = results["rows"]
    reference = rows.get("CTranslate2 float32, beam 4", {}).get("seconds")
    greedy_reference = rows.get("CTranslate2 float32, greedy", {}).get("seconds")
    lines = [
        f"Decoding {results['sentences']} test sentences, batches of {results['batch_size']}, "
        f"{results['threads']} threads, fastest of {results['rounds']} alternating rounds; {results['when']}, "
        f"{results['machine']}.",
        "",
        "| engine | seconds | x CTranslate2 float32 (same search) | same translation as the default | BLEU |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        peer = greedy_reference if name.endswith("greedy") else reference
        ratio = f"{row['seconds'] / peer:.2f}x" if peer else ""
        lines.append(
            f"| {name} | {row['seconds']:.2f} | {ratio} | {row['same_as_default']} of {results['sentences']} "
            f"| {row['bleu']:.2f} |"
        )
    for name, profiled in results.get("profile", {}).items():
        lines += ["", f"Where one decoding's {profiled['seconds']:.2f} s go, {name}:", "", "| part | share |"]
        lines.append("| --- | --- |")
        lines += [f"| {part} | {share:.0%} |" for part, share in profiled["shares"].items()]
    return "\n".join(lines) + "\n"


def measure_once(args, name: str) -> dict:
    """One decoding of the sentences by `name`, in a process of its own: CTranslate2's threads, and the memory each
    engine leaves behind, never slow another engine down."""
    settings = {key: value for key, value in asdict(args).items() if key not in ("engine", "profile")}
    forwarded = [f"--{key}={value}" for key, value in settings.items() if not isinstance(value, bool)]
    forwarded += [f"--{key}" for key, value in settings.items() if value is True]
    command_line = [sys.executable, "-m", "benchmarks.decoding", *forwarded, "--engine", name]
    finished = subprocess.run(
        command_line, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent
    )
    return json.loads(finished.stdout.strip().splitlines()[-1])


def load(args):
    from vaswani.evaluation.bleu import load_pairs, load_translation_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_translation_model(args.model, device="cpu")
    sources, references, _ = load_pairs(args.dataset_dir, "test", args.source_lang, args.target_lang, args.samples)
    return model, tokenizer, sources.to_pylist(), references.to_pylist()


@command
def main(argv=None) -> dict:
    (args,) = parse_arguments([DecodingBenchmarkArguments], argv, description=__doc__.split("\n\n")[0])
    model, tokenizer, sentences, references = load(args)
    if args.engine:
        translate = engine(args.engine, args, model, tokenizer)
        start = time.perf_counter()
        with torch.inference_mode():
            translations = translate(sentences)
        print(json.dumps({"seconds": time.perf_counter() - start, "translations": translations}))
        return {}
    import platform

    from vaswani.evaluation.bleu import corpus_bleu

    names = engine_names(args)
    times, outputs = {name: [] for name in names}, {}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            measured = measure_once(args, name)
            times[name].append(measured["seconds"])
            outputs[name] = measured["translations"]
            print(f"round {round_ + 1}: {name}: {times[name][-1]:.2f} s", flush=True)
    default = outputs[next(iter(VASWANI_DECODINGS))]
    results = {
        "when": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} CPU, torch {torch.__version__}"
        + (f", OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}" if "OMP_WAIT_POLICY" in os.environ else ""),
        "sentences": len(sentences),
        "batch_size": args.batch_size,
        "threads": args.threads,
        "rounds": args.rounds,
        "arguments": asdict(args),
        "rows": {
            name: {
                "seconds": min(times[name]),
                "times": times[name],
                "same_as_default": sum(a == b for a, b in zip(outputs[name], default)),
                "differing_sentences": [i for i, (a, b) in enumerate(zip(outputs[name], default)) if a != b],
                "bleu": corpus_bleu(outputs[name], references)[0].score,
            }
            for name in names
        },
    }
    if args.profile:
        results["profile"] = {}
        for name in VASWANI_DECODINGS:
            with torch.inference_mode():
                results["profile"][name] = profile(model, engine(name, args, model, tokenizer), sentences)
    page = markdown(results)
    print(page)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "decoding_cpu.json").write_text(json.dumps(results, indent=1) + "\n")
    (output_dir / "decoding_cpu.md").write_text(page)
    return results


if __name__ == "__main__":
    main()
