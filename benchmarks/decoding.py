"""Decoding speed of a trained model next to its peers, on the same test sentences, in one run.

    python -m benchmarks.decoding --model outputs/main_job/model --dataset_dir outputs/main_job/data
                                  [--samples 200] [--batch_size 32] [--threads 2] [--rounds 2] [--profile]
                                  [--output_dir docs/benchmarks]

Run from the root of a checkout, with the package and its `test` extra installed (benchmarks/README.md).

The first --samples sentences of the test split are translated the way `vaswani-evaluate` translates them
(`vaswani.training.evaluation.translations`: batches of --batch_size sentences of similar length, longest first),
by each engine in turn, --rounds times in alternating order; each row gives the fastest round:
- vaswani: the paper's beam search (the default decoding), transformers' beam search (`paper_decoding=False`),
  greedy decoding;
- `MarianMTModel` holding the same weights (its attention biases and final-logits bias zero, its positional table
  the model's interleaved one), decoded by transformers' `generate()` as Marian users do: beam 4 and greedy;
- CTranslate2, where it is installed: the model exported by `vaswani.training.export`, float32 and int8, beam 4 and
  greedy, in the same batches.
Beam searches use 4 beams and length penalty 0.6. Each row says how many sentences translate as the default decoding
does, and the BLEU of the engine's translations. `--profile` adds where the time of one decoding of the sentences
goes for each of vaswani's decodings (torch's profiler, the model's parts marked by module hooks). The tables are
printed and written as `decoding_<device>.{json,md}` in --output_dir.
"""

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from vaswani.training.cli import command, parse_arguments


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


def engines(args, model, tokenizer) -> dict:
    """Name -> function translating a list of sentences into a list of translations, in order."""
    from vaswani.training.evaluation import translate

    table = {
        name: (lambda sentences, options=options: translate(model, tokenizer, sentences, **options))
        for name, options in VASWANI_DECODINGS.items()
    }
    marian = marian_twin(model)
    for name, options in (("beam 4", BEAM), ("greedy", GREEDY)):
        table[f"MarianMTModel, {name}"] = lambda sentences, options=options: marian_translate(
            marian, tokenizer, sentences, args.batch_size, options
        )
    if args.no_ctranslate2:
        return table
    try:
        import ctranslate2
    except ImportError:
        return table
    import tempfile

    from vaswani.training.export import export

    for quantization in ("float32", "int8"):
        folder = tempfile.mkdtemp(prefix=f"ct2-{quantization}-")
        export(model, folder, tokenizer=tokenizer, quantization=quantization)
        translator = ctranslate2.Translator(folder, device="cpu", intra_threads=args.threads)
        for name, beam in (("beam 4", 4), ("greedy", 1)):
            if quantization == "int8" and beam == 1:
                continue
            table[f"CTranslate2 {quantization}, {name}"] = lambda sentences, translator=translator, beam=beam: (
                ctranslate2_translate(translator, tokenizer, sentences, args.batch_size, beam)
            )
    return table


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
    """Seconds of one decoding, and the share of each part: the model's parts (PARTS, by module hooks), then the
    torch operators run outside them (log-softmax, cache reordering, the beam's bookkeeping), and what remains:
    Python between the operators."""
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
    shares = {name: events_total(events, name) / total_us for name in PARTS}
    inside = sum(shares.values())
    ops = {
        "log-softmax": ("aten::log_softmax", "aten::_log_softmax"),
        "cache reordering and selection": ("aten::index_select",),
        "top-k": ("aten::topk",),
    }
    for label, names in ops.items():
        shares[label] = sum(outside_self_time(events, op) for op in names) / total_us
    all_ops = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::")) / total_us
    shares["other operators (beam bookkeeping, masks, length limit)"] = max(
        0.0, all_ops - inside - sum(shares[label] for label in ops)
    )
    shares["Python between operators"] = max(0.0, 1.0 - all_ops)
    return {"seconds": seconds, "shares": shares}


def events_total(events, key) -> float:
    return sum(event.cpu_time_total for event in events if event.key == key)


def outside_self_time(events, op) -> float:
    """An operator's self time; the model's parts call no log-softmax, top-k or index_select, so it is all outside."""
    return sum(event.self_cpu_time_total for event in events if event.key == op)


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


@command
def main(argv=None) -> dict:
    (args,) = parse_arguments([DecodingBenchmarkArguments], argv, description=__doc__.split("\n\n")[0])
    import platform

    from vaswani.training.evaluation import corpus_bleu, load_pairs, load_translation_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_translation_model(args.model, device="cpu")
    sources, references, _ = load_pairs(args.dataset_dir, "test", args.source_lang, args.target_lang, args.samples)
    sentences, references = sources.to_pylist(), references.to_pylist()
    table = engines(args, model, tokenizer)
    times, outputs = {name: [] for name in table}, {}
    for round_ in range(args.rounds):
        for name in table if round_ % 2 == 0 else reversed(table):
            start = time.perf_counter()
            with torch.inference_mode():
                outputs[name] = table[name](sentences)
            times[name].append(time.perf_counter() - start)
            print(f"round {round_ + 1}: {name}: {times[name][-1]:.2f} s", flush=True)
    default = outputs[next(iter(VASWANI_DECODINGS))]
    results = {
        "when": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} CPU, torch {torch.__version__}",
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
                "bleu": corpus_bleu(outputs[name], references)[0].score,
            }
            for name in table
        },
    }
    if args.profile:
        results["profile"] = {}
        for name in VASWANI_DECODINGS:
            with torch.inference_mode():
                results["profile"][name] = profile(model, table[name], sentences)
    page = markdown(results)
    print(page)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "decoding_cpu.json").write_text(json.dumps(results, indent=1) + "\n")
    (output_dir / "decoding_cpu.md").write_text(page)
    return results


if __name__ == "__main__":
    main()
