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

import contextlib
import copy
import functools
from dataclasses import dataclass

import torch
import transformers
from torch import distributed
from transformers import (
    CompileConfig,
    EosTokenCriteria,
    LogitsProcessor,
    LogitsProcessorList,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StopStringCriteria,
)
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import GenerateBeamEncoderDecoderOutput, GenerateEncoderDecoderOutput
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import is_torchdynamo_compiling
from transformers.utils.generic import is_flash_attention_requested

from .decoding_kernels import compiled_kernels, decoding_attention


# Section 6.1: "maximum output length [of] input length + 50".
EXTRA_OUTPUT_TOKENS = 50

# The private names of transformers this module uses, each with why no public one serves.
TRANSFORMERS_PRIVATE_NAMES = {
    "GenerationMixin._valid_auto_compile_criteria": "generate()'s own decision to compile the decoding step "
    "(hardware, cache kind, quantization, offloading, compile_config), which transformers' decoding methods (_sample, "
    "_beam_search) ask before their loop; a decoding method passed as custom_generate asks it to compile exactly when "
    "they do",
    "GenerationConfig._get_default_generation_params": "the table Seq2SeqTrainer (predict_with_generate) fills the "
    "model's generation config from: the only way to tell its filled-in max_length from one a user set; and the "
    "defaults generate() fills in before it chooses a decoding mode, which the paper's methods choose alike",
}

# torch's private operators this module uses, each with why no public one serves.
TORCH_PRIVATE_NAMES = {
    "torch.ops.mkldnn._reorder_linear_weight": "a linear layer's weight reordered once into the layout of oneDNN's "
    "kernels, as torch's compiler reorders a frozen CPU model's (`packed_linear_layers`): torch's public linear "
    "repacks the weight at every call, which at a decoding step's few rows costs as much as the product",
    "torch.ops.mkldnn._linear_pointwise": "the linear layer of a weight so reordered: no public operator takes one",
    **dict.fromkeys(
        (
            "torch.nn.Module._forward_hooks",
            "torch.nn.Module._forward_pre_hooks",
            "torch.nn.modules.module._global_forward_hooks",
            "torch.nn.modules.module._global_forward_pre_hooks",
        ),
        "the forward hooks and pre-hooks registered, a module's own and global: no public method lists them, and a "
        "kernel that computes several modules at once must leave the step to the modules where a hook would run",
    ),
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


def generation_mode(generation_config, assistant_model=None):
    """The decoding mode `generate()` chooses for the config, with transformers' defaults filled in where it leaves a
    setting unset, as generate() fills them before choosing (a top_k of 50 makes penalty_alpha alone contrastive
    search)."""
    config = copy.deepcopy(generation_config)
    config.update(**config._get_default_generation_params(), defaults_only=True)  # TRANSFORMERS_PRIVATE_NAMES
    return config.get_generation_mode(assistant_model)


def gnmt_length_penalty(length: torch.Tensor | int, alpha: float) -> torch.Tensor | float:
    """Wu et al. (2016), eq. 14: lp(Y) = ((5 + |Y|) / 6) ** alpha."""
    return ((5 + length) / 6) ** alpha


class SourceLengthLimit(LogitsProcessor):
    """Forces `</s>` once a hypothesis holds its source's length + 50 tokens, each sentence of the batch its own.

    `limits` holds one limit per source sentence, in positions of the decoder input: the start token, then its prompt's
    left padding (which takes no position, `positions_of`) and forced prefix, then the tokens generated. The rows a
    decoding method scores (beams, returned sequences) are that sentence's rows in order, as `generate()` lays them
    out. The model's own log-probability of `</s>` is kept, so a forced ending is scored like any other. Where the
    processors before it left `</s>` no score (-inf: a processor of the caller's that lets a sentence never end), the
    limit ends the sentence all the same, at the lowest score a float holds: every decoding method then takes `</s>`
    there (greedy search's argmax, sampling, beam search's finished hypotheses), below any ending the processors allow.
    """

    def __init__(self, limits: torch.Tensor, eos_token_id: int | list[int]):
        self.limits = limits
        self.eos_token_id = eos_token_id
        # Read once here, so that the steps before any sentence's limit ask the device nothing.
        self.earliest = int(limits.min())

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        # The token chosen now is the (cur_len)-th after the start token.
        if input_ids.shape[1] < self.earliest:
            return scores
        limits = self.limits.to(input_ids.device).repeat_interleave(input_ids.shape[0] // self.limits.shape[0])
        at_limit = (limits <= input_ids.shape[1])[:, None]
        ends = scores[:, self.ends]
        # One pass over the vocabulary: the scores are a step's widest tensor, and reading them is most of its cost.
        scores = scores.masked_fill(at_limit, -float("inf"))
        scores[:, self.ends] = torch.where(at_limit, self.forced_scores(ends), ends)
        return scores

    @property
    def ends(self) -> list[int]:
        return self.eos_token_id if isinstance(self.eos_token_id, list) else [self.eos_token_id]

    def forced_scores(self, ends: torch.FloatTensor) -> torch.FloatTensor:
        """What the forced end tokens score, from their scores `ends`: the model's log-probability, or the lowest float
        where none is left."""
        return ends.masked_fill(ends == -float("inf"), torch.finfo(ends.dtype).min)

    def rows(self, sentences: torch.Tensor) -> "SourceLengthLimit":
        """The same limit for the sentences kept (their positions in the batch searched)."""
        return type(self)(self.limits[sentences], self.eos_token_id)


class ForcedEOSAtSourceLimit(SourceLengthLimit):
    """`forced_eos_token_id` where each sentence has its own limit: transformers' `ForcedEOSTokenLogitsProcessor`
    forces its tokens, scored 0, at the last position the batch's `max_length` leaves; here at each sentence's own
    last position (its `SourceLengthLimit`, or the batch's where that comes first), so that a sentence decodes in a
    batch as it decodes alone."""

    def forced_scores(self, ends: torch.FloatTensor) -> torch.FloatTensor:
        return torch.zeros_like(ends)


def per_sentence_processors(logits_processor: LogitsProcessorList) -> LogitsProcessorList:
    """The processors `generate()` built, read with the paper's limit as each sentence's own `max_length`.

    transformers' `forced_eos_token_id` then forces its tokens at each sentence's limit (`ForcedEOSAtSourceLimit`),
    and the limit comes last, after `renormalize_logits`' normalisation (which `generate()` appends after the caller's
    processors): a forced end keeps the log-probability the other processors left it, as the sentence's other tokens
    do, rather than the 0 that renormalising a single token gives."""
    limit = next((processor for processor in logits_processor if type(processor) is SourceLengthLimit), None)
    if limit is None:
        return logits_processor
    processors = LogitsProcessorList()
    for processor in logits_processor:
        if isinstance(processor, transformers.ForcedEOSTokenLogitsProcessor):
            last = torch.clamp(limit.limits, max=processor.max_length - 1)
            processor = ForcedEOSAtSourceLimit(last, processor.eos_token_id.tolist())
        if processor is not limit:
            processors.append(processor)
    processors.append(limit)
    return processors


def end_tokens(generation_config) -> list[int]:
    """The config's end tokens (`eos_token_id`, one id or a list), as a list."""
    eos = generation_config.eos_token_id
    return list(eos) if isinstance(eos, list) else [] if eos is None else [eos]


def end_filler(generation_config) -> int | None:
    """The token written after a sequence's end, as transformers' decoding methods write it: the padding token, else
    the first end token; None without either."""
    if generation_config.pad_token_id is not None:
        return generation_config.pad_token_id
    return next(iter(end_tokens(generation_config)), None)


def greedy_filler(generation_config, stopping_criteria) -> int | None:
    """The token greedy search writes after a row's end, as transformers' greedy search writes it: `end_filler`
    where a stopping criterion ends rows at end tokens; else none, and a row that another criterion ended goes on
    taking its most probable token."""
    if any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria):
        return end_filler(generation_config)
    return None


@dataclass
class DecoderPrompt:
    """The decoder prompt `generate()` decodes from: its width (the start token included, which generate() puts in
    front of a prompt that lacks it) and each row's left padding (the zeros of its `decoder_attention_mask`)."""

    width: int
    padding: torch.Tensor | int

    @classmethod
    def of(cls, decoder_input_ids, decoder_attention_mask, generation_config) -> "DecoderPrompt":
        if decoder_input_ids is None:
            return cls(1, 0)
        start = generation_config.decoder_start_token_id
        start = generation_config.bos_token_id if start is None else start
        lacks_start = start is not None and bool((decoder_input_ids[:, 0] != torch.as_tensor(start)).all())
        padding = 0
        if decoder_attention_mask is not None and decoder_attention_mask.dim() == 2:
            padding = (decoder_attention_mask == 0).sum(1)
        return cls(decoder_input_ids.shape[1] + lacks_start, padding)


@dataclass
class DefaultLimit:
    """What `generate()` decodes to where no limit is given: `max_new_tokens` for the batch and, for the paper's
    decoding, each sentence's own limit (None where the batch's is the only one)."""

    max_new_tokens: int
    per_sentence: SourceLengthLimit | None


def section_6_1_limit(source_lengths, prompt, generation_config, paper_decoding, config, synced_gpus):
    """Section 6.1's "maximum output length [of] input length + 50", where no other limit is given.

    With the paper's decoding and an end token to close a sentence with, each sentence's own: its unpadded source
    length + 50 tokens after the start token, a forced prefix included (`SourceLengthLimit`, forcing the first end
    token `generate()` was given); otherwise the batch's longest source's, for every sentence, as transformers' methods
    decode. A source's length is what its attention mask leaves, whatever form the source came in. Either way no more
    new tokens than the positions the padded prompt leaves; under `synced_gpus` the most of every process, so that
    all of them make the same steps and size their buffers (a static cache) alike.
    """
    eos_token_id = next(iter(end_tokens(generation_config)), None)
    per_sentence = paper_decoding and eos_token_id is not None
    longest, width = int(source_lengths.max()), prompt.width
    if synced_gpus:
        most = torch.tensor([longest, width], device=source_lengths.device)
        distributed.all_reduce(most, op=distributed.ReduceOp.MAX)
        longest, width = most.tolist()
    max_new_tokens = max(min(longest + EXTRA_OUTPUT_TOKENS, config.max_position_embeddings - width), 1)
    if not per_sentence:
        return DefaultLimit(max_new_tokens, None)
    limit = SourceLengthLimit(source_lengths + EXTRA_OUTPUT_TOKENS + prompt.padding, eos_token_id)
    refuse_what_keeps_the_limit_from_ending(limit, generation_config, prompt.width)
    return DefaultLimit(max_new_tokens, limit)


def refuse_what_keeps_the_limit_from_ending(limit: SourceLengthLimit, generation_config, width: int) -> None:
    """The paper's limit ends a sentence by forcing its end token: an argument that forbids that token there would
    leave the sentence no token to take, and is refused before any work."""
    if limit.eos_token_id in (generation_config.suppress_tokens or ()):
        raise ValueError(
            f"suppress_tokens holds {limit.eos_token_id}, the end token the paper's limit ends each sentence with: "
            "pass max_new_tokens, a limit that needs no end token."
        )
    # `limit.earliest` counts the decoder input's tokens, as min_length does; min_new_tokens counts those after it,
    # and takes min_length's place where both are given (transformers' `_prepare_generated_length`).
    if generation_config.min_new_tokens is None:
        name, earliest_end = "min_length", generation_config.min_length or 0
    else:
        name, earliest_end = "min_new_tokens", width + generation_config.min_new_tokens
    if earliest_end > limit.earliest:
        raise ValueError(
            f"{name}={getattr(generation_config, name)} keeps a sentence from ending at the paper's limit of its "
            "source length + 50 tokens: pass max_new_tokens, a limit for every sentence."
        )


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


def on_host(tensor: torch.Tensor) -> bool:
    """Whether the values of `tensor` can be read without the host waiting for a device: a CPU tensor, outside
    `torch.compile`. The model checks the values of its ids only then (a read of a GPU tensor stalls the host until
    the GPU catches up, on every call); the training recipe checks its batches on the host before they move to a
    device (`vaswani.training.padding.batch_to_device`); the paper's beam search skips a step's settling where no
    candidate ends."""
    return tensor.device.type == "cpu" and not is_torchdynamo_compiling()


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
    """A decoder self-attention cache layer for beam search, which writes each step in place.

    `DynamicLayer` appends a step's keys and values by concatenation, a copy of the whole cache. Here keys and values
    live in one buffer with room for the steps to come: a step writes its position in place, and the hypotheses that
    took a row from another one are copied into it there (`copy_cache_rows`); only sentences leaving the search
    gather the rows kept into a new buffer. `keys` and `values` are views of the filled positions, as `DynamicLayer`'s
    tensors are read (of the first d_k and d_v dimensions, where a model's keys and values differ in size: Table 3,
    row (B)).
    """

    room = 32  # positions allocated ahead, each time the buffer fills up

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.filled, self.buffer = 0, None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        positions = key_states.shape[-2]
        self.make_room(key_states, value_states, positions)
        self.buffer[0, :, :, self.filled : self.filled + positions, : self.key_size] = key_states
        self.buffer[1, :, :, self.filled : self.filled + positions, : self.value_size] = value_states
        self.advance(positions)
        return self.keys, self.values

    def make_room(self, key_states: torch.Tensor, value_states: torch.Tensor, positions: int) -> None:
        """A buffer with room for `positions` more, of the rows, heads and sizes of `key_states` and `value_states`."""
        end = self.filled + positions
        if self.buffer is None or end > self.buffer.shape[3]:
            rows, heads = key_states.shape[:2]
            shape = (2, rows, heads, end + self.room, max(key_states.shape[-1], value_states.shape[-1]))
            buffer = key_states.new_empty(shape)
            if self.buffer is not None:
                buffer[:, :, :, : self.filled] = self.buffer[:, :, :, : self.filled]
            self.buffer = buffer
            self.key_size, self.value_size = key_states.shape[-1], value_states.shape[-1]

    def advance(self, positions: int) -> None:
        """Count `positions` more as filled (written in the buffer)."""
        self.filled += positions
        self.show_filled()

    def show_filled(self) -> None:
        """Point `keys` and `values` at the filled positions of the buffer."""
        self.keys = self.buffer[0, :, :, : self.filled, : self.key_size]
        self.values = self.buffer[1, :, :, : self.filled, : self.value_size]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep row `beam_idx[i]` as row i (fewer rows where sentences left the batch)."""
        buffer = self.buffer.new_empty((2, beam_idx.shape[0], *self.buffer.shape[2:]))
        self.copy_rows(buffer, beam_idx, torch.arange(beam_idx.shape[0], device=beam_idx.device))
        self.buffer = buffer
        self.show_filled()

    def copy_rows(self, buffer: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Rows `sources` of the buffer's filled positions into rows `targets` of `buffer` (this one's, or another of
        its layout; where this one's, no row both): on the CPU by vaswani's kernel, in one pass."""
        kernels = compiled_kernels() if buffer.device.type == "cpu" else None
        if kernels is not None:
            kernels.copy_cache_rows(self.buffer, buffer, sources.contiguous(), targets.contiguous(), self.filled)
        else:
            held = buffer[:, :, :, : self.filled]
            held.index_copy_(1, targets, self.buffer[:, :, :, : self.filled].index_select(1, sources))


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


def copy_cache_rows(cache, sources: torch.Tensor, targets: torch.Tensor, filled: int) -> None:
    """Give rows `targets` of the decoder's self-attention cache the keys and values of rows `sources` (no row both),
    in place, for the `filled` positions it holds; the other rows keep theirs. A layer of a kind that holds its keys
    and values otherwise (quantized, offloaded) is reordered whole, by its own method."""
    for layer in cache.self_attention_cache.layers:
        if type(layer) is BeamSearchCacheLayer:
            layer.copy_rows(layer.buffer, sources, targets)
        elif layer.is_compileable or type(layer) is DynamicLayer:
            for states in (layer.keys, layer.values):
                held = states[:, :, :filled]
                held.index_copy_(0, targets, held.index_select(0, sources))
        else:
            rows = torch.arange(layer.keys.shape[0], device=targets.device)
            layer.reorder_cache(rows.index_copy(0, targets, sources))


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


# transformers' stopping criteria that judge each row by its own tokens alone, whatever rows a step holds.
ROW_BY_ROW_CRITERIA = (MaxLengthCriteria, MaxTimeCriteria, EosTokenCriteria, StopStringCriteria)


def sentences_can_leave(
    model, model_kwargs, logits_processor, stopping_criteria, synced_gpus, recorded, num_beams
) -> bool:
    """Whether a finished sentence may leave the search, as CTranslate2 drops it: the model, the length limit and the
    search's own tensors then hold the sentences still searched. The batch stays whole where that cannot be: a static
    cache keeps its shape (one compiled graph), sharded models (synced_gpus) run every step on every process, the
    per-step logits, attentions and hidden states are returned for every row, and logits processors other than the length
    limit and stopping criteria other than transformers' row-by-row ones may count on the batch's rows (a finished
    sentence then gets no continuation: its log-probabilities are -inf). Where sentences leave, their hypotheses
    share one encoder output (`share_encoder_output`), which FlashAttention would take, a sentence's hypotheses being
    one sequence of queries, for a sequence to mask with the source's padding mask."""
    cache = model_kwargs.get("cache")
    return not (
        synced_gpus
        or (cache is not None and cache.is_compileable)
        or recorded["decoder_attentions"] is not None
        or recorded["decoder_hidden_states"] is not None
        or recorded["logits"] is not None
        or any(not isinstance(processor, SourceLengthLimit) for processor in logits_processor)
        or any(not isinstance(criterion, ROW_BY_ROW_CRITERIA) for criterion in stopping_criteria)
        or (num_beams > 1 and is_flash_attention_requested(model.config))
    )


def rows_kept(logits_processor, rows: torch.Tensor) -> LogitsProcessorList:
    """The length limits (`sentences_can_leave`: the only processors where sentences leave) of the rows kept."""
    return LogitsProcessorList(processor.rows(rows) for processor in logits_processor)


def decoding_step(model, model_kwargs, generation_config):
    """What runs the steps after the first: one compiled graph where transformers' greedy search and sampling compile
    theirs (a static cache on an accelerator, or a `compile_config` that asks for it everywhere), else the model."""
    if not model._valid_auto_compile_criteria(model_kwargs, generation_config):  # TRANSFORMERS_PRIVATE_NAMES
        return model.__call__
    return model.get_compiled_call(rounding_as_eager(generation_config.compile_config))


def packs_linear_layers(model) -> bool:
    """Whether `packed_linear_layers` computes the model's linear layers: on an x86 CPU with oneDNN, without
    gradients, in float32, or bfloat16 where the CPU has its instructions (`torch.ops.mkldnn._reorder_linear_weight`
    refuses it otherwise, and the layers stay torch's)."""
    return (
        model.device.type == "cpu"
        and model.dtype in (torch.float32, torch.bfloat16)
        and not torch.is_grad_enabled()
        and torch.backends.mkldnn.is_available()
        and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    )


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None, inputs: torch.Tensor) -> torch.Tensor:
    """x W^T + b by oneDNN, from W packed for its kernels."""
    return torch.ops.mkldnn._linear_pointwise(inputs, weight, bias, "none", [], "")  # TORCH_PRIVATE_NAMES


@contextlib.contextmanager
def packed_linear_layers(model, parts: list, enabled: bool):
    """The linear layers of `parts` (modules of `model`) computed from weights packed once for the CPU's matrix
    kernels, within the block: torch's linear layer repacks the weight at every call, half the time of a decoding
    step's products at the main job's sizes and about 40% of the encoder's at its batches of 32 sentences. generate()
    packs the encoder's for its one call (`VaswaniForConditionalGeneration.generate`), the paper's searches the
    decoder's and the output layer's for their steps. The packed copies, as large as the weights, live for the block
    only, so a change to the weights is never missed. A layer of another kind (quantized, an adapter's) or with a
    forward of its own (a hook's) is left as it is; so is every layer where `enabled` is false or `packs_linear_layers`
    says no."""
    layers = []
    if enabled and packs_linear_layers(model):
        modules = [module for part in parts for module in part.modules()]
        layers = [module for module in modules if type(module) is torch.nn.Linear and "forward" not in vars(module)]
    packed = {}
    try:
        for layer in layers:
            try:
                weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), None)  # TORCH_PRIVATE_NAMES
            except RuntimeError:  # no bfloat16 instructions on this CPU
                break
            layer.forward = functools.partial(packed_linear, weight, layer.bias)
            packed[layer] = weight
        yield packed
    finally:
        for layer in packed:
            del layer.forward


def steps_attention_kernel(model) -> bool:
    """Whether `decoding_attention_kernel` computes the decoder's attention at one-token steps: on the CPU, without
    gradients, in float32 or bfloat16, where the model's attention is torch's kernel (`sdpa`, transformers' default)
    and vaswani's kernels could be built (`compiled_kernels`). Eager attention, asked for its weights, stays eager."""
    return (
        model.device.type == "cpu"
        and model.dtype in (torch.float32, torch.bfloat16)
        and not torch.is_grad_enabled()
        and model.config._attn_implementation == "sdpa"
        and compiled_kernels() is not None
    )


@contextlib.contextmanager
def decoding_attention_kernel(model, enabled: bool):
    """The decoder's attention at one-token steps computed by vaswani's CPU kernel within the block
    (modeling/decoding_kernels.py): a step's self-attention and encoder-decoder attention read their keys and values
    in one pass, where torch's kernel takes 1.6 to 1.9 times as long. Nothing changes where `enabled` is false or
    `steps_attention_kernel` says no."""
    attentions = []
    if enabled and steps_attention_kernel(model):
        attentions = [module for module in model.get_decoder().modules() if hasattr(module, "step_attention")]
    try:
        for attention in attentions:
            attention.step_attention = decoding_attention
        yield
    finally:
        for attention in attentions:
            attention.step_attention = None


def hooked(modules) -> bool:
    """Whether a forward hook or pre-hook, of a module's own or global, would run at any of `modules`' calls."""
    hooks = torch.nn.modules.module  # TORCH_PRIVATE_NAMES
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return True
    return any(module._forward_hooks or module._forward_pre_hooks for module in modules)


class DecoderLayersStep:
    """The decoder's layers at a one-token step as one call of vaswani's CPU kernel (`decoder_layers_step`,
    modeling/decoding_kernels.py): the operators their modules call, in their order, with no module, mask or Python
    between them, so that the step's output is theirs bit for bit. It takes a step where the layers' modules would
    compute nothing else: nothing recorded (attentions, hidden states), the self-attention cache the searches' own
    (`BeamSearchCacheLayer`), the encoder-decoder keys and values already projected, and padding masks (none, or
    (batch, length)); else it returns None and the modules compute the step. A single query's causal mask is its
    padding mask, so the masks are read as given, as transformers' masks for torch's kernel would hold them."""

    def __init__(self, decoder, packed: dict):
        self.config, self.kernel = decoder.config, compiled_kernels().decoder_layers_step
        self.linears = [tensor for linear in self.linear_layers(decoder) for tensor in (packed[linear], linear.bias)]
        self.norms = [
            tensor
            for layer in decoder.layers
            for norm in (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm)
            for tensor in (norm.weight, norm.bias)
        ]
        attention = decoder.layers[0].self_attn
        self.eps = decoder.layers[0].self_attn_layer_norm.eps
        self.sizes = (self.config.decoder_attention_heads, attention.head_dim, attention.value_head_dim)
        self.scaling = attention.scaling

    @staticmethod
    def linear_layers(decoder) -> list:
        """The decoder layers' linear layers in the kernel's order, 8 a layer."""
        linears = []
        for layer in decoder.layers:
            attention, cross, feed_forward = layer.self_attn, layer.encoder_attn, layer.feed_forward
            linears += [attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj]
            linears += [cross.q_proj, cross.out_proj, feed_forward.fc1, feed_forward.fc2]
        return linears

    def __call__(self, hidden_states, attention_mask, encoder_attention_mask, cache, **kwargs) -> torch.Tensor | None:
        recording = any(
            kwargs.get(flag, getattr(self.config, flag)) for flag in ("output_attentions", "output_hidden_states")
        )
        if recording or cache is None or len(cache.self_attention_cache.layers) != self.config.decoder_layers:
            return None
        layers = cache.self_attention_cache.layers
        if any(type(layer) is not BeamSearchCacheLayer for layer in layers):
            return None
        if not all(cache.is_updated.get(index) for index in range(len(layers))):
            return None
        if any(mask is not None and mask.dim() != 2 for mask in (attention_mask, encoder_attention_mask)):
            return None
        for layer in layers:
            layer.make_room(layer.keys, layer.values, 1)
        cross = [tensor for layer in cache.cross_attention_cache.layers for tensor in (layer.keys, layer.values)]
        hidden_states = self.kernel(
            hidden_states,
            self.linears,
            self.norms,
            self.eps,
            [layer.buffer for layer in layers],
            layers[0].filled,
            cross,
            *(
                None if mask is None else mask[:, None, None, :].bool()
                for mask in (attention_mask, encoder_attention_mask)
            ),
            *self.sizes,
            self.scaling,
        )
        for layer in layers:
            layer.advance(1)
        return hidden_states


@contextlib.contextmanager
def decoder_layers_kernel(model, packed: dict, enabled: bool):
    """The decoder's layers at one-token steps computed by one kernel call within the block (`DecoderLayersStep`):
    at the few rows of a step, their modules' Python costs as much as their operators. Nothing changes where `enabled`
    is false, the attention kernel does not apply (`steps_attention_kernel`), a linear layer of theirs is not packed
    (`packed`, from `packed_linear_layers`: a quantized or an adapter's layer), their activation is not the paper's
    ReLU, the model trains (dropout), or a hook would run at one of their modules."""
    decoder = model.get_decoder()
    modules = list(decoder.layers.modules())
    usable = (
        enabled
        and steps_attention_kernel(model)
        and not decoder.training
        and model.config.activation_function == "relu"
        and all(linear in packed for linear in DecoderLayersStep.linear_layers(decoder))
        and not hooked(modules)
    )
    try:
        if usable:
            decoder.step_layers = DecoderLayersStep(decoder, packed)
        yield
    finally:
        decoder.step_layers = None


@contextlib.contextmanager
def cpu_step_kernels(model, enabled: bool):
    """The CPU's ways to a fast one-token step within the block, each where it applies: packed linear layers, the
    attention kernel and the decoder layers' kernel."""
    with (
        packed_linear_layers(model, [model.get_decoder(), model.get_output_embeddings()], enabled) as packed,
        decoding_attention_kernel(model, enabled),
        decoder_layers_kernel(model, packed, enabled),
    ):
        yield


def returned_cache(cache):
    """The decoder's cache as transformers' decoding methods return it: the self-attention cache a plain
    `DynamicCache` of the keys and values held, so that every method of the cache API (crop, batch selection and
    repetition, reset, offloading) works on it as on any other."""
    if cache is None or not isinstance(cache.self_attention_cache, BeamSearchCache):
        return cache
    held = [(layer.keys, layer.values) for layer in cache.self_attention_cache.layers]
    return EncoderDecoderCache(DynamicCache(held), cache.cross_attention_cache)


def share_encoder_output(model_kwargs: dict, num_beams: int) -> None:
    """Give the decoder each sentence's encoder output once, and the beam search's own self-attention cache.

    generate() repeats each sentence's encoder output for its beams; the decoder's encoder-decoder attention takes it
    once per sentence, its beams' queries together (VaswaniAttention): a k-th of the keys, values and cache. The
    self-attention cache writes each step in place and reorders beams in one copy (`BeamSearchCacheLayer`)."""
    cache = model_kwargs.get("cache")
    if cache is not None and cache.get_seq_length() == 0:
        model_kwargs["cache"] = EncoderDecoderCache(BeamSearchCache(), cache.cross_attention_cache)
    encoder_outputs = model_kwargs["encoder_outputs"]
    model_kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=encoder_outputs.last_hidden_state[::num_beams])
    if model_kwargs.get("attention_mask") is not None:
        model_kwargs["attention_mask"] = model_kwargs["attention_mask"][::num_beams]


def best_first(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k highest scores of each row and their positions, best first; equal scores in the order they stand, on
    every device (top-k leaves the order of a tie to its kernel): a processor that forces several tokens to one score
    ties their candidates, and the earlier hypothesis, then the lower token, comes first."""
    scores, positions = scores.sort(dim=1, descending=True, stable=True)
    return scores[:, :k], positions[:, :k]


def no_forced_ending(scores: torch.Tensor) -> torch.Tensor:
    """Scores with the endings the limit forced where no processor allowed one (the lowest float,
    `SourceLengthLimit`) at -inf: the search returns only hypotheses with a probability, so those are none. Summed
    with a hypothesis' log-probability, such an ending stays at or below the lowest float, under every real score: the
    2k best continuations hold them only where fewer real ones are left, so the search reads them there alone."""
    return scores.masked_fill(scores <= torch.finfo(scores.dtype).min, -float("inf"))


def best_continuations(log_probs, row_scores, held, count) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `count` best one-token continuations of each sentence's live hypotheses: `log_probs` (sentences, width,
    vocabulary), where row r of a sentence extends its hypothesis `held[:, r]`, of summed log-probability
    `row_scores[:, r]`. Returns their summed scores, best first (`no_forced_ending`); the row each extends; and their
    ids, hypothesis * vocabulary + token, which order equal scores (the earlier hypothesis, then the lower token). On
    the CPU, vaswani's kernel (modeling/decoding_kernels.py) reads the log-probabilities once and gives the same,
    choosing among candidates equal at the last place by id, where torch's top-k leaves the choice to its kernel."""
    fits = log_probs.device.type == "cpu" and log_probs.stride(-1) == 1
    fits &= log_probs.dtype == row_scores.dtype == torch.float32  # float64 scores, under float64 as torch's default
    kernels = compiled_kernels() if fits else None
    if kernels is not None:
        return tuple(kernels.best_continuations(log_probs, row_scores, held, count))
    sentences, width, vocab_size = log_probs.shape
    scores, positions = (row_scores[:, :, None] + log_probs).view(sentences, -1).topk(count, dim=1)
    rows, tokens = positions // vocab_size, positions % vocab_size
    ids, by_id = (held.gather(1, rows) * vocab_size + tokens).sort(dim=1)
    scores, order = best_first(no_forced_ending(scores.gather(1, by_id)), count)
    return scores, rows.gather(1, by_id).gather(1, order), ids.gather(1, order)


@dataclass
class Candidates:
    """The 2k best one-token continuations of a sentence's k live hypotheses, best first, per sentence searched:
    their summed log-probabilities, the live hypothesis each extends and the row of the sentence's k that holds it,
    their tokens (start token included) and the batch row each of their tokens came from (`beam_indices`)."""

    scores: torch.Tensor  # (sentences, 2k)
    origin: torch.Tensor  # (sentences, 2k), the live hypothesis extended, 0..k-1, best first
    rows: torch.Tensor  # (sentences, 2k), the row of the sentence's k that holds it (`BeamSearchState.held`)
    sequences: torch.Tensor  # (sentences, 2k, length)
    beams: torch.Tensor  # (sentences, 2k, steps)

    def end(self, stopping_criteria, step_scores: tuple) -> torch.Tensor:
        """Which candidates end: where a stopping criterion says so (an end token, a limit) and a score is left."""
        searched, width, length = self.sequences.shape
        ends = stopping_criteria(self.sequences.view(-1, length), step_scores or None).view(searched, width)
        return ends & (self.scores > -float("inf"))


@dataclass
class BeamSearchState:
    """The hypotheses of the sentences still searched, one row per sentence: `active` holds their indices in the
    batch, `longest` the longest hypothesis each may grow to; the k live ones, best first (their tokens, summed
    log-probabilities and source rows), and the k best finished ones (padded to max_length with `fill`, their scores
    divided by lp(|Y|)). `held` says which live hypothesis each of the sentence's k rows of the decoder holds: a
    hypothesis stays in the row of the one it extends where it is the first to extend it (`follow`), so that the
    decoder's cache moves only for the others. `batch_size` counts every sentence of the batch; `scores_fall` says
    whether log-probabilities only fall as a hypothesis grows (`settled`)."""

    batch_size: int
    fill: int
    scores_fall: bool
    active: torch.Tensor
    longest: torch.Tensor
    live: torch.Tensor
    live_scores: torch.Tensor
    live_beams: torch.Tensor
    held: torch.Tensor
    finished: torch.Tensor
    finished_scores: torch.Tensor
    finished_beams: torch.Tensor

    @classmethod
    def start(cls, input_ids, generation_config, logits_processor) -> "BeamSearchState":
        """One live hypothesis per sentence, the prompt (the others start at -inf, so that the first step does not
        pick k copies of one continuation); no finished one. The finished ones are padded as transformers pads
        (`end_filler`; -1 where there is nothing to pad with, as its beam search does)."""
        rows, prompt_length = input_ids.shape
        num_beams, max_length = generation_config.num_beams, generation_config.max_length
        fill = end_filler(generation_config)
        fill = -1 if fill is None else fill
        batch_size, device = rows // num_beams, input_ids.device
        live_scores = torch.full((batch_size, num_beams), -float("inf"), device=device)
        live_scores[:, 0] = 0.0
        longest = longest_hypotheses(logits_processor, batch_size, max_length - prompt_length, prompt_length, device)
        return cls(
            batch_size=batch_size,
            fill=fill,
            scores_fall=all(isinstance(processor, SCORE_LOWERING_PROCESSORS) for processor in logits_processor),
            active=torch.arange(batch_size, device=device),
            longest=longest,
            live=input_ids.view(batch_size, num_beams, prompt_length),
            live_scores=live_scores,
            live_beams=torch.zeros((batch_size, num_beams, 0), dtype=torch.long, device=device),
            held=torch.arange(num_beams, device=device).repeat(batch_size, 1),
            finished=torch.full((batch_size, num_beams, max_length), fill, device=device),
            finished_scores=torch.full((batch_size, num_beams), -float("inf"), device=device),
            finished_beams=torch.full((batch_size, num_beams, max_length - prompt_length), -1, device=device),
        )

    @property
    def returned(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.finished, self.finished_scores, self.finished_beams

    def in_rows(self) -> torch.Tensor:
        """The live hypotheses' tokens as the decoder's rows hold them, (searched, k, length)."""
        return self.live.gather(1, self.held[:, :, None].expand(-1, -1, self.live.shape[2]))

    def continuations(self, log_probs: torch.Tensor) -> Candidates:
        """Section 6.1's beam of k: the 2k best continuations of the k live hypotheses, so that k of them survive
        even when up to k end at this step. `log_probs` has the decoder's rows (`in_rows`)."""
        searched, num_beams, cur_len = self.live.shape
        vocab_size = log_probs.shape[-1]
        row_scores = self.live_scores.gather(1, self.held)
        scores, rows, ids = best_continuations(
            log_probs.view(searched, num_beams, vocab_size), row_scores, self.held, 2 * num_beams
        )
        origin, tokens = ids // vocab_size, ids % vocab_size
        sequences = torch.cat((self.live.gather(1, origin[:, :, None].expand(-1, -1, cur_len)), tokens[:, :, None]), 2)
        history = self.live_beams.gather(1, origin[:, :, None].expand(-1, -1, self.live_beams.shape[2]))
        beams = torch.cat((history, (rows + self.active[:, None] * num_beams)[:, :, None]), 2)
        return Candidates(scores, origin, rows, sequences, beams)

    def settle_finished(self, candidates: Candidates, ends: torch.Tensor, length: int, alpha: float):
        """The candidates that end (`ends`) join the finished hypotheses with their score divided by the GNMT length
        penalty lp(|Y|) (Wu et al., 2016), and the k best finished ones are kept: fewer where fewer have finished, the
        other slots padding, scored -inf."""
        num_beams, max_length = self.finished.shape[1:]
        padding = max_length - candidates.sequences.shape[2]
        penalised = (candidates.scores / gnmt_length_penalty(length, alpha)).masked_fill(~ends, -float("inf"))
        padded = torch.nn.functional.pad(candidates.sequences, (0, padding), value=self.fill)
        padded_beams = torch.nn.functional.pad(candidates.beams, (0, padding), value=-1)
        self.finished_scores, keep = best_first(torch.cat((self.finished_scores, penalised), 1), num_beams)
        # A slot no hypothesis has finished in (-inf) holds padding, whichever -inf candidate the top-k tie put there.
        empty = (self.finished_scores == -float("inf"))[:, :, None]
        self.finished = (
            torch.cat((self.finished, padded), 1)
            .gather(1, keep[:, :, None].expand(-1, -1, max_length))
            .masked_fill(empty, self.fill)
        )
        self.finished_beams = (
            torch.cat((self.finished_beams, padded_beams), 1)
            .gather(1, keep[:, :, None].expand(-1, -1, self.finished_beams.shape[2]))
            .masked_fill(empty, -1)
        )

    def keep_live(self, candidates: Candidates, ends: torch.Tensor) -> torch.Tensor:
        """The k best candidates that did not end stay live; returns which they are (their positions among the
        candidates)."""
        num_beams = self.live.shape[1]
        self.live_scores, keep = best_first(candidates.scores.masked_fill(ends, -float("inf")), num_beams)
        self.live = candidates.sequences.gather(1, keep[:, :, None].expand(-1, -1, candidates.sequences.shape[2]))
        self.live_beams = candidates.beams.gather(1, keep[:, :, None].expand(-1, -1, candidates.beams.shape[2]))
        return keep

    def follow(self, parents: torch.Tensor) -> torch.Tensor:
        """Give the live hypotheses, which extend those the decoder's rows `parents` hold, their rows: each the row of
        the one it extends where it is the first to extend it, the others, best first, the rows no hypothesis extends,
        in order. Returns, for each row of each sentence searched, the row whose cache it continues."""
        searched, num_beams = parents.shape
        earlier = torch.ones(num_beams, num_beams, dtype=torch.bool, device=parents.device).tril(-1)
        first = ~((parents[:, :, None] == parents[:, None, :]) & earlier).any(2)
        extended = torch.zeros_like(first).scatter_(1, parents, True)
        unextended = extended.long().argsort(dim=1, stable=True)  # the rows no hypothesis extends first, in order
        rows = torch.where(first, parents, unextended.gather(1, ((~first).long().cumsum(1) - 1).clamp(min=0)))
        ranks = torch.arange(num_beams, device=parents.device).expand(searched, -1)
        self.held = torch.empty_like(self.held).scatter_(1, rows, ranks)
        return ranks.clone().scatter_(1, rows, parents)

    def settled(self, length: int, alpha: float, num_return: int) -> torch.Tensor:
        """Which sentences are done: the hypotheses they return are finished, and no live one can still beat the
        worst of them, so no later step can change what they return (or no live hypothesis is left).

        Log-probabilities only fall as a hypothesis grows (`scores_fall`: no logits processor lifts one above 0),
        and lp is monotonic in |Y|, so a live hypothesis' best possible score is reached at one end: now, or at the
        longest the sentence allows. The search thus ends exactly, not on a heuristic; where a processor may lift a
        score, no bound holds, and a sentence is searched until no live hypothesis is left."""
        no_live = self.live_scores[:, 0] == -float("inf")
        if not self.scores_fall:
            return no_live
        best_live = torch.maximum(
            self.live_scores[:, 0] / gnmt_length_penalty(length, alpha),
            self.live_scores[:, 0] / gnmt_length_penalty(self.longest, alpha),
        )
        worst_returned = self.finished_scores[:, num_return - 1]
        return (worst_returned > -float("inf")) & (best_live < worst_returned) | no_live

    def leave(self, done: torch.Tensor, results: list[torch.Tensor]) -> torch.Tensor:
        """The done sentences leave the search: what they return is written into `results` (finished hypotheses,
        scores, beam indices of the whole batch); returns the positions, among those searched, of the ones that stay."""
        gone, still = done.nonzero().view(-1), (~done).nonzero().view(-1)
        for result, state in zip(results, self.returned):
            result[self.active[gone]] = state[gone]
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value[still])
        return still

    def whole_batch(self, tensor: torch.Tensor) -> torch.Tensor:
        """A per-row tensor of the sentences searched as one of every row of the batch (-inf for the others)."""
        num_beams = self.live.shape[1]
        if tensor.shape[0] == self.batch_size * num_beams:
            return tensor
        rows = (self.active[:, None] * num_beams + torch.arange(num_beams, device=tensor.device)).view(-1)
        whole = tensor.new_full((self.batch_size * num_beams, *tensor.shape[1:]), -float("inf"))
        return whole.index_copy_(0, rows, tensor)


@dataclass
class BeamStep:
    """One step of the search, for the sentences still searched (`sentences`, their indices in the batch): the 2k
    candidates, best first, with the tokens they generated and their summed log-probabilities; which of them ended
    (and so were offered to the finished hypotheses), which stayed live (the k best of the others; the rest were
    dropped), and the scores of the k best finished hypotheses after the step (divided by lp(|Y|), -inf where fewer
    have finished)."""

    sentences: torch.Tensor  # (searched,)
    tokens: torch.Tensor  # (searched, 2k, generated)
    scores: torch.Tensor  # (searched, 2k)
    ended: torch.Tensor  # (searched, 2k), bool
    live: torch.Tensor  # (searched, 2k), bool
    finished_scores: torch.Tensor  # (searched, k)

    @classmethod
    def of(cls, state: BeamSearchState, candidates: Candidates, ends: torch.Tensor, kept: torch.Tensor, prompt: int):
        # The k kept are the best that did not end; where fewer are left, the rest of them are no hypotheses.
        live = torch.zeros_like(ends).scatter_(1, kept, True) & (candidates.scores > -float("inf")) & ~ends
        return cls(
            sentences=state.active.cpu(),
            tokens=candidates.sequences[:, :, prompt:].cpu(),
            scores=candidates.scores.cpu(),
            ended=ends.cpu(),
            live=live.cpu(),
            finished_scores=state.finished_scores.cpu(),
        )


def step_records(generation_config) -> dict:
    """What is recorded at each step, as transformers' beam search records it for every row of the batch: the
    logits, the decoder's attentions, cross-attentions and hidden states (a tuple each where asked for, else None)."""
    return_dict = generation_config.return_dict_in_generate
    return {
        name: () if return_dict and getattr(generation_config, flag) else None
        for name, flag in (
            ("logits", "output_logits"),
            ("decoder_attentions", "output_attentions"),
            ("cross_attentions", "output_attentions"),
            ("decoder_hidden_states", "output_hidden_states"),
        )
    }


# transformers' logits processors that leave a log-probability at or below 0: they mask tokens, scale scores by a
# positive penalty (keeping their sign) or renormalise them; the paper's limit masks too.
SCORE_LOWERING_PROCESSORS = (
    SourceLengthLimit,
    transformers.EncoderNoRepeatNGramLogitsProcessor,
    transformers.EncoderRepetitionPenaltyLogitsProcessor,
    transformers.ForcedBOSTokenLogitsProcessor,
    transformers.ForcedEOSTokenLogitsProcessor,
    transformers.LogitNormalization,
    transformers.MinLengthLogitsProcessor,
    transformers.MinNewTokensLengthLogitsProcessor,
    transformers.NoBadWordsLogitsProcessor,
    transformers.NoRepeatNGramLogitsProcessor,
    transformers.PrefixConstrainedLogitsProcessor,
    transformers.RepetitionPenaltyLogitsProcessor,
    transformers.SuppressTokensAtBeginLogitsProcessor,
    transformers.SuppressTokensLogitsProcessor,
)


def record_step(recorded: dict, outputs, logits: torch.Tensor) -> None:
    """Records what `step_records` asks for of a step, for every row (the batch stays whole where they are asked for),
    as transformers' beam search records them: the model's logits, the decoder's attentions and hidden states. A
    finished sentence's rows go on being decoded (scored -inf, as no continuation of theirs counts); their logits are
    the model's for what they hold."""
    if recorded["logits"] is not None:
        recorded["logits"] += (logits.clone(),)
    for name in ("decoder_attentions", "cross_attentions", "decoder_hidden_states"):
        if recorded[name] is not None:
            recorded[name] += (getattr(outputs, name),)


def longest_hypotheses(logits_processor, batch_size: int, batch_limit: int, prompt_length: int, device):
    """The most tokens each sentence's hypotheses can grow to: its own limit (`SourceLengthLimit`, section 6.1) or
    the batch's."""
    longest = torch.full((batch_size,), batch_limit, device=device)
    for processor in logits_processor:
        if isinstance(processor, SourceLengthLimit):
            longest = torch.minimum(longest, processor.limits.to(device) + 1 - prompt_length)
    return longest


def beam_search_output(results, prompt_length, generation_config, step_scores, encoder_outputs, cache, recorded):
    """What `generate()` returns: the `num_return_sequences` best finished hypotheses of each sentence, best first,
    cut to the longest of them; with `return_dict_in_generate`, transformers' beam search output."""
    finished, finished_scores, finished_beams = results
    batch_size, _, max_length = finished.shape
    num_return = generation_config.num_return_sequences or 1
    return_scores = generation_config.return_dict_in_generate and generation_config.output_scores
    sequences = finished[:, :num_return].reshape(batch_size * num_return, max_length)
    beam_indices = finished_beams[:, :num_return].reshape(batch_size * num_return, -1)
    generated = int((beam_indices >= 0).sum(1).max())
    sequences, beam_indices = sequences[:, : prompt_length + generated], beam_indices[:, :generated]
    if not generation_config.return_dict_in_generate:
        return sequences
    return GenerateBeamEncoderDecoderOutput(
        sequences=sequences,
        sequences_scores=finished_scores[:, :num_return].reshape(-1) if return_scores else None,
        scores=step_scores if return_scores else None,
        beam_indices=beam_indices,
        encoder_attentions=encoder_outputs.get("attentions") if generation_config.output_attentions else None,
        encoder_hidden_states=encoder_outputs.get("hidden_states") if generation_config.output_hidden_states else None,
        cache=returned_cache(cache),
        **recorded,
    )


def gnmt_beam_search(
    model,
    input_ids,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus=False,
    beam_steps=None,
    **model_kwargs,
):
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
    `beam_steps`, a list (a `generate()` argument): a `BeamStep` is appended to it at every step, the search at work.
    With `synced_gpus` every process makes the same forward passes until all of them are done (`any_peer_unfinished`).
    """
    num_beams = generation_config.num_beams
    num_return = generation_config.num_return_sequences or 1
    alpha = generation_config.length_penalty
    recorded = step_records(generation_config)
    logits_processor = per_sentence_processors(logits_processor)
    prompt_length, device = input_ids.shape[1], input_ids.device
    compiled_step = decoding_step(model, model_kwargs, generation_config)
    can_drop = sentences_can_leave(
        model, model_kwargs, logits_processor, stopping_criteria, synced_gpus, recorded, num_beams
    )
    encoder_outputs = model_kwargs.get("encoder_outputs")
    if can_drop:
        share_encoder_output(model_kwargs, num_beams)
    state = BeamSearchState.start(input_ids, generation_config, logits_processor)
    results = [tensor.clone() for tensor in state.returned]  # what each sentence returns, written as it leaves
    done = torch.zeros(state.batch_size, dtype=torch.bool, device=device)  # sentences kept in the batch once finished
    step_scores = ()

    this_peer_finished = False
    eager = compiled_step == model.__call__
    with cpu_step_kernels(model, eager):
        while any_peer_unfinished(this_peer_finished, synced_gpus, device):
            searched, _, cur_len = state.live.shape
            flat_live = state.in_rows().reshape(searched * num_beams, -1)
            # A process done before the others (synced_gpus) feeds its last tokens again: a step that counts nothing.
            next_length = (
                1 if model_kwargs.get("use_cache") and (cur_len > prompt_length or this_peer_finished) else None
            )
            model_inputs = model.prepare_inputs_for_generation(
                flat_live, next_sequence_length=next_length, **model_kwargs
            )
            outputs = (compiled_step if cur_len > prompt_length else model)(**model_inputs, return_dict=True)
            model_kwargs = next_step_kwargs(outputs, model_kwargs)
            if synced_gpus and this_peer_finished:
                continue
            logits = outputs.logits[:, -1, :].float()
            # A finished sentence kept in the batch has no continuation, as one that left it has none.
            finished_rows = None if can_drop else done.repeat_interleave(num_beams)[:, None]
            record_step(recorded, outputs, logits)
            del outputs
            log_probs = logits_processor(flat_live, torch.log_softmax(logits, dim=-1))
            if finished_rows is not None:
                log_probs = log_probs.masked_fill(finished_rows, -float("inf"))
            if generation_config.return_dict_in_generate and generation_config.output_scores:
                step_scores += (state.whole_batch(no_forced_ending(log_probs)),)

            candidates = state.continuations(log_probs)
            ends = candidates.end(stopping_criteria, step_scores)
            # A step where no candidate ends leaves the finished hypotheses as they are: where `ends` can be read for
            # free, such a step skips settling them.
            if not on_host(ends) or ends.any():
                state.settle_finished(candidates, ends, cur_len + 1 - prompt_length, alpha)
            kept = state.keep_live(candidates, ends)
            # Each row continues the cache row of the live hypothesis its new one extends.
            sources, positions = state.follow(candidates.rows.gather(1, kept)), torch.arange(searched, device=device)
            moved = sources != torch.arange(num_beams, device=device)
            if beam_steps is not None:
                beam_steps.append(BeamStep.of(state, candidates, ends, kept, prompt_length))
            done_now = state.settled(cur_len + 1 - prompt_length, alpha, num_return)
            if not can_drop:
                done |= done_now
                all_done, moving = torch.stack((done.all().long(), moved.sum())).tolist()  # the step's one read
                this_peer_finished = bool(all_done)
            else:
                leaving, moving = torch.stack((done_now.sum(), moved.sum())).tolist()  # the step's one read
                this_peer_finished = leaving == searched
                if leaving and not this_peer_finished:
                    positions = state.leave(done_now, results)
                    sources = sources[positions]
                    logits_processor = rows_kept(logits_processor, positions)
                    select_batch_rows(model_kwargs, positions, num_beams)
            cache = model_kwargs.get("cache")
            if cache is not None and not this_peer_finished:
                sources = positions[:, None] * num_beams + sources  # rows of the last step
                if positions.shape[0] < searched:
                    reorder_self_attention_cache(cache, sources.view(-1), cur_len)
                elif moving:
                    targets = (~moved).view(-1).long().argsort(stable=True)[:moving]  # the moved rows, in order
                    copy_cache_rows(cache, sources.view(-1)[targets], targets, cur_len)

    for result, tensor in zip(results, state.returned):
        result[state.active] = tensor
    return beam_search_output(
        results, prompt_length, generation_config, step_scores, encoder_outputs, model_kwargs.get("cache"), recorded
    )


@dataclass
class GreedyRows:
    """The rows greedy search decodes: `active`, their indices in the batch, their `sequences` and which of them are
    `unfinished`; `fill`, what a row takes after its end (`greedy_filler`); `results`, where rows leave, the
    sequences of every row, written as each leaves."""

    active: torch.Tensor
    sequences: torch.Tensor
    unfinished: torch.Tensor
    fill: int | None
    results: torch.Tensor | None

    @classmethod
    def start(cls, input_ids: torch.Tensor, max_length: int, fill: int | None, rows_leave: bool) -> "GreedyRows":
        """Every row, its prompt; room for the rows that leave, where they do."""
        rows, device = input_ids.shape[0], input_ids.device
        results = input_ids.new_full((rows, max_length), fill) if rows_leave else None
        unfinished = torch.ones(rows, dtype=torch.bool, device=device)
        return cls(torch.arange(rows, device=device), input_ids, unfinished, fill, results)

    def append(self, tokens: torch.Tensor) -> None:
        """Each row's next token; after a row's end `fill`, where it has one (else its token all the same)."""
        tokens = tokens if self.fill is None else torch.where(self.unfinished, tokens, self.fill)
        self.sequences = torch.cat((self.sequences, tokens[:, None]), dim=-1)

    def leave(self) -> torch.Tensor:
        """The rows that ended leave, their sequences written into `results`; returns the positions of those kept."""
        gone, still = (~self.unfinished).nonzero().view(-1), self.unfinished.nonzero().view(-1)
        self.results[self.active[gone], : self.sequences.shape[1]] = self.sequences[gone]
        self.active, self.sequences, self.unfinished = (
            self.active[still],
            self.sequences[still],
            self.unfinished[still],
        )
        return still

    def every_row(self) -> torch.Tensor:
        """The sequences of every row of the batch, padded to the longest: the rows decoded last are the longest (each
        grew by one token a step until it left)."""
        if self.results is None:
            return self.sequences
        self.results[self.active, : self.sequences.shape[1]] = self.sequences
        return self.results[:, : self.sequences.shape[1]]


def greedy_search(
    model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **model_kwargs
):
    """Greedy decoding as CTranslate2 runs it: `generate(custom_generate=greedy_search)`, what the model's `generate()`
    decodes `num_beams=1` without sampling with (`paper_decoding=True`, neither attentions nor hidden states asked for).

    Each step appends each sentence's most probable token (after the logits processors, the length limit among them),
    as transformers' greedy search does. A sentence that ends (`</s>`, or a stopping criterion) leaves the batch: the
    decoder computes the sentences still decoded, where transformers' greedy search computes every row until the
    batch's longest sentence ends (twice the rows, for the main job's test sentences in batches of 32). The batch stays
    whole where `sentences_can_leave` says it must; an ended sentence is then padded, as transformers pads it. Returns
    the sequences padded to the longest and, with `return_dict_in_generate=True`, the processed scores and raw logits
    of every step (`output_scores`, `output_logits`: every row is then decoded to the end) and the decoder's cache,
    which holds the sentences decoded at the last step (all of them where none ended early: then a later call
    continues from it). With `synced_gpus`, as the paper's beam search.
    """
    recorded = step_records(generation_config)
    logits_processor = per_sentence_processors(logits_processor)
    return_scores = generation_config.return_dict_in_generate and generation_config.output_scores
    device, fill = input_ids.device, greedy_filler(generation_config, stopping_criteria)
    # Per-step scores and logits are returned for every row, as transformers' greedy search returns them.
    can_drop = fill is not None and not (return_scores or recorded["logits"] is not None)
    can_drop &= sentences_can_leave(model, model_kwargs, logits_processor, stopping_criteria, synced_gpus, recorded, 1)
    if can_drop:
        share_encoder_output(model_kwargs, 1)
    batch = GreedyRows.start(input_ids, generation_config.max_length, fill, rows_leave=can_drop)
    step_scores = ()

    this_peer_finished = False
    with cpu_step_kernels(model, True):
        while any_peer_unfinished(this_peer_finished, synced_gpus, device):
            cur_len = batch.sequences.shape[1]
            # The tokens the cache does not hold yet: the prompt at first (its end where the cache continues an earlier
            # decoding), then the last token; a process done before the others (synced_gpus) feeds its last token again,
            # a step that counts nothing.
            held = model_kwargs["cache"].get_seq_length() if model_kwargs.get("cache") is not None else 0
            next_length = (
                (1 if this_peer_finished else cur_len - held) if model_kwargs.get("use_cache") and held else None
            )
            inputs = model.prepare_inputs_for_generation(
                batch.sequences, next_sequence_length=next_length, **model_kwargs
            )
            outputs = model(**inputs, return_dict=True)
            model_kwargs = next_step_kwargs(outputs, model_kwargs)
            if synced_gpus and this_peer_finished:
                continue
            logits = outputs.logits[:, -1, :].float()
            del outputs
            if recorded["logits"] is not None:
                recorded["logits"] += (logits.clone(),)
            scores = logits_processor(batch.sequences, logits)
            if return_scores:
                step_scores += (scores,)
            batch.append(scores.argmax(dim=-1))
            batch.unfinished &= ~stopping_criteria(batch.sequences, step_scores or None)
            if not can_drop:
                this_peer_finished = not bool(batch.unfinished.any())
                continue
            leaving = int((~batch.unfinished).sum())  # the step's one read of the device
            this_peer_finished = leaving == batch.active.shape[0]
            if leaving and not this_peer_finished:
                still = batch.leave()
                logits_processor = rows_kept(logits_processor, still)
                select_batch_rows(model_kwargs, still, 1)
                if model_kwargs.get("cache") is not None:
                    reorder_self_attention_cache(model_kwargs["cache"], still, cur_len)
    sequences = batch.every_row()
    if not generation_config.return_dict_in_generate:
        return sequences
    return GenerateEncoderDecoderOutput(
        sequences=sequences,
        scores=step_scores if return_scores else None,
        logits=recorded["logits"],
        cache=returned_cache(model_kwargs.get("cache")),
    )
