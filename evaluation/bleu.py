"""Section 6.1, evaluation: translate with beam search and score with sacreBLEU.

`translate` is how this package decodes; `corpus_bleu` (sacreBLEU, with its signature), `tokenized_bleu` (the
paper's Table 2 measure) and `corpus_chrf` (sacreBLEU's chrF, which WMT reports beside BLEU) are how it scores. The scoring is also an `evaluate` metric, `vaswani_bleu`: the folder
`metrics/vaswani_bleu` of the package, installed with it, whose module calls these functions (one implementation).
`load_metric()` loads it from that folder, offline, and the evaluation command, the periodic validation of training
(`vaswani.training.validation`) and fine-tuning's `compute_metrics` score through it, so that their BLEU scores are comparable with each
other and with what `evaluate.load(...)` or `evaluate`'s translation evaluator (`TranslationEvaluator`) give with
the same metric (each printed with its sacreBLEU signature). The Hub's `evaluate.load("sacrebleu")` is not used: it fetches the metric's code
from the Hub at run time, which fails offline and runs downloaded code.
"""

import re
import warnings
from pathlib import Path

import evaluate
import pyarrow as pa
import pyarrow.compute as pc
import sacrebleu
import torch
from sacremoses import MosesTokenizer
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Pipeline, pipeline

from ..checks import UsageError, check_device, check_safetensors_weights, check_tokenizer_matches_config, token_lengths
from ..modeling import VaswaniTranslationPipeline
from ..modeling.pipeline_vaswani import BATCH_SIZE, longest_first, translate_batch
from ..progress import progress_bar
from ..training.data import load_translation_dataset, text_pairs


def load_translation_model(model_dir, tokenizer_dir=None, device=None, int8=False, dtype="float32"):
    """The model of a saved folder (safetensors only) on `device` (default: cuda if available; the CPU with `int8`),
    its weights in `dtype` (`check_decoding_dtype`), in evaluation mode, and its tokenizer (or `tokenizer_dir`'s),
    checked to match it. `int8`: every linear layer quantized (`int8_linear_layers`)."""
    check_safetensors_weights(model_dir)
    if int8 and device not in (None, "cpu"):
        raise UsageError(f"int8 decoding runs on the CPU only (torch's dynamic quantization), not on {device}.")
    if int8 and dtype != "float32":
        raise UsageError(f"--int8 quantizes float32 weights: leave out --dtype {dtype}.")
    device = check_device(device or ("cuda" if torch.cuda.is_available() and not int8 else "cpu"))
    check_decoding_dtype(dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, use_safetensors=True, dtype=getattr(torch, dtype))
    check_tokenizer_matches_config(tokenizer, model.config, model_dir)
    model = model.to(device).eval()
    return (int8_linear_layers(model) if int8 else model), tokenizer


def check_decoding_dtype(dtype: str, device: torch.device) -> None:
    """Refuse a weights' type that `device` cannot compute in: bfloat16 on a GPU older than NVIDIA's Ampere (which
    torch would only emulate), or any type a matrix product on the device fails in."""
    if device.type == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise UsageError(
            f"--dtype bfloat16 needs a GPU that computes in it (NVIDIA Ampere or newer); "
            f"{torch.cuda.get_device_name(device)} does not: decode with --dtype float16 or float32."
        )
    try:
        ones = torch.ones(2, 2, dtype=getattr(torch, dtype), device=device)
        (ones @ ones).sum().item()
    except (RuntimeError, NotImplementedError) as error:
        raise UsageError(
            f"--dtype {dtype} does not run on {device} ({str(error).splitlines()[0]}): decode in float32."
        ) from error


def int8_linear_layers(model):
    """`model` with every `nn.Linear` computing in int8 on the CPU: weights quantized once, per tensor; activations
    quantized per batch (torch's dynamic quantization, the fastest int8 path of torch on CPUs: docs/decoding.md)."""
    with warnings.catch_warnings():
        # torch announces that torch.ao.quantization moves to torchao, whose int8 configs decode slower on CPUs.
        warnings.filterwarnings("ignore", message=".*(torch.ao.quantization|quantize_per_tensor).*deprecated")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


@torch.no_grad()
def translate(model, tokenizer, sentences, **options):
    """Translate `sentences` and return the best translation of each, in the same order (`translations`)."""
    return [answers[0]["translation_text"] for answers in translations(model, tokenizer, sentences, **options)]


@torch.no_grad()
def translations(
    model,
    tokenizer,
    sentences,
    batch_size=BATCH_SIZE,
    num_beams=4,
    length_penalty=0.6,
    max_source_length=None,
    max_new_tokens=None,
    paper_decoding=None,
    prefixes=None,
    max_tokens=None,
    progress=False,
    on_batch=None,
    **answer_options,
):
    """Translate `sentences`: for each, in the same order, its hypotheses as `translate_batch` answers them (dicts
    with "translation_text", and "score", "alignment", "source_tokens_dropped" as asked).

    `sentences` is a list of str or a pyarrow string array, such as a column of a memory-mapped dataset split: only
    the batch being decoded is turned into Python strings. Sentences are decoded in batches of similar length,
    longest first (less padding); `num_beams=1` is greedy decoding. Without `max_new_tokens`, the model stops at the
    input length + 50 tokens (section 6.1). `max_source_length` truncates longer inputs (keeping the final </s>) and
    says so. `paper_decoding=True` decodes as section 6.1 does (the GNMT length penalty, each sentence's own limit:
    modeling/generation_vaswani.py), False with transformers' beam search, None as the model's generation config
    says (the only choice for a model of another class, such as Marian). `prefixes`: one forced beginning per
    sentence. `max_tokens`: batches of at most that many source tokens, padding included (fairseq's --max-tokens),
    instead of `batch_size` sentences. `on_batch(indices)` is called after each batch with its sentences' indices.
    `answer_options`: `num_return_sequences`, `return_scores`, `return_alignments`, `alignment_layer`.
    """
    if not len(sentences):
        return []
    sentences = sentences if isinstance(sentences, (pa.Array, pa.ChunkedArray)) else pa.array(sentences, pa.string())
    if prefixes is not None and len(prefixes) != len(sentences):
        raise ValueError(f"{len(prefixes)} prefixes for {len(sentences)} sentences: give one per sentence.")
    was_training = model.training
    model.eval()
    if max_tokens is None:
        order = longest_first(pc.utf8_length(sentences).to_pylist())
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    else:
        lengths = token_lengths(tokenizer, sentences)
        if max_source_length is not None:
            lengths = [min(length, max_source_length) for length in lengths]
        batches = token_batches(lengths, max_tokens)
    generate_kwargs = {"num_beams": num_beams, "do_sample": False}
    if paper_decoding is not None:
        generate_kwargs["paper_decoding"] = paper_decoding
    if num_beams > 1:  # the length penalty only ranks finished beams
        generate_kwargs["length_penalty"] = length_penalty
    if max_new_tokens is not None:
        generate_kwargs["max_new_tokens"] = max_new_tokens
    answers = [None] * len(sentences)
    for chunk in progress_bar(batches, desc="translating", unit="batch", disable=not progress):
        batch = translate_batch(
            model,
            tokenizer,
            sentences.take(chunk).to_pylist(),
            prefixes=None if prefixes is None else [prefixes[i] for i in chunk],
            max_source_length=max_source_length,
            **answer_options,
            **generate_kwargs,
        )
        for i, hypotheses in zip(chunk, batch):
            answers[i] = hypotheses
        if on_batch is not None:
            on_batch(chunk)
    model.train(was_training)
    return answers


def token_batches(lengths, max_tokens) -> list[list[int]]:
    """The indices of sources of these token lengths, longest first, cut into batches of at most `max_tokens` tokens
    with their padding (each as long as its batch's longest, its first), as fairseq's --max-tokens counts them. A source
    longer than `max_tokens` makes a batch of its own."""
    batches = []
    for index in longest_first(lengths):
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def reference_lists(hypotheses, references):
    """The references as one list per hypothesis: `references` holds one str per hypothesis, or a list of them (the
    same number for each)."""
    references = [[reference] if isinstance(reference, str) else list(reference) for reference in references]
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references.")
    if len({len(each) for each in references}) > 1:
        raise ValueError("Give every hypothesis the same number of references.")
    return references


def corpus_score(metric, hypotheses, references):
    """sacreBLEU's corpus score by `metric` (a `sacrebleu.metrics` object) of `hypotheses` against one reference each
    (or a list of references each, the same number for all): returns (score object, signature str)."""
    references = reference_lists(hypotheses, references)
    streams = [list(stream) for stream in zip(*references)] or [[]]  # sacreBLEU's: one list per reference number
    return metric.corpus_score(list(hypotheses), streams), str(metric.get_signature())


def corpus_bleu(hypotheses, references, **bleu_options):
    """sacreBLEU corpus BLEU (`corpus_score`). `score.score` is the BLEU number (0-100); `str(score)` gives the full
    line with n-gram precisions and brevity penalty. `bleu_options` go to `sacrebleu.metrics.BLEU` (e.g.
    tokenize="intl")."""
    return corpus_score(sacrebleu.metrics.BLEU(**bleu_options), hypotheses, references)


def corpus_chrf(hypotheses, references, **chrf_options):
    """sacreBLEU corpus chrF (`corpus_score`): the F-score of character 6-grams, recall weighted twice (beta 2), the
    score WMT's findings report beside BLEU; it needs no tokenizer and credits a word's right stem. `chrf_options` go
    to `sacrebleu.metrics.CHRF` (e.g. word_order=2 for chrF++)."""
    return corpus_score(sacrebleu.metrics.CHRF(**chrf_options), hypotheses, references)


# tensor2tensor's get_ende_bleu.sh, which scored the paper's Table 2: "rich-text" becomes "rich ##AT##-##AT## text",
# as GNMT and ConvS2S counted compounds; perl's s{(\S)-(\S)}{...}g, whose matches do not overlap, as re.sub's don't.
COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)")


def tokenized_bleu(hypotheses, references, language):
    """The paper's BLEU: both sides Moses-tokenized (tokenizer.perl -l LANGUAGE), compounds split at their hyphens,
    then multi-bleu.perl's case-sensitive corpus BLEU on the tokens. Not comparable with sacreBLEU's detokenized
    score (usually higher); reported beside it so that a score can be set against Table 2. Returns the score object.
    """
    tokenizer = MosesTokenizer(lang=language)

    def split(line):
        return COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", tokenizer.tokenize(line, return_str=True))

    references = [[split(r) for r in each] for each in reference_lists(hypotheses, references)]
    return corpus_bleu([split(h) for h in hypotheses], references, tokenize="none", force=True)[0]


METRIC_DIR = Path(__file__).resolve().parent.parent / "metrics" / "vaswani_bleu"


def load_metric(target_lang=None, **load_options):
    """The `evaluate` metric `vaswani_bleu` (`corpus_bleu` with its signature, and with `target_lang` the paper's
    `tokenized_bleu`), loaded offline from its folder in this package: `evaluate.load(METRIC_DIR, target_lang)`.
    `load_options` go to `evaluate.load`; keep_in_memory=True unless given (no cache files on disk, nothing shared
    between processes).
    """
    load_options.setdefault("keep_in_memory", True)
    return evaluate.load(str(METRIC_DIR), target_lang, **load_options)


class TranslationEvaluator(evaluate.TranslationEvaluator):
    """`evaluate`'s translation evaluator (`compute(model_or_pipeline, data, metric, ...)`: a metric of the translations
    of a dataset's "text" column against its "label" column), decoding through the package's translation pipeline.

    transformers 5 no longer lists the task "translation", so `evaluate.evaluator("translation")` refuses it, and
    evaluate's own `prepare_pipeline` cannot build a pipeline with transformers 5. This one takes a pipeline as it is,
    and builds the package's for a model (with `tokenizer`) or a saved folder.
    """

    def prepare_pipeline(self, model_or_pipeline, tokenizer=None, feature_extractor=None, device=None):
        if isinstance(model_or_pipeline, Pipeline):
            return model_or_pipeline
        if model_or_pipeline is None:
            raise ValueError("Give the model to evaluate: a model with its tokenizer, a saved folder or a pipeline.")
        if isinstance(model_or_pipeline, (str, Path)):
            return pipeline(
                "translation",
                model=str(model_or_pipeline),
                tokenizer=tokenizer,
                device=device,
                pipeline_class=VaswaniTranslationPipeline,
            )
        return VaswaniTranslationPipeline(model=model_or_pipeline, tokenizer=tokenizer, device=device)


def load_pairs(dataset_dir, split, source_lang, target_lang, max_samples=None):
    """Source and reference sentences of one split (its first `max_samples` pairs), as pyarrow string arrays read from
    its memory-mapped files, how many pairs were left out for lacking text on a side (a row or side that is None
    cannot be scored), and how many pairs the whole split holds."""
    rows = load_translation_dataset(dataset_dir, source_lang, target_lang, splits=(split,))[split]
    split_pairs = len(rows)
    if max_samples is not None:
        rows = rows.select(range(min(max_samples, split_pairs)))
    pairs = rows.select_columns(["translation"]).with_format("arrow")[:].column("translation").combine_chunks()
    sources, references, usable = text_pairs(pairs, source_lang, target_lang)
    return sources.filter(usable), references.filter(usable), len(pairs) - pc.sum(usable).as_py(), split_pairs
