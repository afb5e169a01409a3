"""Translating text: `translate_batch`, and the translation pipeline of vaswani models.

transformers 5 removed its built-in translation pipeline, and `pipeline("translation", ...)` refuses the task unless
the model's config declares it: a saved vaswani folder declares this pipeline (`custom_pipelines`) and carries this
file, which the library loads with `trust_remote_code=True` like the model's own code; where the package is installed,
`pipeline("translation", model=folder, pipeline_class=VaswaniTranslationPipeline)` runs the package's, and
`VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)` serves a model in memory. It takes one text or a list
of texts and answers `[{"translation_text": ...}]` per text, as the built-in pipeline did (a list of such answers per
text with `num_return_sequences` > 1). Decoding follows the model's generation config (the paper's beam 4 and length
penalty 0.6) unless the call passes other `generate()` arguments.

Beyond the built-in, as fairseq users expect: n-best lists with their scores (`num_return_sequences`,
`return_scores`), a forced target prefix (`prefix`), word alignments from the encoder-decoder attention
(`return_alignments`), and `max_source_length`, which says what it cut. `translate_batch` does the work for one batch;
the pipeline and `vaswani.evaluation.bleu.translate` (and `vaswani-translate`) call it for batches of similar
length.
"""

import torch
from transformers import Pipeline
from transformers.utils import logging


logger = logging.get_logger(__name__)


def hard_alignments(model, input_ids, attention_mask, sequences, layer: int = -1) -> list[list[tuple[int, int]]]:
    """fairseq's `--print-alignment hard`: for every target token, the source token its encoder-decoder attention in
    `layer` (averaged over the heads) weighs most. Pairs (source index, target index), counting tokens without the
    special ones (padding, </s>, the decoder's start token), from the forward pass over each finished hypothesis."""
    special = {model.config.pad_token_id, model.config.eos_token_id, model.config.decoder_start_token_id}
    rows_per_source = sequences.shape[0] // input_ids.shape[0]
    input_ids = input_ids.repeat_interleave(rows_per_source, dim=0)
    attention_mask = attention_mask.repeat_interleave(rows_per_source, dim=0)
    # The fused attention kernels never form the weight matrix; the eager implementation returns it.
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            # Row t of the attention is the query that chose token t + 1 of the sequence.
            attention = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                decoder_input_ids=sequences[:, :-1],
                output_attentions=True,
            ).cross_attentions[layer]
    finally:
        model.set_attn_implementation(implementation)
    weights = attention.float().mean(dim=1)  # (rows, target, source)
    alignments = []
    for source, target, row in zip(input_ids.tolist(), sequences[:, 1:].tolist(), weights):
        source_ok = torch.tensor([token not in special for token in source])
        source_index = source_ok.cumsum(0) - 1
        pairs, target_index = [], 0
        for t, token in enumerate(target):
            if token in special:
                continue
            chosen = int(row[t].masked_fill(~source_ok, -float("inf")).argmax())
            pairs.append((int(source_index[chosen]), target_index))
            target_index += 1
        alignments.append(pairs)
    return alignments


# How many texts are decoded together by default: by the pipeline, and by `vaswani.evaluation.bleu.translate`.
BATCH_SIZE = 32


def longest_first(lengths) -> list[int]:
    """The indices of texts of these lengths, longest first (ties in their order): cut into batches, texts of similar
    length share a batch and so its padding; each answer goes back to its text's index."""
    return sorted(range(len(lengths)), key=lambda index: -lengths[index])


def translate_batch(
    model,
    tokenizer,
    texts: list[str],
    prefixes: list[str] | None = None,
    return_scores: bool = False,
    return_alignments: bool = False,
    alignment_layer: int = -1,
    max_source_length: int | None = None,
    **generate_kwargs,
) -> list[list[dict]]:
    """Translate one batch: for each text, its `num_return_sequences` hypotheses, best first, as dicts with
    "translation_text" and, if asked, "score" (what the beam search ranked by: the log-probability divided by the
    length penalty; with greedy decoding, the log-probability) and "alignment" (`hard_alignments`). A source longer
    than `max_source_length` tokens is cut to that length (its final </s> kept), logged, and its answers say how many
    tokens were dropped ("source_tokens_dropped"). `prefixes` forces each translation to begin with its text. A
    blank text (empty, or only spaces) has nothing to translate: its answers are empty, with a score of 0 and no
    alignment (decoding </s> alone would make a sentence up).
    """
    if prefixes is not None and len(prefixes) != len(texts):
        raise ValueError(f"{len(prefixes)} prefixes for {len(texts)} texts: give one per text.")
    blank = [not text.strip() for text in texts]
    if any(blank):
        kept = [index for index, is_blank in enumerate(blank) if not is_blank]
        translated = iter(
            translate_batch(
                model,
                tokenizer,
                [texts[index] for index in kept],
                None if prefixes is None else [prefixes[index] for index in kept],
                return_scores,
                return_alignments,
                alignment_layer,
                max_source_length,
                **generate_kwargs,
            )
            if kept
            else []
        )
        empty = {"translation_text": ""} | ({"score": 0.0} if return_scores else {})
        empty |= {"alignment": []} if return_alignments else {}
        count = generate_kwargs.get("num_return_sequences") or model.generation_config.num_return_sequences or 1
        return [[dict(empty) for _ in range(count)] if is_blank else next(translated) for is_blank in blank]
    device = next(model.parameters()).device
    dropped = {}  # text index -> source tokens cut by max_source_length
    if max_source_length is not None:
        for index, ids in enumerate(tokenizer(texts).input_ids):
            if len(ids) > max_source_length:
                dropped[index] = len(ids) - max_source_length
                logger.warning(
                    f"A source of {len(ids)} tokens ({texts[index][:40]!r}...) was cut to max_source_length "
                    f"({max_source_length}): {dropped[index]} tokens dropped."
                )
    encoded = tokenizer(
        texts,
        padding=True,
        truncation=max_source_length is not None,
        max_length=max_source_length,
        return_tensors="pt",
    ).to(device)
    prompts = None
    if prefixes is not None:
        start = model.config.decoder_start_token_id
        prompts = [[start, *tokenizer(text_target=p, add_special_tokens=False).input_ids] for p in prefixes]
    # Sentences with prompts of the same length decode together (a decoder prompt has one length per batch).
    groups = {}
    for index in range(len(texts)):
        groups.setdefault(0 if prompts is None else len(prompts[index]), []).append(index)
    answers = [None] * len(texts)
    for indices in groups.values():
        rows = torch.tensor(indices, device=device)
        inputs = {key: value[rows] for key, value in encoded.items()}
        inputs["input_ids"], inputs["attention_mask"] = trimmed(inputs["input_ids"], inputs["attention_mask"])
        if prompts is not None:
            inputs["decoder_input_ids"] = torch.tensor([prompts[i] for i in indices], device=device)
        output = model.generate(**inputs, **generate_kwargs, return_dict_in_generate=True, output_scores=return_scores)
        sequences = output.sequences
        per_text = sequences.shape[0] // len(indices)
        texts_out = tokenizer.batch_decode(sequences, skip_special_tokens=True)
        scores = sequence_scores(model, output, return_scores)
        alignments = (
            hard_alignments(model, inputs["input_ids"], inputs["attention_mask"], sequences, alignment_layer)
            if return_alignments
            else None
        )
        for position, index in enumerate(indices):
            hypotheses = []
            for row in range(position * per_text, (position + 1) * per_text):
                answer = {"translation_text": texts_out[row].strip()}
                if scores is not None:
                    answer["score"] = scores[row]
                if alignments is not None:
                    answer["alignment"] = alignments[row]
                if index in dropped:
                    answer["source_tokens_dropped"] = dropped[index]
                hypotheses.append(answer)
            answers[index] = hypotheses
    return answers


def trimmed(input_ids, attention_mask):
    """The batch without the padding columns no row of it needs (a subset of a padded batch, padded on either side)."""
    needed = attention_mask.bool().any(dim=0)
    return input_ids[:, needed], attention_mask[:, needed]


def sequence_scores(model, output, wanted: bool) -> list[float] | None:
    if not wanted:
        return None
    if getattr(output, "sequences_scores", None) is not None:
        return output.sequences_scores.tolist()
    # Greedy decoding: the summed log-probability of the tokens up to the first </s>; the padding written after it,
    # while longer sentences of the batch were decoded, counts nothing.
    transition = model.compute_transition_scores(output.sequences, output.scores, normalize_logits=True)
    generated = output.sequences[:, -transition.shape[1] :]
    ends = torch.isin(generated, torch.tensor(model.generation_config.eos_token_id, device=generated.device))
    after_end = (ends.cumsum(dim=1) - ends.long()) > 0
    return transition.masked_fill(after_end | (transition == -float("inf")), 0.0).sum(dim=1).tolist()


class VaswaniTranslationPipeline(Pipeline):
    """Section 6.1 as a pipeline: tokenize the sources, decode with `generate()`, detokenize the hypotheses.

    A list of texts is decoded in batches of `batch_size` texts of similar length (longest first, as
    `vaswani.evaluation.bleu.translate` decodes), and answered in its own order.
    """

    # The components `pipeline()` loads for it: the tokenizer, nothing else.
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False

    def __init__(self, *args, task: str = "translation", batch_size: int = BATCH_SIZE, **kwargs):
        super().__init__(*args, task=task, batch_size=batch_size, **kwargs)

    def __call__(self, texts: str | list[str], **kwargs):
        """One text: a list of `num_return_sequences` answers. A list of texts: one answer per text, or a list of
        `num_return_sequences` answers per text when that is more than one (the removed built-in's shapes). Any other
        iterable of texts (a generator, a dataset) is translated as it comes, in the pipeline's batches, unsorted.

        Options besides `generate()`'s: `batch_size`, `return_scores`, `return_alignments` (and `alignment_layer`,
        default the last), `prefix` (a text every translation begins with; one per text for a list),
        `max_source_length`, and `truncation=True`, which cuts sources to the longest the model takes.
        """
        prefix = kwargs.pop("prefix", None)
        if isinstance(texts, str):
            return super().__call__({"text": texts, "prefix": prefix}, **kwargs)
        if not isinstance(texts, (list, tuple)):
            if prefix is not None:
                raise ValueError("`prefix` needs the texts as a list, one prefix per text (or one for all).")
            return super().__call__(texts, **kwargs)
        prefixes = [prefix] * len(texts) if prefix is None or isinstance(prefix, str) else list(prefix)
        if len(prefixes) != len(texts):
            raise ValueError(f"{len(prefixes)} prefixes for {len(texts)} texts: give one per text.")
        order = longest_first([len(text) for text in texts])
        results = super().__call__([{"text": texts[i], "prefix": prefixes[i]} for i in order], **kwargs)
        answers = [None] * len(texts)
        for index, result in zip(order, results):
            answers[index] = result
        if all(len(hypotheses) == 1 for hypotheses in answers):
            return [hypotheses[0] for hypotheses in answers]
        return answers

    def _sanitize_parameters(
        self,
        max_source_length=None,
        return_scores=None,
        return_alignments=None,
        alignment_layer=None,
        generate_kwargs=None,
        truncation=None,
        **generation_parameters,
    ):
        # The built-in pipeline's `truncation` (evaluate's evaluator passes True): sources longer than the model takes
        # are cut to that, as `max_source_length` cuts them.
        if truncation not in (None, False, "do_not_truncate") and max_source_length is None:
            max_source_length = min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        options = {
            "max_source_length": max_source_length,
            "return_scores": return_scores,
            "return_alignments": return_alignments,
            "alignment_layer": alignment_layer,
        }
        forward = {key: value for key, value in options.items() if value is not None}
        return {}, {**forward, **(generate_kwargs or {}), **generation_parameters}, {}

    def preprocess(self, inputs):
        text, prefix = (inputs["text"], inputs["prefix"]) if isinstance(inputs, dict) else (inputs, None)
        if not isinstance(text, str):
            raise ValueError(f"The translation pipeline takes text (or a list of texts), got {type(text).__name__}.")
        return {"text": text, "prefix": prefix}

    def _forward(self, model_inputs, **options):
        # One text, or (batch_size > 1) the pipeline's batch of them: each key then holds a list.
        texts, prefixes = model_inputs["text"], model_inputs["prefix"]
        one = isinstance(texts, str)
        if one:
            texts, prefixes = [texts], [prefixes]
        if all(prefix is None for prefix in prefixes):
            prefixes = None
        answers = translate_batch(self.model, self.tokenizer, texts, prefixes, **options)
        return {"answers": answers[0] if one else answers}

    def postprocess(self, model_outputs):
        return model_outputs["answers"]
