"""Section 6.1's decoding: beam search with the length penalty of Wu et al. (2016) and a limit per sentence.

The paper decodes with "beam size of 4 and length penalty alpha = 0.6" and "maximum output length [of] input length +
50, but terminate[s] early when possible". The penalty it cites (Wu et al., 2016, section 7) divides a finished
hypothesis' log-probability by lp(Y) = ((5 + |Y|) / 6) ** alpha, where `GenerationMixin`'s beam search divides by
|Y| ** alpha; and the length limit is each sentence's own, not the padded batch's. `VaswaniForConditionalGeneration`
decodes this way when its generation config says `paper_decoding=True`: `gnmt_beam_search` is then passed to
`generate()` as its `custom_generate` decoding method and `SourceLengthLimit` joins its logits processors.

|Y| counts the tokens after the decoder prompt (the start token), `</s>` included; a source's length counts its
unpadded tokens, `</s>` included.
"""

import copy

import torch
from torch import distributed
from transformers import CompileConfig, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import GenerateBeamEncoderDecoderOutput
from transformers.modeling_outputs import BaseModelOutput


# Section 6.1: "maximum output length [of] input length + 50".
EXTRA_OUTPUT_TOKENS = 50

# The private names of transformers this module uses, each with why no public one serves.
TRANSFORMERS_PRIVATE_NAMES = {
    "GenerationMixin._valid_auto_compile_criteria": "generate()'s own decision to compile the decoding step "
    "(hardware, cache kind, quantization, offloading, compile_config), which transformers' decoding methods (_sample, "
    "_beam_search) ask before their loop; a decoding method passed as custom_generate asks it to compile exactly when "
    "they do",
    "GenerationConfig._get_default_generation_params": "the table Seq2SeqTrainer (predict_with_generate) fills the "
    "model's generation config from: the only way to tell its filled-in max_length from one a user set",
}


def holds_library_defaults(generation_config) -> bool:
    """Whether the config's `max_length` is transformers' default filled in, not a limit anyone set.

    `Seq2SeqTrainer.prediction_step` (`predict_with_generate=True`) fills every unset field of the model's generation
    config with the library's defaults (`GenerationConfig._get_default_generation_params()`), max_length=20 among
    them, and `save_model` saves them: the model would then stop every translation at 20 tokens. Such a config holds
    that max_length and every other default too; a max_length set by hand leaves the other fields unset, and is a limit.
    """
    defaults = generation_config._get_default_generation_params()  # TRANSFORMERS_PRIVATE_NAMES
    return generation_config.max_length == defaults["max_length"] and all(
        getattr(generation_config, key, None) is not None for key, value in defaults.items() if value is not None
    )


def gnmt_length_penalty(length: torch.Tensor | int, alpha: float) -> torch.Tensor | float:
    """Wu et al. (2016), eq. 14: lp(Y) = ((5 + |Y|) / 6) ** alpha."""
    return ((5 + length) / 6) ** alpha


class SourceLengthLimit(LogitsProcessor):
    """Forces `</s>` once a hypothesis holds its source's length + 50 tokens, each sentence of the batch its own.

    `limits` holds one limit per source sentence; the rows a decoding method scores (beams, returned sequences) are
    that sentence's rows in order, as `generate()` lays them out. The model's own log-probability of `</s>` is kept, so
    a forced ending is scored like any other.
    """

    def __init__(self, limits: torch.Tensor, eos_token_id: int):
        self.limits = limits
        self.eos_token_id = eos_token_id
        # Read once here, so that the steps before any sentence's limit ask the device nothing.
        self.earliest = int(limits.min())

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        # The token chosen now is the (cur_len)-th after the start token.
        if input_ids.shape[1] < self.earliest:
            return scores
        limits = self.limits.to(input_ids.device).repeat_interleave(input_ids.shape[0] // self.limits.shape[0])
        at_limit = limits <= input_ids.shape[1]
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.eos_token_id] = scores[:, self.eos_token_id]
        return torch.where(at_limit[:, None], forced, scores)


def rounding_as_eager(compile_config: CompileConfig | None) -> CompileConfig:
    """`compile_config` (transformers' default where None), with inductor rounding every intermediate result to the
    model's dtype as eager execution does (`emulate_precision_casts`).

    Inductor fuses a step's elementwise work and keeps what it computes in float32, where eager rounds each operation's
    result: in bfloat16 a compiled step's logits then differ from eager ones by a unit in the last place (1/64 at 8),
    and two hypotheses whose scores lie closer than that swap places, so that compiling changed which hypotheses a
    beam search kept (tests/test_generation.py). A config that sets a mode other than transformers' default
    ("reduce-overhead", CUDA graphs) or "default" is the user's to tune and is kept as it is.
    """
    compile_config = compile_config or CompileConfig()
    options = dict(compile_config.options or {})
    if compile_config.mode == "reduce-overhead":
        options["triton.cudagraphs"] = True  # what the mode stands for; torch takes a mode or options, not both
    elif compile_config.mode not in (None, "default"):
        return compile_config
    options.setdefault("emulate_precision_casts", True)
    rounded = copy.copy(compile_config)
    rounded.mode, rounded.options = None, options
    return rounded


def any_peer_unfinished(this_peer_finished: bool, synced_gpus: bool, device: torch.device) -> bool:
    """Whether to run another step. With `synced_gpus` (DeepSpeed ZeRO-3, FSDP) every process runs each forward pass
    of the sharded model until all of them are done, so each one's state is summed across them."""
    if not synced_gpus:
        return not this_peer_finished
    unfinished = torch.tensor(0.0 if this_peer_finished else 1.0, device=device)
    distributed.all_reduce(unfinished)
    return unfinished.item() > 0


def next_step_kwargs(outputs, model_kwargs: dict) -> dict:
    """The decoder's keyword arguments after a step that added one token to every row: the cache it returned, and
    the decoder's padding mask and positions (where given) one token longer."""
    if outputs.cache is not None:
        model_kwargs["cache"] = outputs.cache
    mask = model_kwargs.get("decoder_attention_mask")
    if mask is not None:
        model_kwargs["decoder_attention_mask"] = torch.cat((mask, mask.new_ones((mask.shape[0], 1))), dim=-1)
    positions = model_kwargs.get("decoder_position_ids")
    if positions is not None:
        model_kwargs["decoder_position_ids"] = torch.cat((positions, positions[:, -1:] + 1), dim=-1)
    return model_kwargs


class BeamSearchCacheLayer(DynamicLayer):
    """A decoder self-attention cache layer for beam search, which moves each position's keys and values once a step.

    `DynamicLayer` appends a step's keys and values by concatenation, a copy of the whole cache, and a beam reorder
    copies it again. Here keys and values live in one buffer with room for the steps to come: a step writes its
    position in place, and a reorder gathers the chosen rows straight into a second buffer, which becomes the first.
    `keys` and `values` are views of the filled positions, as `DynamicLayer`'s tensors are read.
    """

    room = 32  # positions allocated ahead, each time the buffer fills up

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.filled, self.buffer, self.spare = 0, None, None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.filled + key_states.shape[-2]
        if self.buffer is None or end > self.buffer.shape[3]:
            rows, heads, _, head_dim = key_states.shape
            shape = (2, rows, heads, end + self.room, head_dim)
            buffer = key_states.new_empty(shape)
            if self.buffer is not None:
                buffer[:, :, :, : self.filled] = self.buffer[:, :, :, : self.filled]
            self.buffer, self.spare = buffer, key_states.new_empty(shape)
        self.buffer[0, :, :, self.filled : end] = key_states
        self.buffer[1, :, :, self.filled : end] = value_states
        self.filled = end
        self.keys, self.values = self.buffer[0, :, :, :end], self.buffer[1, :, :, :end]
        return self.keys, self.values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep row `beam_idx[i]` as row i (fewer rows where sentences left the batch)."""
        target = self.spare[:, : beam_idx.shape[0], :, : self.filled]
        torch.index_select(self.buffer[:, :, :, : self.filled], 1, beam_idx, out=target)
        self.buffer, self.spare = self.spare[:, : beam_idx.shape[0]], self.buffer
        self.keys, self.values = self.buffer[0, :, :, : self.filled], self.buffer[1, :, :, : self.filled]


class BeamSearchCache(DynamicCache):
    """The decoder self-attention cache of the paper's beam search: a `DynamicCache`, as transformers' decoding
    methods return, whose layers are `BeamSearchCacheLayer`s, made one per layer as the decoder first writes it."""

    def __init__(self):
        super().__init__()
        self.layer_class_to_replicate = BeamSearchCacheLayer


def reorder_self_attention_cache(cache, rows: torch.Tensor, filled: int) -> None:
    """Give each row of the decoder's self-attention cache the keys and values of row `rows[i]`, for the `filled`
    positions it holds. A static cache is rewritten in place, so that its tensors keep the addresses a compiled step
    reads. The encoder-decoder attention cache is left alone: every beam of a sentence holds the same projection of
    the same encoder output, so reordering beams within sentences never changes it."""
    for layer in cache.self_attention_cache.layers:
        if layer.is_compileable:
            for states in (layer.keys, layer.values):
                held = states[:, :, :filled]
                held.copy_(held.index_select(0, rows))
        else:
            layer.reorder_cache(rows)


def select_batch_rows(model_kwargs: dict, sentences: torch.Tensor, num_beams: int) -> None:
    """Keep the rows of `sentences` in everything the decoder reads: per sentence, the encoder's output and padding
    mask and the encoder-decoder attention cache; per hypothesis (`num_beams` a sentence), the decoder's mask and
    positions."""
    rows = (sentences[:, None] * num_beams + torch.arange(num_beams, device=sentences.device)).view(-1)
    for key, value in model_kwargs.items():
        if isinstance(value, torch.Tensor) and value.dim():
            model_kwargs[key] = value.index_select(0, sentences if key == "attention_mask" else rows)
    model_kwargs["encoder_outputs"] = BaseModelOutput(
        last_hidden_state=model_kwargs["encoder_outputs"].last_hidden_state.index_select(0, sentences)
    )
    if model_kwargs.get("cache") is not None:
        model_kwargs["cache"].cross_attention_cache.reorder_cache(sentences)


def gnmt_beam_search(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
    """Beam search as tensor2tensor runs it for the paper: `generate(custom_generate=gnmt_beam_search)`.

    Each step extends every live hypothesis by every token and keeps the 2k best continuations (k = num_beams). Those
    that end (`</s>`, or a stopping criterion such as the length limit) are finished: their score is their summed
    log-probability divided by lp(|Y|), and the k best finished ones are kept. The k best others stay live. A sentence
    is done when it has k finished hypotheses and its best live one, even at the longest length allowed (where lp is
    largest and so the penalised score best), would score below the worst of them: the search ends exactly, not on a
    heuristic. Returns, best first, `num_return_sequences` finished hypotheses per sentence and, with
    `return_dict_in_generate=True`, what transformers' beam search returns: with `output_scores=True` their scores
    (`sequences_scores`), the processed log-probabilities of every step (`scores`) and the beams each token came from
    (`beam_indices`); with `output_logits`, `output_attentions` or `output_hidden_states`, those of every step.
    """
    synced_gpus = model_kwargs.pop("synced_gpus", False)
    num_beams = generation_config.num_beams
    num_return = generation_config.num_return_sequences or 1
    alpha = generation_config.length_penalty
    max_length = generation_config.max_length
    return_dict = generation_config.return_dict_in_generate
    return_scores = return_dict and generation_config.output_scores
    # Per step, as transformers' beam search records them: (logits, decoder attentions, cross-attentions, decoder
    # hidden states), each for every row of the batch.
    recorded = {
        name: () if return_dict and getattr(generation_config, flag) else None
        for name, flag in (
            ("logits", "output_logits"),
            ("decoder_attentions", "output_attentions"),
            ("cross_attentions", "output_attentions"),
            ("decoder_hidden_states", "output_hidden_states"),
        )
    }
    rows, prompt_length = input_ids.shape
    batch_size = rows // num_beams
    device = input_ids.device
    beam_range = torch.arange(num_beams, device=device)
    # The longest hypothesis each sentence can grow to: its own limit (SourceLengthLimit) or the batch's.
    longest = torch.full((batch_size,), max_length - prompt_length, device=device)
    for processor in logits_processor:
        if isinstance(processor, SourceLengthLimit):
            longest = torch.minimum(longest, processor.limits.to(device) + 1 - prompt_length)

    # As transformers' greedy search and sampling do: with a static cache on an accelerator (or a `compile_config`
    # that asks for it everywhere), every step after the first runs one compiled graph.
    compile_steps = model._valid_auto_compile_criteria(model_kwargs, generation_config)  # TRANSFORMERS_PRIVATE_NAMES
    compiled_step = (
        model.get_compiled_call(rounding_as_eager(generation_config.compile_config))
        if compile_steps
        else model.__call__
    )
    # A finished sentence leaves the search, as CTranslate2 drops it: the model, the length limit and the search's own
    # tensors then hold the sentences still searched (`active`, their indices in the batch). The batch stays whole
    # where that cannot be: a static cache keeps its shape (one compiled graph), sharded models (synced_gpus) run
    # every step on every process, the per-step attentions and hidden states are returned for every row, and logits
    # processors other than the length limit may count on the batch's rows (a finished sentence then gets no
    # continuation: its log-probabilities are -inf).
    cache = model_kwargs.get("cache")
    can_drop = not (
        synced_gpus
        or compile_steps
        or (cache is not None and cache.is_compileable)
        or recorded["decoder_attentions"] is not None
        or recorded["decoder_hidden_states"] is not None
        or any(not isinstance(processor, SourceLengthLimit) for processor in logits_processor)
    )
    encoder_outputs = model_kwargs.get("encoder_outputs")
    if can_drop:
        if cache is not None and cache.get_seq_length() == 0:
            model_kwargs["cache"] = EncoderDecoderCache(BeamSearchCache(), cache.cross_attention_cache)
        # generate() repeats each sentence's encoder output for its beams; the decoder's encoder-decoder attention
        # takes it once per sentence, its beams' queries together (VaswaniAttention): a k-th of the keys, values and
        # cache.
        model_kwargs["encoder_outputs"] = BaseModelOutput(
            last_hidden_state=encoder_outputs.last_hidden_state[::num_beams]
        )
        if model_kwargs.get("attention_mask") is not None:
            model_kwargs["attention_mask"] = model_kwargs["attention_mask"][::num_beams]

    # The search, for the active sentences. Live hypotheses: one at first (the others start at -inf, so that the
    # first step does not pick k copies). Finished ones: the k best, padded to max_length.
    active = torch.arange(batch_size, device=device)
    live = input_ids.view(batch_size, num_beams, prompt_length)
    live_scores = torch.full((batch_size, num_beams), -float("inf"), device=device)
    live_scores[:, 0] = 0.0
    live_beams = torch.zeros((batch_size, num_beams, 0), dtype=torch.long, device=device)
    pad_token_id = generation_config.pad_token_id
    finished = torch.full((batch_size, num_beams, max_length), pad_token_id, device=device)
    finished_scores = torch.full((batch_size, num_beams), -float("inf"), device=device)
    finished_beams = torch.full((batch_size, num_beams, max_length - prompt_length), -1, device=device)
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)  # sentences kept in the batch once finished
    # What each sentence returns, written as it leaves the search.
    results = [finished.clone(), finished_scores.clone(), finished_beams.clone()]
    step_scores = ()

    def whole_batch(tensor: torch.Tensor, fill) -> torch.Tensor:
        """A per-row tensor of the active sentences as one of every row of the batch (`fill` for the others)."""
        if tensor.shape[0] == rows:
            return tensor
        active_rows = (active[:, None] * num_beams + beam_range).view(-1)
        return tensor.new_full((rows, *tensor.shape[1:]), fill).index_copy_(0, active_rows, tensor)

    this_peer_finished = False
    while any_peer_unfinished(this_peer_finished, synced_gpus, device):
        searched = active.shape[0]
        flat_live = live.reshape(searched * num_beams, -1)
        cur_len = flat_live.shape[1]
        next_length = 1 if model_kwargs.get("use_cache") and cur_len > prompt_length else None
        model_inputs = model.prepare_inputs_for_generation(flat_live, next_sequence_length=next_length, **model_kwargs)
        outputs = (compiled_step if cur_len > prompt_length else model)(**model_inputs, return_dict=True)
        model_kwargs = next_step_kwargs(outputs, model_kwargs)
        if synced_gpus and this_peer_finished:
            continue
        logits = outputs.logits[:, -1, :].float()
        # A finished sentence kept in the batch has no continuation, as one that left it has none.
        finished_rows = None if can_drop else done.repeat_interleave(num_beams)[:, None]
        if recorded["logits"] is not None:
            step = logits.clone() if finished_rows is None else logits.masked_fill(finished_rows, -float("inf"))
            recorded["logits"] += (whole_batch(step, -float("inf")),)
        for name in ("decoder_attentions", "cross_attentions", "decoder_hidden_states"):
            if recorded[name] is not None:
                recorded[name] += (getattr(outputs, name),)
        del outputs
        log_probs = logits_processor(flat_live, torch.log_softmax(logits, dim=-1))
        if finished_rows is not None:
            log_probs = log_probs.masked_fill(finished_rows, -float("inf"))
        if return_scores:
            step_scores += (whole_batch(log_probs, -float("inf")),)
        vocab_size = log_probs.shape[-1]

        # The 2k best continuations of the sentence's k live hypotheses.
        totals = (live_scores[:, :, None] + log_probs.view(searched, num_beams, vocab_size)).view(searched, -1)
        candidate_scores, candidate_ids = totals.topk(2 * num_beams, dim=1)
        origin = candidate_ids // vocab_size
        tokens = candidate_ids % vocab_size
        candidates = torch.cat((live.gather(1, origin[:, :, None].expand(-1, -1, cur_len)), tokens[:, :, None]), 2)
        history = live_beams.gather(1, origin[:, :, None].expand(-1, -1, live_beams.shape[2]))
        candidate_beams = torch.cat((history, (origin + active[:, None] * num_beams)[:, :, None]), 2)
        ends = stopping_criteria(candidates.view(-1, cur_len + 1), step_scores or None).view(searched, -1)
        ends &= candidate_scores > -float("inf")

        # Finished: penalised by length, merged with the earlier finished ones, the k best kept.
        penalised = candidate_scores / gnmt_length_penalty(cur_len + 1 - prompt_length, alpha)
        penalised = penalised.masked_fill(~ends, -float("inf"))
        padded = torch.nn.functional.pad(candidates, (0, max_length - cur_len - 1), value=pad_token_id)
        padded_beams = torch.nn.functional.pad(candidate_beams, (0, max_length - cur_len - 1), value=-1)
        finished_scores, keep = torch.cat((finished_scores, penalised), 1).topk(num_beams, dim=1)
        finished = torch.cat((finished, padded), 1).gather(1, keep[:, :, None].expand(-1, -1, max_length))
        finished_beams = torch.cat((finished_beams, padded_beams), 1).gather(
            1, keep[:, :, None].expand(-1, -1, finished_beams.shape[2])
        )

        # Live: the k best continuations that did not end.
        live_scores, keep = candidate_scores.masked_fill(ends, -float("inf")).topk(num_beams, dim=1)
        live = candidates.gather(1, keep[:, :, None].expand(-1, -1, cur_len + 1))
        live_beams = candidate_beams.gather(1, keep[:, :, None].expand(-1, -1, candidate_beams.shape[2]))
        source_beams, positions = origin.gather(1, keep), torch.arange(searched, device=device)

        # Done: the hypotheses it returns are finished, and no live one can still beat the worst of them (so no
        # later one can change what it returns). Log-probabilities only fall as a hypothesis grows, and lp is
        # monotonic in |Y|, so a live hypothesis' best possible score is reached at one end: now, or at the longest
        # the sentence allows.
        best_live = torch.maximum(
            live_scores[:, 0] / gnmt_length_penalty(cur_len + 1 - prompt_length, alpha),
            live_scores[:, 0] / gnmt_length_penalty(longest, alpha),
        )
        worst_returned = finished_scores[:, num_return - 1]
        done_now = (worst_returned > -float("inf")) & (best_live < worst_returned) | (
            live_scores[:, 0] == -float("inf")
        )
        if not can_drop:
            done |= done_now
            this_peer_finished = bool(done.all())
        else:
            leaving = int(done_now.sum())  # the step's one read of the device
            this_peer_finished = leaving == searched
            if leaving and not this_peer_finished:
                gone, still = done_now.nonzero().view(-1), (~done_now).nonzero().view(-1)
                for result, state in zip(results, (finished, finished_scores, finished_beams)):
                    result[active[gone]] = state[gone]
                active, longest, source_beams, positions = active[still], longest[still], source_beams[still], still
                live, live_scores, live_beams = live[still], live_scores[still], live_beams[still]
                finished, finished_scores, finished_beams = (
                    finished[still],
                    finished_scores[still],
                    finished_beams[still],
                )
                logits_processor = LogitsProcessorList(
                    SourceLengthLimit(processor.limits[still], processor.eos_token_id)
                    for processor in logits_processor
                )
                select_batch_rows(model_kwargs, still, num_beams)
        if model_kwargs.get("cache") is not None and not this_peer_finished:
            # Each kept hypothesis continues the cache row it came from, among the rows of the last step.
            beam_rows = positions[:, None] * num_beams + source_beams
            reorder_self_attention_cache(model_kwargs["cache"], beam_rows.view(-1), cur_len)

    for result, state in zip(results, (finished, finished_scores, finished_beams)):
        result[active] = state
    finished, finished_scores, finished_beams = results
    sequences = finished[:, :num_return].reshape(batch_size * num_return, max_length)
    beam_indices = finished_beams[:, :num_return].reshape(batch_size * num_return, -1)
    generated = int((beam_indices >= 0).sum(1).max())
    sequences, beam_indices = sequences[:, : prompt_length + generated], beam_indices[:, :generated]
    if not return_dict:
        return sequences
    return GenerateBeamEncoderDecoderOutput(
        sequences=sequences,
        sequences_scores=finished_scores[:, :num_return].reshape(-1) if return_scores else None,
        scores=step_scores if return_scores else None,
        beam_indices=beam_indices,
        encoder_attentions=encoder_outputs.get("attentions") if generation_config.output_attentions else None,
        encoder_hidden_states=encoder_outputs.get("hidden_states") if generation_config.output_hidden_states else None,
        cache=model_kwargs.get("cache"),
        **recorded,
    )
