"""Translate a dataset split with a trained model and score it with sacreBLEU (section 6.1 of the paper).

The paper decodes with beam search, beam size 4 and length penalty alpha = 0.6, and lets the output run to the
input length + 50 tokens; those are the defaults here (the last one is the model's own generate() default).
The score is sacreBLEU's corpus BLEU on detokenized text, printed with its signature so that it can be compared
with other runs; the hypotheses are written one per line next to the model.

Usage:
  python scripts/evaluate.py --model OUT --dataset_dir DIR --split test
  python scripts/evaluate.py --model OUT --dataset_dir DIR --split validation --num_beams 1 --max_samples 200

`translate()` and `corpus_bleu()` are the one implementation of decoding and scoring; scripts/train.py imports them
for its periodic validation.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sacrebleu
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

try:  # registers model_type "vaswani" with the Auto classes; without the package, the saved code is used
    import vaswani  # noqa: F401
except ImportError:
    vaswani = None


@torch.no_grad()
def translate(model, tokenizer, sentences, batch_size=32, num_beams=4, length_penalty=0.6, max_source_length=None,
              max_new_tokens=None, progress=False):
    """Translate `sentences` and return the translations in the same order.

    `sentences` is a list of str or a pyarrow string array, such as a column of a memory-mapped dataset split: only
    the batch being decoded is turned into Python strings. Sentences are decoded in batches of similar length,
    longest first (less padding); `num_beams=1` is greedy decoding. Without `max_new_tokens`, the model stops at the
    input length + 50 tokens (section 6.1). `max_source_length` truncates longer inputs (keeping the final </s>).
    """
    if not len(sentences):
        return []
    sentences = sentences if isinstance(sentences, (pa.Array, pa.ChunkedArray)) else pa.array(sentences, pa.string())
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = np.argsort(-pc.utf8_length(sentences).to_numpy(zero_copy_only=False), kind="stable")
    translations = [None] * len(sentences)
    for start in tqdm(range(0, len(order), batch_size), desc="translating", unit="batch", disable=not progress):
        chunk = order[start:start + batch_size]
        encoded = tokenizer(
            sentences.take(chunk).to_pylist(),
            padding=True,
            truncation=max_source_length is not None,
            max_length=max_source_length,
            return_tensors="pt",
        )
        generate_kwargs = dict(num_beams=num_beams, do_sample=False)
        if num_beams > 1:  # the length penalty only ranks finished beams
            generate_kwargs["length_penalty"] = length_penalty
        if max_new_tokens is not None:
            generate_kwargs["max_new_tokens"] = max_new_tokens
        output = model.generate(
            input_ids=encoded["input_ids"].to(device),
            attention_mask=encoded["attention_mask"].to(device),
            **generate_kwargs,
        )
        for i, text in zip(chunk, tokenizer.batch_decode(output, skip_special_tokens=True)):
            translations[i] = text.strip()
    model.train(was_training)
    return translations


def corpus_bleu(hypotheses, references, **bleu_options):
    """sacreBLEU corpus BLEU of `hypotheses` against one reference each: returns (score object, signature str).

    `score.score` is the BLEU number (0-100); `str(score)` gives the full line with n-gram precisions and brevity
    penalty. `bleu_options` go to `sacrebleu.metrics.BLEU` (e.g. tokenize="intl").
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references.")
    metric = sacrebleu.metrics.BLEU(**bleu_options)
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return score, str(metric.get_signature())


def load_pairs(dataset_dir, split, source_lang, target_lang, max_samples=None):
    """Source and reference sentences of one split of a DatasetDict saved by scripts/prepare_data.py, as pyarrow
    string arrays read from its memory-mapped files."""
    from datasets import DatasetDict, load_from_disk

    from vaswani.training.data import text_pairs, translation_languages

    if not Path(dataset_dir).is_dir():
        raise SystemExit(f"evaluate.py: error: dataset directory {dataset_dir} does not exist.")
    try:
        dataset = load_from_disk(str(dataset_dir))
    except Exception as error:  # datasets raises FileNotFoundError or its own errors for a foreign folder
        raise SystemExit(f"evaluate.py: error: {dataset_dir} is not a dataset saved with save_to_disk ({error}).")
    if not isinstance(dataset, DatasetDict) or split not in dataset:
        splits = sorted(dataset) if isinstance(dataset, DatasetDict) else "a single Dataset, no splits"
        raise SystemExit(f"evaluate.py: error: split {split!r} not in {dataset_dir} (it has {splits}).")
    rows = dataset[split]
    try:
        languages = translation_languages(rows, f"the {split} split")
    except ValueError as error:
        raise SystemExit(f"evaluate.py: error: {error}")
    for lang in (source_lang, target_lang):
        if lang not in languages:
            raise SystemExit(f"evaluate.py: error: language {lang!r} not in the translation column "
                             f"(it has {languages}).")
    if max_samples is not None:
        rows = rows.select(range(min(max_samples, len(rows))))
    pairs = rows.select_columns(["translation"]).with_format("arrow")[:].column("translation").combine_chunks()
    # A row without a translation, or a side that is not text (None in a dataset not made by prepare_data.py),
    # cannot be translated or scored.
    sources, references, usable = text_pairs(pairs, source_lang, target_lang)
    sources, references = sources.filter(usable), references.filter(usable)
    if len(sources) < len(pairs):
        print(f"skipped {len(pairs) - len(sources)} pairs of {split} without text on both sides")
    if not len(sources):
        raise SystemExit(f"evaluate.py: error: no pair to translate in the {split} split of {dataset_dir}.")
    return sources, references


def check_tokenizer_fits_model(tokenizer, config):
    """The model's embedding and special ids must be the tokenizer's, or every id means something else."""
    problems = []
    if len(tokenizer) > config.vocab_size:
        problems.append(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
                        f"{config.vocab_size}")
    for name, model_id in (("pad", config.pad_token_id), ("eos", config.eos_token_id),
                           ("bos", config.decoder_start_token_id)):
        if getattr(tokenizer, f"{name}_token_id") != model_id:
            problems.append(f"the tokenizer's {name} id is {getattr(tokenizer, f'{name}_token_id')} but the model's is "
                            f"{model_id}")
    if problems:
        raise SystemExit("evaluate.py: error: the tokenizer does not fit the model: " + "; ".join(problems) + ".")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", required=True, help="folder written by scripts/train.py (save_pretrained)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder; default: the one saved with the model")
    parser.add_argument("--dataset_dir", required=True, help="DatasetDict saved by scripts/prepare_data.py")
    parser.add_argument("--split", default="test")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="es")
    parser.add_argument("--num_beams", type=int, default=4, help="beam size; 1 is greedy decoding (paper: 4)")
    parser.add_argument("--length_penalty", type=float, default=0.6, help="alpha of the length penalty (paper: 0.6)")
    parser.add_argument("--batch_size", type=int, default=32, help="sentences per generate() call")
    parser.add_argument("--max_samples", type=int, default=None, help="only the first N pairs of the split")
    parser.add_argument("--max_source_length", type=int, default=None, help="truncate longer sources (tokens)")
    parser.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer (13a, intl, none, ...)")
    parser.add_argument("--output", default=None, help="hypotheses file; default MODEL/hypotheses.SPLIT.txt")
    parser.add_argument("--num_examples", type=int, default=3, help="example translations to print")
    parser.add_argument("--device", default=None, help="cpu, cuda, ...; default: cuda if available")
    args = parser.parse_args(argv)

    if not Path(args.model).is_dir():
        raise SystemExit(f"evaluate.py: error: model folder {args.model} does not exist.")
    if not any((Path(args.model) / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        raise SystemExit(f"evaluate.py: error: {args.model} has no model.safetensors; weights are only read from "
                         "safetensors files, never from pickles (pytorch_model.bin).")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, trust_remote_code=vaswani is None,
                                                  use_safetensors=True).to(device).eval()
    check_tokenizer_fits_model(tokenizer, model.config)
    sources, references = load_pairs(args.dataset_dir, args.split, args.source_lang, args.target_lang, args.max_samples)

    start = time.time()
    hypotheses = translate(model, tokenizer, sources, batch_size=args.batch_size, num_beams=args.num_beams,
                           length_penalty=args.length_penalty, max_source_length=args.max_source_length,
                           progress=True)
    seconds = time.time() - start
    score, signature = corpus_bleu(hypotheses, references.to_pylist(), tokenize=args.tokenize)

    output = Path(args.output) if args.output else Path(args.model) / f"hypotheses.{args.split}.txt"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(h.replace("\n", " ") + "\n" for h in hypotheses), encoding="utf-8")

    for i in range(min(args.num_examples, len(sources))):
        print(f"SRC: {sources[i].as_py()}\nREF: {references[i].as_py()}\nHYP: {hypotheses[i]}\n")
    print(f"Translated {len(sources)} sentences of {args.split} in {seconds:.1f}s "
          f"(num_beams={args.num_beams}, length_penalty={args.length_penalty}); hypotheses in {output}")
    print(score)  # "BLEU = 27.30 58.1/33.0/20.9/13.6 (BP = ... ratio = ... hyp_len = ... ref_len = ...)"
    print(f"sacreBLEU signature: {signature}")

    # The run's record of what was measured, per split; scripts/push_to_hub.py fills the model card from it.
    results_file = Path(args.model) / "eval_results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    results[args.split] = {
        "bleu": round(score.score, 2),
        "signature": str(signature),
        "sentences": len(sources),
        "num_beams": args.num_beams,
        "length_penalty": args.length_penalty,
        "seconds": round(seconds, 1),
        "sentences_per_sec": round(len(sources) / seconds, 2),
        "device": device,
    }
    results_file.write_text(json.dumps(results, indent=2))
    return score


if __name__ == "__main__":
    main(sys.argv[1:])
