"""Translate a dataset split with a trained model and score it with sacreBLEU (section 6.1 of the paper).

The paper decodes with beam search, beam size 4, the length penalty of Wu et al. (2016) with alpha = 0.6, and lets
each output run to its input's length + 50 tokens; that is the default here (--paper_decoding false gives
transformers' beam search, whose length penalty divides by |Y|^alpha). The score is sacreBLEU's corpus BLEU on
detokenized text, printed with its signature so that it can be compared with other runs, and beside it the paper's
own: tokenized BLEU with compounds split (tensor2tensor's get_ende_bleu.sh), the figure Table 2 reports, and
sacreBLEU's chrF, which WMT's findings report beside BLEU. The hypotheses are written one per line next to the model,
and the scores into its eval_results.json (which the model card reads). A run that measures less than all of a split
with the weights in float32 (--max_samples, --dtype bfloat16 or float16, --int8) is partial: its scores go to
partial_eval_results.json and its hypotheses to hypotheses.NAME.txt, NAME saying what it left out
("test.first50.bfloat16"), so that it never replaces the split's full score. The scores come from the package's
`evaluate` metric (metrics/vaswani_bleu, `load_metric`), which `evaluate.load` and `evaluate.evaluator("translation")`
also take.

Usage:
  python scripts/evaluate_bleu.py --model OUT --dataset_dir DIR --split test      (or: vaswani-evaluate ...)
  python scripts/evaluate_bleu.py --model OUT --dataset_dir DIR --split validation --num_beams 1 --max_samples 200
  accelerate launch --num_processes 8 scripts/evaluate_bleu.py --model OUT --dataset_dir DIR --max_tokens 8192
                                                  (each process translates its share; the main process scores)
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from vaswani.checks import (
    UsageError,
    check_dataset_exists,
    check_model_folder,
    check_output_file,
    check_source_lengths,
    check_tokenizer_folder,
    seq2seq_model_types,
)
from vaswani.cli import command, parse_arguments
from vaswani.evaluation.arguments import DecodingArguments


# eval_results.json holds each split's full score, which the model card and the docs read; partial runs are kept
# beside it, never in its place.
RESULTS_FILE = "eval_results.json"
PARTIAL_RESULTS_FILE = "partial_eval_results.json"


@dataclass
class EvaluationArguments:
    model: str = field(metadata={"help": "folder written by scripts/train.py (save_pretrained)"})
    dataset_dir: str = field(metadata={"help": "DatasetDict saved by scripts/prepare_data.py"})
    tokenizer: str | None = field(default=None, metadata={"help": "default: the tokenizer saved with the model"})
    split: str = "test"
    source_lang: str = "en"
    target_lang: str = "es"
    max_samples: int | None = field(default=None, metadata={"help": "only the first N pairs of the split"})
    tokenize: str = field(default="13a", metadata={"help": "sacreBLEU tokenizer (13a, intl, none, ...)"})
    output: str | None = field(default=None, metadata={"help": "hypotheses file; default MODEL/hypotheses.SPLIT.txt"})
    num_examples: int = field(default=3, metadata={"help": "example translations to print"})


@command(extra="train", needs=("datasets", "sacrebleu", "sacremoses", "evaluate"))
def main(argv):
    args, decoding = parse_arguments(
        [EvaluationArguments, DecodingArguments], argv, description=__doc__.split("\n\n")[0]
    )
    check_dataset_exists(args.dataset_dir)
    check_model_folder(args.model, model_types=seq2seq_model_types())
    if args.tokenizer is not None:
        check_tokenizer_folder(args.tokenizer)
    if args.output is not None:
        check_output_file(args.output)
    from accelerate.utils import gather_object

    from vaswani.evaluation.bleu import load_metric, load_pairs, load_translation_model, translate
    from vaswani.translation.files import launch

    state, device = launch(decoding.device, decoding.int8)
    model, tokenizer = load_translation_model(args.model, args.tokenizer, device, decoding.int8, decoding.dtype)
    sources, references, without_text, split_pairs = load_pairs(
        args.dataset_dir, args.split, args.source_lang, args.target_lang, args.max_samples
    )
    pairs = min(args.max_samples, split_pairs) if args.max_samples is not None else split_pairs
    less = measured_less(pairs, split_pairs, decoding.dtype, decoding.int8)
    name = ".".join([args.split, *less])  # "test", "test.first50.bfloat16"
    output = Path(args.output) if args.output else check_output_file(Path(args.model) / f"hypotheses.{name}.txt")
    if without_text and state.is_main_process:
        print(f"skipped {without_text} pairs of {args.split} without text on both sides")
    if not len(sources):
        raise UsageError(f"no pair to translate in the {args.split} split of {args.dataset_dir}.")
    limit = getattr(model.config, "max_position_embeddings", None)
    check_source_lengths(tokenizer, sources, limit, decoding.max_source_length, f"the {args.split} split's sources")

    start = time.time()
    # Under accelerate launch, each process translates a stretch of the split; gathered in rank order, the
    # hypotheses are in the split's order, and the main process alone scores and writes them.
    with state.split_between_processes(list(range(len(sources)))) as share:
        mine = sources.slice(share[0], len(share)) if share else sources.slice(0, 0)
        hypotheses = gather_object(
            translate(model, tokenizer, mine, **decoding.options(), progress=state.is_main_process)
        )
    seconds = time.time() - start
    if not state.is_main_process:
        return None
    bleu = load_metric(args.target_lang).compute(
        predictions=hypotheses, references=references.to_pylist(), tokenize=args.tokenize
    )

    output.write_text("".join(h.replace("\n", " ") + "\n" for h in hypotheses), encoding="utf-8")

    for i in range(min(args.num_examples, len(sources))):
        print(f"SRC: {sources[i].as_py()}\nREF: {references[i].as_py()}\nHYP: {hypotheses[i]}\n")
    print(
        f"Translated {len(sources)} sentences of {args.split} in {seconds:.1f}s "
        f"(num_beams={decoding.num_beams}, length_penalty={decoding.length_penalty}, "
        f"paper_decoding={decoding.paper_decoding}, {decoding.dtype} on {model.device.type}, "
        f"{state.num_processes} process{'es' if state.num_processes > 1 else ''}); hypotheses in {output}"
    )
    print(bleu_line(bleu))  # "BLEU = 27.30 58.1/33.0/20.9/13.6 (BP = ... ratio = ... hyp_len = ... ref_len = ...)"
    print(f"sacreBLEU signature: {bleu['signature']}")
    print(
        "Tokenized BLEU, compounds split (the paper's Table 2 measure, tensor2tensor's get_ende_bleu.sh): "
        f"BLEU = {bleu['tokenized_bleu']:.2f}"
    )
    print(f"chrF2 = {bleu['chrf']:.2f} (sacreBLEU signature: {bleu['chrf_signature']})")

    results_file = Path(args.model) / (PARTIAL_RESULTS_FILE if less else RESULTS_FILE)
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    results[name] = {
        "dataset_dir": args.dataset_dir,
        "bleu": round(bleu["score"], 2),
        "signature": bleu["signature"],
        "tokenized_bleu": round(bleu["tokenized_bleu"], 2),
        "chrf": round(bleu["chrf"], 2),
        "chrf_signature": bleu["chrf_signature"],
        "paper_decoding": decoding.paper_decoding,
        "sentences": len(sources),
        "split_pairs": split_pairs,
        "num_beams": decoding.num_beams,
        "length_penalty": decoding.length_penalty,
        "seconds": round(seconds, 1),
        "sentences_per_sec": round(len(sources) / seconds, 2),
        "device": model.device.type,
        "dtype": decoding.dtype,
        "int8": decoding.int8,
    }
    results_file.write_text(json.dumps(results, indent=2))
    if less:
        print(
            f"A partial run ({', '.join(less.values())}): scores recorded as {name!r} in {results_file}, leaving "
            f"{RESULTS_FILE}'s full scores as they were"
        )
    else:
        print(f"Scores recorded as {name!r} in {results_file}, which the model card reads")
    return bleu


def measured_less(pairs, split_pairs, dtype, int8) -> dict:
    """What a run measures less than the split's full score (all of its pairs, the weights in float32), as the parts
    of the name its scores are recorded under, with their words: {"first50": "the first 50 of 1111 pairs",
    "bfloat16": "bfloat16"}; empty for a full run."""
    less = {f"first{pairs}": f"the first {pairs} of {split_pairs} pairs"} if pairs < split_pairs else {}
    if dtype != "float32":
        less[dtype] = dtype
    if int8:
        less["int8"] = "int8 linear layers"
    return less


def bleu_line(bleu):
    """sacreBLEU's one-line report of a score, from the metric's result."""
    precisions = "/".join(f"{precision:.1f}" for precision in bleu["precisions"])
    ratio = bleu["sys_len"] / bleu["ref_len"] if bleu["ref_len"] else 0.0
    return (
        f"BLEU = {bleu['score']:.2f} {precisions} (BP = {bleu['bp']:.3f} ratio = {ratio:.3f} "
        f"hyp_len = {bleu['sys_len']:d} ref_len = {bleu['ref_len']:d})"
    )


if __name__ == "__main__":
    main()
