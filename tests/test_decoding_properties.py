"""generate()'s arguments, drawn at random: the paper's decoding methods against their definition
(tests/decoding_oracle.py), each sentence alone against the same sentence in a batch, transformers' own methods where
the search is the same, and every argument honoured or refused in one sentence before any work.

The model is a tiny one trained on a few pairs of a 24-token vocabulary, so that its translations end at different
lengths, and run in float64: a batch and a sentence alone, or a cached and an uncached step, then give the same float32
scores, and a near-tie of two hypotheses that could make the comparisons flaky is most unlikely. The default suite runs a short, reproducible
profile; the slow stage runs thousands of examples. Each defect these properties found is kept as an `@example`.
"""

import functools
import importlib
import inspect
import math
import re
from dataclasses import dataclass, replace

import pytest
import torch
from decoding_oracle import Rules, gnmt_beam_search, greedy
from helpers import FIRST_WORD, SMALL_VOCAB_SIZE, small_vocabulary_model, word_tokenizer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import (
    CompileConfig,
    GenerationConfig,
    GenerationMixin,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.modeling_outputs import BaseModelOutput

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniTranslationPipeline
from vaswani.modeling.modeling_vaswani import positions_of
from vaswani.modeling.pipeline_vaswani import translate_batch


PAD, START, EOS = 0, 1, 2
EXTRA_OUTPUT_TOKENS = 50  # section 6.1: at most the source length + 50


# --- The model. ---


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """A tiny model's step is a few small matrix products: one thread computes them fastest, and several fight each
    other where other processes share the cores (ten times slower, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass(frozen=True)
class ModelSpec:
    pad_token_id: int | None = PAD
    eos_token_id: int | None = EOS
    max_positions: int = 128
    attention: str = "sdpa"


@functools.cache
def model_for(spec: ModelSpec) -> VaswaniForConditionalGeneration:
    """The trained model in float64, with the padding token, positions and attention of `spec` (sinusoids are
    computed: any number of positions loads the same weights)."""
    trained = small_vocabulary_model()
    config = VaswaniConfig(
        **{
            **trained.config.to_dict(),
            "pad_token_id": spec.pad_token_id,
            "eos_token_id": spec.eos_token_id,
            "max_position_embeddings": spec.max_positions,
        }
    )
    model = VaswaniForConditionalGeneration(config)
    model.load_state_dict(trained.state_dict())
    model.set_attn_implementation(spec.attention)
    return model.to(torch.float64).eval()


# --- The caller's own logits processors and stopping criteria. ---


class Boost(LogitsProcessor):
    """Adds `amount` to one token's score at every step (a positive amount lifts a score above 0)."""

    def __init__(self, token: int, amount: float):
        self.token, self.amount = token, amount

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.token] += self.amount
        return scores


class StopAt(StoppingCriteria):
    """Ends a sequence at `token`, as a second end token would."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


class NewTokenBudget(StoppingCriteria):
    """Ends every sequence once it holds `budget` new tokens, keeping one budget per row of the first batch it sees
    (the state a criterion over rows keeps)."""

    def __init__(self, budget: int):
        self.budget, self.budgets, self.prompt_length = budget, None, None

    def __call__(self, input_ids, scores, **kwargs):
        if self.budgets is None:
            self.budgets = torch.full((input_ids.shape[0],), self.budget)
            self.prompt_length = input_ids.shape[1] - 1
        return input_ids.shape[1] - self.prompt_length >= self.budgets


class Only(LogitsProcessor):
    """Leaves `token` the only token a hypothesis may take (a constraint that can keep hypotheses from finishing)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        kept = torch.full_like(scores, -math.inf)
        kept[:, self.token] = scores[:, self.token]
        return kept


def shunned(row) -> list[int]:
    """`prefix_allowed_tokens_fn`'s answer for a row: every token but one that follows from the row's last token."""
    banned = (int(row[-1]) * 5 + 3) % SMALL_VOCAB_SIZE
    return [token for token in range(SMALL_VOCAB_SIZE) if token != banned]


# What each of them is to the oracle: a function of one sentence's tokens (and its scores, or its prompt's length).
def boost_rule(token, amount):
    def rule(tokens, scores):
        scores = scores.clone()
        scores[token] += amount
        return scores

    return rule


def only_rule(token):
    def rule(tokens, scores):
        kept = torch.full_like(scores, -math.inf)
        kept[token] = scores[token]
        return kept

    return rule


ORACLE_STOPS = {
    "stop at": lambda token: lambda tokens, prompt_length: tokens[-1] == token,
    "budget": lambda budget: lambda tokens, prompt_length: len(tokens) - prompt_length >= budget,
}
STOPPING = {"stop at": StopAt, "budget": NewTokenBudget}


# --- A generate() call. ---


@dataclass(frozen=True)
class Call:
    """A batch of sources and the arguments of one generate() call.

    sources: each sentence's tokens, unpadded. holes: for each sentence, (position, token) pairs of tokens inserted
    into its row and masked out by its attention mask (a mask of any pattern); `silent`: a sentence whose row the mask
    masks whole. form: how the source is given to generate(): as `input_ids`, its first argument (`inputs`),
    `inputs_embeds`, or the encoder's output as a `BaseModelOutput`, a tuple or a dict. as_config: the options given
    as a `generation_config` rather than as arguments. extras: model inputs generate() passes on, leaves or refuses
    (`decoder_position_ids` as the model counts them, `labels`, `decoder_inputs_embeds`), or the beam search's own
    `beam_steps`. prefixes: each sentence's forced target prefix (after the start token),
    or None for no decoder_input_ids. The batch pads sources on `padding_side`, passes their attention mask where
    `source_mask`, and left-pads the prompts with their decoder_attention_mask where `prompt_mask` (else they must be
    of one length). boosts: (token, amount) for each `Boost`; only: the token of an `Only`, if any; allowed:
    whether `prefix_allowed_tokens_fn` is `shunned`; stops: (kind, value) for each stopping criterion.
    """

    sources: tuple[tuple[int, ...], ...]
    model: ModelSpec = ModelSpec()
    padding_side: str = "right"
    source_mask: bool = True
    holes: tuple[tuple[tuple[int, int], ...], ...] = ()
    silent: int | None = None
    form: str = "input_ids"
    as_config: bool = False
    extras: tuple[str, ...] = ()
    prefixes: tuple[tuple[int, ...], ...] | None = None
    prompt_mask: bool = False
    options: tuple[tuple[str, object], ...] = ()
    boosts: tuple[tuple[int, float], ...] = ()
    only: int | None = None
    allowed: bool = False
    stops: tuple[tuple[str, int], ...] = ()

    @property
    def settings(self) -> dict:
        """The call's settings; in a GenerationConfig (`as_config`) a None leaves the setting to the model's config."""
        return {key: value for key, value in self.options if value is not None or not self.as_config}

    def alone(self, sentence: int) -> "Call":
        prefixes = None if self.prefixes is None else (self.prefixes[sentence],)
        holes = self.holes[sentence : sentence + 1] if self.holes else ()
        return replace(self, sources=(self.sources[sentence],), prefixes=prefixes, holes=holes)


def padded(rows, side: str, fill: int, masks=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows padded to one width on `side` with `fill`, and their attention mask (each row's own `masks`, else
    ones, then zeros for the padding)."""
    width = max(map(len, rows))
    masks = masks or [[1] * len(row) for row in rows]
    ids, mask = [], []
    for row, row_mask in zip(rows, masks):
        padding = [fill] * (width - len(row))
        ids.append([*row, *padding] if side == "right" else [*padding, *row])
        zeros = [0] * len(padding)
        mask.append([*row_mask, *zeros] if side == "right" else [*zeros, *row_mask])
    return torch.tensor(ids), torch.tensor(mask)


def source_rows(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """The sources as the batch holds them: each sentence's tokens with its masked holes, padded on the call's side."""
    rows, masks = [], []
    for sentence, source in enumerate(call.sources):
        row, mask = list(source), [1] * len(source)
        for position, token in sorted(call.holes[sentence] if call.holes else (), reverse=True):
            row.insert(position, token)
            mask.insert(position, 0)
        rows.append(row)
        masks.append([0] * len(mask) if sentence == call.silent else mask)
    return padded(rows, call.padding_side, PAD, masks)


def prompts(call: Call) -> list[list[int]]:
    """Each sentence's decoder prompt: the start token, then its prefix."""
    prefixes = call.prefixes or [()] * len(call.sources)
    return [[START, *prefix] for prefix in prefixes]


def width(call: Call) -> int:
    """The padded decoder prompt's width."""
    return max(map(len, prompts(call)))


def source_arguments(call: Call) -> dict:
    """The source in the call's form, with its attention mask where the call passes one."""
    input_ids, attention_mask = source_rows(call)
    mask = {"attention_mask": attention_mask} if call.source_mask else {}
    if call.form in ("input_ids", "inputs"):
        return {call.form: input_ids, **mask}
    encoder = model_for(call.model).model.encoder
    with torch.no_grad():
        if call.form == "inputs_embeds":
            return {"inputs_embeds": encoder.embed_tokens(input_ids), **mask}
        hidden = encoder(input_ids=input_ids, **mask).last_hidden_state
    given = {
        "encoder_outputs": BaseModelOutput(last_hidden_state=hidden),
        "encoder_outputs as a tuple": (hidden,),
        "encoder_outputs as a dict": {"last_hidden_state": hidden},
    }[call.form]
    return {"encoder_outputs": given, **mask}


def arguments(call: Call) -> dict:
    """generate()'s keyword arguments for the call (new processors and criteria: some keep state)."""
    settings = {"generation_config": GenerationConfig(**call.settings)} if call.as_config else call.settings
    kwargs = {**source_arguments(call), **settings}
    if call.prefixes is not None:
        decoder_input_ids, decoder_mask = padded(prompts(call), "left", PAD)
        kwargs["decoder_input_ids"] = decoder_input_ids
        if call.prompt_mask:
            kwargs["decoder_attention_mask"] = decoder_mask
    processors = [Boost(*boost) for boost in call.boosts] + ([Only(call.only)] if call.only is not None else [])
    if processors:
        kwargs["logits_processor"] = LogitsProcessorList(processors)
    if call.allowed:
        kwargs["prefix_allowed_tokens_fn"] = lambda batch_id, row: shunned(row)
    decoder = model_for(call.model).model.decoder
    rows = kwargs.get("decoder_input_ids", torch.full((len(call.sources), 1), START))
    if "decoder_position_ids" in call.extras:
        positions = positions_of(kwargs.get("decoder_attention_mask"), rows.shape[1], 0, "cpu")
        kwargs["decoder_position_ids"] = positions.expand(rows.shape[0], -1)
    if "decoder_inputs_embeds" in call.extras:
        with torch.no_grad():
            kwargs["decoder_inputs_embeds"] = decoder.embed_tokens(rows)
    if "labels" in call.extras:
        kwargs["labels"] = torch.full((len(call.sources), 2), EOS)
    if call.stops:
        kwargs["stopping_criteria"] = StoppingCriteriaList(STOPPING[kind](value) for kind, value in call.stops)
    return kwargs


@dataclass
class Outcome:
    output: object = None
    error: Exception | None = None
    encoder_runs: int = 0  # the encoder's forward passes before generate() returned or raised
    beam_steps: list | None = None  # the paper's beam search at work, where the call asks for it


def run(call: Call, **overrides) -> Outcome:
    model = model_for(call.model)
    outcome = Outcome()
    hook = None
    try:
        kwargs = {**arguments(call), **overrides}  # a GenerationConfig may refuse its settings here
        inputs = kwargs.pop("inputs", None)
        beam_search = num_beams(call) > 1 and uses_the_papers_methods(call)
        if "beam_steps" in call.extras and overrides.get("paper_decoding", True) and beam_search:
            kwargs["beam_steps"] = outcome.beam_steps = []
        hook = model.model.encoder.register_forward_hook(lambda *_: setattr(outcome, "encoder_runs", 1))
        outcome.output = model.generate(inputs, **kwargs)
    except Exception as error:  # noqa: BLE001 - what was raised is what the properties judge
        outcome.error = error
    finally:
        if hook is not None:
            hook.remove()
    return outcome


# --- What the call asks for, per sentence, as the documentation defines it. ---


def end_tokens(call: Call) -> tuple[int, ...]:
    return as_tuple(call.settings.get("eos_token_id", call.model.eos_token_id))


def pads_with(call: Call) -> int | None:
    """What follows a sequence's end, as transformers writes it: the padding token, else the first end token (else
    -1 in beam search); None for greedy search without an end token, whose rows go on taking their best token."""
    pad = call.settings.get("pad_token_id", call.model.pad_token_id)
    if num_beams(call) == 1 and not end_tokens(call):
        return None
    return pad if pad is not None else next(iter(end_tokens(call)), -1)


def batch_new_tokens(call: Call) -> int:
    """The most new tokens of any sequence: max_new_tokens, or what max_length leaves after the padded prompt, or
    the paper's longest source + 50 within the positions the padded prompt leaves."""
    settings = call.settings
    if "max_new_tokens" in settings:
        return settings["max_new_tokens"]
    if "max_length" in settings:
        return settings["max_length"] - width(call)
    return min(max(map(len, call.sources)) + EXTRA_OUTPUT_TOKENS, call.model.max_positions - width(call))


def paper_limit(call: Call, sentence: int) -> int | None:
    """The paper's limit, where no other is given and an end token can close a sentence at it: the source's length
    + 50 tokens after the start token."""
    if "max_new_tokens" in call.settings or "max_length" in call.settings or not end_tokens(call):
        return None
    return len(call.sources[sentence]) + EXTRA_OUTPUT_TOKENS


def min_length(call: Call, sentence: int) -> int:
    """min_length in the sentence's own tokens: transformers counts the padded prompt, its left padding included,
    and min_new_tokens, where given, takes min_length's place."""
    if "min_new_tokens" in call.settings:
        return 0
    return call.settings.get("min_length", 0) - (width(call) - len(prompts(call)[sentence]))


def as_tuple(ids) -> tuple[int, ...]:
    return () if ids is None else tuple(ids) if isinstance(ids, list) else (ids,)


def rules(call: Call, sentence: int) -> Rules:
    settings = call.settings
    input_ids, _ = source_rows(call)
    processors = tuple(boost_rule(*boost) for boost in call.boosts)
    return Rules(
        eos=end_tokens(call),
        max_new_tokens=batch_new_tokens(call),
        limit=paper_limit(call, sentence),
        padding=width(call) - len(prompts(call)[sentence]),
        encoder_ids=tuple(input_ids[sentence].tolist()) if call.form in ("input_ids", "inputs") else None,
        min_length=min_length(call, sentence),
        min_new_tokens=settings.get("min_new_tokens", 0),
        repetition_penalty=settings.get("repetition_penalty", 1.0),
        no_repeat_ngram_size=settings.get("no_repeat_ngram_size", 0),
        bad_words_ids=tuple(map(tuple, settings.get("bad_words_ids", ()))),
        suppress_tokens=tuple(settings.get("suppress_tokens", ())),
        begin_suppress_tokens=tuple(settings.get("begin_suppress_tokens", ())),
        forced_bos_token_id=settings.get("forced_bos_token_id"),
        forced_eos_token_id=as_tuple(settings.get("forced_eos_token_id")),
        sequence_bias=tuple((tuple(sequence), bias) for sequence, bias in settings.get("sequence_bias", ())),
        encoder_repetition_penalty=settings.get("encoder_repetition_penalty", 1.0),
        encoder_no_repeat_ngram_size=settings.get("encoder_no_repeat_ngram_size", 0),
        exponential_decay_length_penalty=settings.get("exponential_decay_length_penalty"),
        remove_invalid_values=settings.get("remove_invalid_values", False),
        renormalize_logits=settings.get("renormalize_logits", False),
        allowed=shunned if call.allowed else None,
        processors=processors + ((only_rule(call.only),) if call.only is not None else ()),
        stops=tuple(ORACLE_STOPS[kind](value) for kind, value in call.stops),
    )


def num_beams(call: Call) -> int:
    return call.settings.get("num_beams", 4)


def returned(call: Call) -> int:
    return call.settings.get("num_return_sequences", 1)


def as_dict(call: Call) -> bool:
    return call.settings.get("return_dict_in_generate", False)


def sequences_of(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.sequences


def ended(call: Call, sentence: int, new_tokens: list[int]) -> bool:
    """Whether a sentence's generated tokens end with its last one: an end token or a stopping criterion's."""
    prompt = prompts(call)[sentence]
    tokens = [*prompt, *new_tokens]
    return tokens[-1] in end_tokens(call) or any(stop(tokens, len(prompt)) for stop in rules(call, sentence).stops)


def generated(call: Call, output, row: int) -> list[int]:
    """A returned row's tokens after the prompt, up to its end."""
    sentence = row // returned(call)
    sequence = sequences_of(output)[row, width(call) :].tolist()
    for length in range(1, len(sequence) + 1):
        if ended(call, sentence, sequence[:length]):
            return sequence[:length]
    return sequence


# --- The properties. ---

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def raised_by_the_model(error: Exception) -> bool:
    """Whether the model's own code (the installed vaswani package) raised `error`, rather than transformers'."""
    frame = error.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    return frame.tb_frame.f_globals.get("__name__", "").split(".")[0] == "vaswani"


def check_refusal(call: Call, ours: Outcome) -> None:
    """A call the paper's methods do not decode is refused before any work: as transformers' own code refuses it
    (raised there, as with paper_decoding=False), or in one sentence of the model's own."""
    message = f"{type(ours.error).__name__}: {ours.error}"
    theirs = run(call, paper_decoding=False)
    same = type(theirs.error) is type(ours.error) and str(theirs.error) == str(ours.error)
    if same and not raised_by_the_model(ours.error):
        return
    assert ours.encoder_runs == 0, f"failed after the encoder ran: {message}"
    assert isinstance(ours.error, ValueError), message
    assert re.fullmatch(r"[^\n]+\.", str(ours.error)) and not re.search(r"\. [A-Z]", str(ours.error)), message


def check_oracle(call: Call, output) -> None:
    """The tokens of the definition (decoding_oracle.py), and its scores to float32 rounding; the batch as long as
    its longest sequence."""
    model = model_for(call.model)
    k, longest = num_beams(call), 0
    for sentence, (source, prompt) in enumerate(zip(call.sources, prompts(call))):
        sentence_rules = rules(call, sentence)
        if k == 1:
            expected = greedy(model, list(source), prompt, sentence_rules)
            new = expected.tokens[len(prompt) :]
            assert generated(call, output, sentence) == new, f"sentence {sentence}"
            after_end = sequences_of(output)[sentence, width(call) + len(new) :]
            if pads_with(call) is not None:
                assert set(after_end.tolist()) <= {pads_with(call)}, f"sentence {sentence}"
            if as_dict(call) and call.settings.get("output_scores"):
                steps = torch.stack([step[sentence] for step in output.scores[: len(new)]])
                torch.testing.assert_close(steps, torch.stack(expected.scores), **TOLERANCE)
            longest = max(longest, len(new))
            continue
        expected = gnmt_beam_search(
            model, list(source), prompt, sentence_rules, k, call.settings.get("length_penalty", 0.6), returned(call)
        )
        for rank, (tokens, score) in enumerate(expected):
            row = sentence * returned(call) + rank
            assert generated(call, output, row) == tokens[len(prompt) :], f"sentence {sentence}, hypothesis {rank}"
            if as_dict(call) and call.settings.get("output_scores"):
                assert output.sequences_scores[row].item() == pytest.approx(
                    score, **{"rel": TOLERANCE["rtol"], "abs": TOLERANCE["atol"]}
                )
            longest = max(longest, len(tokens) - len(prompt))
        for rank in range(len(expected), returned(call)):  # fewer finished than asked for: padding, scored -inf
            row = sentence * returned(call) + rank
            assert set(sequences_of(output)[row, width(call) :].tolist()) <= {pads_with(call)}
            if as_dict(call) and call.settings.get("output_scores"):
                assert output.sequences_scores[row].item() == -math.inf
    assert sequences_of(output).shape[1] == width(call) + longest


def effective_new_tokens(call: Call, sentence: int) -> int:
    """The most new tokens the sentence may have in this call: the batch's, or fewer under its own limit."""
    limit = paper_limit(call, sentence)
    own = math.inf if limit is None else max(limit + 1 - len(prompts(call)[sentence]), 1)
    return min(batch_new_tokens(call), own)


# Arguments transformers defines over the padded rows: the decoder prompt's (its length, or its padding's tokens) and
# the source's (the encoder_* processors read the source row, padding included).
OVER_THE_PADDED_PROMPT = {"min_length", "no_repeat_ngram_size", "forced_bos_token_id", "encoder_no_repeat_ngram_size"}
OVER_THE_PADDED_SOURCE = {"encoder_repetition_penalty", "encoder_no_repeat_ngram_size"}


def comparable_alone(call: Call, sentence: int) -> bool:
    """Whether the sentence decodes alone as in the batch by the documentation: the same most new tokens, and no
    argument that transformers defines over the padded rows."""
    alone = call.alone(sentence)
    if effective_new_tokens(call, sentence) != effective_new_tokens(alone, 0):
        return False
    uneven_prompts = len({len(prompt) for prompt in prompts(call)}) > 1
    holes = call.holes or [()] * len(call.sources)
    uneven_sources = len({len(source) + len(row_holes) for source, row_holes in zip(call.sources, holes)}) > 1
    return not (
        (uneven_prompts and OVER_THE_PADDED_PROMPT & call.settings.keys())
        or (uneven_sources and OVER_THE_PADDED_SOURCE & call.settings.keys())
    )


def check_alone(call: Call, output) -> None:
    """Each sentence alone gives what it gives in the batch, for the whole length the batch returns: its tokens, then
    the padding after its end; its scores, then -inf for the steps after a beam search finished it (no continuation
    of it counts); its logits, then the model's for what its rows hold; its beam indices, then -1."""
    k, n = num_beams(call), returned(call)
    for sentence in range(len(call.sources)):
        if len(call.sources) == 1 or not comparable_alone(call, sentence):
            continue
        alone = run(call.alone(sentence))
        assert alone.error is None, alone.error
        rows = slice(sentence * n, (sentence + 1) * n)
        ours, theirs = (
            sequences_of(output)[rows, width(call) :],
            sequences_of(alone.output)[:, width(call.alone(sentence)) :],
        )
        assert torch.equal(ours[:, : theirs.shape[1]], theirs), f"sentence {sentence}"
        if pads_with(call) is not None:
            assert set(ours[:, theirs.shape[1] :].flatten().tolist()) <= {pads_with(call)}, f"sentence {sentence}"
        if not as_dict(call):
            continue
        if getattr(output, "sequences_scores", None) is not None:
            torch.testing.assert_close(output.sequences_scores[rows], alone.output.sequences_scores, **TOLERANCE)
        step_rows = slice(sentence * k, (sentence + 1) * k)
        for name in ("scores", "logits"):
            steps = getattr(alone.output, name)
            if steps is None:
                continue
            batch_steps = [step[step_rows] for step in getattr(output, name)]
            torch.testing.assert_close(torch.stack(batch_steps[: len(steps)]), torch.stack(steps), **TOLERANCE)
            for later in batch_steps[len(steps) :]:
                if name == "logits":
                    assert torch.isfinite(later).all(), f"sentence {sentence}: logits after its end"
                elif k > 1:
                    assert (later == -math.inf).all(), f"sentence {sentence}: scores after its end"
        if k > 1 and output.beam_indices is not None:
            alone_indices = alone.output.beam_indices
            batch_indices = output.beam_indices[rows]
            shifted = torch.where(batch_indices >= 0, batch_indices - sentence * k, -1)
            assert torch.equal(shifted[:, : alone_indices.shape[1]], alone_indices)
            assert (shifted[:, alone_indices.shape[1] :] == -1).all()


RECORDED = ("scores", "logits", "sequences_scores", "beam_indices", "decoder_attentions", "cross_attentions")


def check_transformers(call: Call, ours) -> None:
    """Greedy search given a limit is transformers' own search: the same output. Beam search differs from
    transformers' in its penalty and its finished hypotheses: the same fields of the same shapes, and scores that
    add up to `sequences_scores` under the GNMT penalty as transformers' add up under theirs."""
    theirs = run(call, paper_decoding=False)
    assert theirs.error is None, theirs.error
    theirs = theirs.output
    if not as_dict(call):
        if num_beams(call) == 1 and paper_limit(call, 0) is None:
            assert torch.equal(ours, theirs)
        return
    for name in (*RECORDED, "encoder_attentions", "encoder_hidden_states", "decoder_hidden_states", "cache"):
        assert (getattr(ours, name, None) is None) == (getattr(theirs, name, None) is None), name
    if ours.cache is not None:
        assert type(ours.cache.self_attention_cache) is type(theirs.cache.self_attention_cache)
    if num_beams(call) == 1:
        if paper_limit(call, 0) is None:
            assert torch.equal(ours.sequences, theirs.sequences)
            for name in ("scores", "logits"):
                if getattr(ours, name) is not None:
                    torch.testing.assert_close(torch.stack(getattr(ours, name)), torch.stack(getattr(theirs, name)))
        return
    assert ours.sequences.shape[0] == theirs.sequences.shape[0]
    for name in ("scores", "logits"):
        for step in getattr(ours, name) or ():
            assert step.shape == getattr(theirs, name)[0].shape
    if ours.scores is not None:
        # Without a padding or an end token, finished hypotheses are filled with -1, as transformers' beam search fills
        # them; compute_transition_scores reads a token at every position before it zeroes the filled ones.
        sequences = ours.sequences.clamp(min=0)
        transitions = model_for(call.model).compute_transition_scores(sequences, ours.scores, ours.beam_indices)
        lengths = (ours.beam_indices >= 0).sum(1)
        penalty = ((5 + lengths) / 6) ** call.settings.get("length_penalty", 0.6)
        finished = ours.sequences_scores > -math.inf  # rows no hypothesis finished in are padding (check_oracle)
        torch.testing.assert_close(
            (transitions.sum(1) / penalty)[finished], ours.sequences_scores[finished], **TOLERANCE
        )


def undefined(call: Call) -> str | None:
    """An argument the definition gives no meaning to, which the paper's methods must refuse, not ignore:
    transformers' `early_stopping=True` ends a beam search at its first num_beams finished hypotheses, where the paper's
    ends once none can change the result (`"never"`, which it honours); a source the attention mask masks whole has
    no token to translate."""
    if num_beams(call) > 1 and call.settings.get("early_stopping") is True:
        return "early_stopping=True"
    if call.silent is not None and call.source_mask:
        return "a source row masked whole"
    return None


def check_call(call: Call) -> None:
    ours = run(call)
    assert ours.error is not None or undefined(call) is None, f"{undefined(call)} was ignored"
    if ours.error is not None:
        check_refusal(call, ours)
        return
    output = ours.output
    assert sequences_of(output).shape[0] == len(call.sources) * returned(call)
    check_oracle(call, output)
    check_alone(call, output)
    check_transformers(call, output)
    check_beam_steps(ours.beam_steps or [])


def check_beam_steps(steps) -> None:
    """The search at work (`beam_steps`): a candidate that ends or stays live has a score, none does both, and the
    finished hypotheses' scores are kept best first."""
    for step in steps:
        scored = step.scores > -math.inf
        assert not (step.ended & ~scored).any(), "a candidate without a score finished"
        assert not (step.live & ~scored).any() and not (step.live & step.ended).any()
        assert (step.finished_scores[:, :-1] >= step.finished_scores[:, 1:]).all()


# --- The calls drawn. ---


words = st.integers(FIRST_WORD, SMALL_VOCAB_SIZE - 1)


# Numbers drawn from ranges wide enough to reach every branch (a length penalty's bound on a live hypothesis matters
# only at larger penalties), with the values users pass most.
def numbers(low: float, high: float, *usual: float):
    return st.one_of(st.sampled_from(usual), st.floats(low, high, allow_nan=False, allow_infinity=False))


# The options drawn beside the beam, the limit and the outputs, each with the values it takes.
OPTIONS = {
    "min_new_tokens": st.sampled_from([1, 2, 4, 60]),
    "min_length": st.sampled_from([2, 4, 6, 60]),
    "eos_token_id": st.sampled_from([5, [EOS, 5], [5, EOS]]),
    "bad_words_ids": st.lists(st.lists(words, min_size=1, max_size=2), min_size=1, max_size=2),
    "repetition_penalty": numbers(0.5, 2.0, 1.5, 0.7),
    "no_repeat_ngram_size": st.integers(2, 3),
    "use_cache": st.just(False),
    "cache_implementation": st.just("static"),
    "pad_token_id": st.just(None),
    "early_stopping": st.sampled_from([True, "never"]),
    "suppress_tokens": st.sampled_from([[EOS], [9, 10]]),
    "begin_suppress_tokens": st.lists(st.sampled_from([EOS, 5, 9, 12]), min_size=1, max_size=2, unique=True),
    "forced_bos_token_id": words,
    "forced_eos_token_id": st.sampled_from([EOS, 5, [EOS, 5]]),
    "sequence_bias": st.lists(
        st.tuples(st.lists(words, min_size=1, max_size=2), numbers(-4.0, 4.0, 2.0, -2.0)).map(list),
        min_size=1,
        max_size=2,
        unique_by=lambda entry: tuple(entry[0]),
    ),
    "encoder_repetition_penalty": numbers(0.5, 2.0, 1.5, 0.7),
    "encoder_no_repeat_ngram_size": st.integers(1, 3),
    "exponential_decay_length_penalty": st.tuples(st.integers(0, 5), numbers(1.0, 2.5, 1.5)),
    "remove_invalid_values": st.just(True),
    "renormalize_logits": st.just(True),
    "max_time": st.just(600.0),  # honoured: a call of this size ends long before it
    # On the CPU transformers' methods compile nothing, with or without a CompileConfig, and neither do the paper's.
    "compile_config": st.builds(CompileConfig, fullgraph=st.booleans()),
    "disable_compile": st.booleans(),
    "bos_token_id": words,  # an encoder-decoder starts from decoder_start_token_id, which takes precedence
}
FORMS = ["input_ids", "inputs", "inputs_embeds", "encoder_outputs", "encoder_outputs as a tuple",
         "encoder_outputs as a dict"]  # fmt: skip
EXTRAS = ["decoder_position_ids", "decoder_inputs_embeds", "labels", "beam_steps"]


# The options whose processors only lower a log-probability (SCORE_LOWERING_PROCESSORS): with no others, the paper's
# beam search ends a sentence by its stop rule's bound on what a live hypothesis may still score.
LOWERING_OPTIONS = ["bad_words_ids", "begin_suppress_tokens", "encoder_no_repeat_ngram_size",
                    "encoder_repetition_penalty", "min_length", "min_new_tokens", "no_repeat_ngram_size",
                    "renormalize_logits", "repetition_penalty", "suppress_tokens"]  # fmt: skip


@st.composite
def calls(draw, bounded_searches: bool = False) -> Call:
    """Calls of generate() with drawn sources, masks, forms, options and processors; `bounded_searches` draws only
    beam searches whose stop rule ends them by its bound (no processor that lifts a score), at penalties up to 4."""
    model = ModelSpec(
        pad_token_id=draw(st.sampled_from([PAD, None])),
        eos_token_id=draw(st.sampled_from([EOS, EOS, None])),
        max_positions=draw(st.sampled_from([128, 40])),
        attention=draw(st.sampled_from(["sdpa", "eager"])),
    )
    sources = draw(st.lists(st.lists(words, max_size=7).map(lambda s: (*s, EOS)), min_size=1, max_size=3))
    holes = ()
    if draw(st.booleans()):  # masked tokens anywhere in a row: an attention mask of any pattern
        holes = tuple(
            tuple(draw(st.lists(st.tuples(st.integers(0, len(source)), words), max_size=2))) for source in sources
        )
    silent = draw(st.one_of(st.none(), st.integers(0, len(sources) - 1))) if draw(st.booleans()) else None
    lengths = {len(source) + len(row_holes) for source, row_holes in zip(sources, holes or [()] * len(sources))}
    # The encoder attends to what its attention mask leaves, padding included (transformers makes no mask for an
    # encoder-decoder): sources of different lengths, or with masked tokens, come with theirs.
    plain = len(lengths) == 1 and not any(holes) and silent is None
    source_mask = draw(st.booleans()) if plain else True
    prefix_kind = draw(st.sampled_from([None, "padded", "even"]))
    prefixes, prompt_mask = None, False
    if prefix_kind == "padded":
        prefixes, prompt_mask = tuple(draw(st.lists(words, max_size=4).map(tuple)) for _ in sources), True
    elif prefix_kind == "even":
        length = draw(st.integers(0, 4))
        prefixes = tuple(draw(st.lists(words, min_size=length, max_size=length).map(tuple)) for _ in sources)

    k = draw(st.sampled_from([4, 2] if bounded_searches else [4, 1, 2]))
    options = {"num_beams": k}
    if k > 1:
        options["num_return_sequences"] = draw(st.integers(1, k))
        # Half from large penalties, where the stop rule's bound on a live hypothesis decides when a sentence is done.
        large = numbers(1.0, 4.0, 1.0, 2.0)
        options["length_penalty"] = draw(
            large if bounded_searches else st.one_of(numbers(-1.0, 3.0, 0.6, 0.0, -0.5), large)
        )
    limit = draw(st.sampled_from([None, "max_new_tokens", "max_length"]))
    prompt_width = 1 + max(map(len, prefixes or [()]))
    if limit == "max_new_tokens":
        options["max_new_tokens"] = draw(st.integers(1, 12))
    elif limit == "max_length":
        options["max_length"] = prompt_width + draw(st.integers(1, 12))
    for name in draw(
        st.lists(st.sampled_from(LOWERING_OPTIONS if bounded_searches else sorted(OPTIONS)), unique=True, max_size=3)
    ):
        options[name] = draw(OPTIONS[name])
    recorded = draw(st.lists(st.sampled_from(["output_scores", "output_logits", "output_attentions",
                                              "output_hidden_states"]), unique=True))  # fmt: skip
    if recorded or draw(st.booleans()):
        options.update(return_dict_in_generate=True, **dict.fromkeys(recorded, True))
    drawn_boosts = st.lists(st.tuples(st.sampled_from([EOS, 5, 9]), numbers(-5.0, 5.0, 2.0, -3.0)), max_size=1)
    boosts = () if bounded_searches else tuple(draw(drawn_boosts))
    stops = tuple(draw(st.lists(st.one_of(st.tuples(st.just("stop at"), words),
                                          st.tuples(st.just("budget"), st.integers(1, 8))), max_size=1)))  # fmt: skip
    return Call(
        sources=tuple(sources),
        model=model,
        padding_side=draw(st.sampled_from(["right", "left"])),
        source_mask=source_mask,
        holes=holes,
        silent=silent,
        form=draw(st.sampled_from(FORMS)),
        as_config=draw(st.booleans()),
        extras=tuple(draw(st.lists(st.sampled_from(EXTRAS), unique=True, max_size=1))),
        prefixes=prefixes,
        prompt_mask=prompt_mask,
        options=tuple(sorted(options.items())),
        boosts=boosts,
        only=draw(st.one_of(st.none(), st.sampled_from([EOS, 5, 9])))
        if not bounded_searches and draw(st.booleans())
        else None,
        allowed=draw(st.booleans()),
        stops=stops,
    )


PROFILE = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


@settings(max_examples=12, derandomize=True, **PROFILE)
@given(call=calls())
# A model without a padding token decodes by default, with or without an attention mask, greedy and beam.
@example(call=Call(sources=((5, 6, 2), (7, 2)), model=ModelSpec(pad_token_id=None), options=(("num_beams", 1),)))
@example(call=Call(sources=((5, 6, 2), (7, 2)), model=ModelSpec(pad_token_id=None)))
# A stopping criterion that keeps state per row, once a sentence has ended.
@example(call=Call(sources=((5, 6, 7, 2), (8, 2), (9, 10, 2)), stops=(("budget", 6),), options=(("num_beams", 1),)))
@example(call=Call(sources=((5, 6, 7, 2), (8, 2), (9, 10, 2)), stops=(("budget", 6),)))
# A forced prefix and the positions the default limit leaves.
@example(
    call=Call(
        sources=((9, 6, 23, 19, 14, 14, 12, 2),),
        model=ModelSpec(max_positions=40),
        prefixes=((13, 22, 11, 9),),
        options=(("num_beams", 1),),
        boosts=((EOS, -30.0),),
    )
)
# An end token given to generate() is the one the paper's limit ends a sentence with.
@example(call=Call(sources=((9, 6, 23, 2), (22, 2)), options=(("eos_token_id", 5), ("num_beams", 1))))
@example(call=Call(sources=((9, 6, 23, 2), (22, 2)), options=(("eos_token_id", 5),)))
# Prefixes of different lengths: the limit counts each sentence's own prompt, not its left padding.
@example(
    call=Call(
        sources=((9, 6, 2), (22, 2)),
        prefixes=((13, 22, 11), ()),
        prompt_mask=True,
        options=(("num_beams", 1),),
        boosts=((EOS, -30.0),),
    )
)
@example(
    call=Call(sources=((9, 6, 2), (22, 2)), prefixes=((13, 22, 11), ()), prompt_mask=True, boosts=((EOS, -30.0),))
)
# min_new_tokens takes min_length's place where both are given.
@example(call=Call(sources=((2,),), options=(("min_length", 4), ("min_new_tokens", 1), ("num_beams", 1))))
# A logits processor that lifts </s> above 0: no bound on what a live hypothesis may still score.
@example(call=Call(sources=((9, 6, 23, 6, 14, 14, 12, 2),), model=ModelSpec(max_positions=40), boosts=((EOS, 2.0),)))
# A model without a padding token: its sources' lengths, and what follows a sentence's end.
@example(
    call=Call(sources=((2,),), model=ModelSpec(pad_token_id=None), source_mask=False, options=(("num_beams", 1),))
)
# A forced prefix counts in the positions a limit given to generate() needs: refused before any work.
@example(
    call=Call(
        sources=((9, 6, 2),),
        model=ModelSpec(max_positions=40),
        prefixes=((13, 22, 11),),
        options=(("max_new_tokens", 38), ("num_beams", 1)),
        boosts=((EOS, -30.0),),
    )
)
# early_stopping=True, which the paper's beam search has no meaning for, is refused.
@example(call=Call(sources=((9, 6, 2),), options=(("early_stopping", True),)))
# A model without an end token: hypotheses end at the batch's limit, or where a criterion ends them (then filled with
# -1, as transformers' beam search fills them; greedy rows go on taking their best token, as transformers' do); large
# scores held to a relative tolerance.
@example(
    call=Call(
        sources=((9, 6, 23, 2), (22, 2)),
        model=ModelSpec(eos_token_id=None),
        options=(("num_beams", 1),),
        stops=(("stop at", 6),),
    )
)
@example(
    call=Call(
        sources=((2,), (6, 7, 5, 2)),
        model=ModelSpec(pad_token_id=None, eos_token_id=None),
        options=(("output_scores", True), ("return_dict_in_generate", True)),
        stops=(("stop at", 4),),
    )
)
@example(
    call=Call(
        sources=((2,),),
        model=ModelSpec(eos_token_id=None),
        source_mask=False,
        options=(("length_penalty", -0.5), ("output_scores", True), ("return_dict_in_generate", True)),
        boosts=((EOS, 2.0),),
    )
)
# The source given as the encoder's output, in each form: the paper's limit from its attention mask.
@example(call=Call(sources=((9, 6, 2),), form="encoder_outputs", boosts=((EOS, -30.0),), options=(("num_beams", 1),)))
@example(call=Call(sources=((9, 6, 2), (22, 2)), form="encoder_outputs as a tuple", options=(("num_beams", 1),)))
# Masked tokens inside a row: a sentence's length is what its mask leaves.
@example(
    call=Call(sources=((9, 6, 2), (22, 2)), holes=(((1, 7),), ()), options=(("num_beams", 1),), boosts=((EOS, -30.0),))
)
# forced_eos_token_id forces its token at each sentence's own limit, as alone.
@example(
    call=Call(
        sources=((9, 6, 23, 2), (22, 2)),
        options=(("forced_eos_token_id", EOS), ("output_scores", True), ("return_dict_in_generate", True)),
        boosts=((EOS, -30.0),),
    )
)
# renormalize_logits: the end token the paper's limit forces keeps its log-probability.
@example(
    call=Call(
        sources=((9, 6, 2),),
        options=(("output_scores", True), ("renormalize_logits", True), ("return_dict_in_generate", True)),
        boosts=((EOS, -30.0),),
    )
)
# A constraint that leaves hypotheses unfinished: the slots no hypothesis finished in are padding, scored -inf.
@example(
    call=Call(
        sources=((9, 6, 2),),
        only=5,
        options=(("num_return_sequences", 4), ("output_scores", True), ("return_dict_in_generate", True)),
    )
)
# A model without an end token under a one-token constraint: the slots no hypothesis finished in are padding.
@example(
    call=Call(
        sources=((20, 22, 9, 21, 2),),
        model=ModelSpec(eos_token_id=None),
        only=5,
        options=(("num_beams", 2), ("num_return_sequences", 2)),
    )
)
# The search at work: a candidate without a score (-inf) never finishes.
@example(call=Call(sources=((9, 6, 2),), only=5, extras=("beam_steps",), options=(("num_return_sequences", 4),)))
# A processor that never lets a sentence end: the limit ends it all the same, in greedy search as in transformers'.
@example(call=Call(sources=((2,), (4, 2)), model=ModelSpec(pad_token_id=None), only=5, options=(("num_beams", 1),)))
@example(
    call=Call(
        sources=((2,), (4, 2)),
        only=5,
        options=(
            ("num_beams", 1),
            ("output_attentions", True),
            ("output_scores", True),
            ("return_dict_in_generate", True),
        ),
    )
)
# Candidates tied by forced tokens: the earlier hypothesis, then the lower token, first.
@example(
    call=Call(
        sources=((2,),),
        options=(
            ("forced_eos_token_id", [2, 5]),
            ("max_new_tokens", 1),
            ("num_beams", 4),
            ("num_return_sequences", 1),
        ),
    )
)
# output_logits: the model's logits for every row, a finished sentence's too.
@example(
    call=Call(sources=((9, 6, 23, 2), (22, 2)), options=(("output_logits", True), ("return_dict_in_generate", True)))
)
# The stop rule's bound: a live hypothesis may beat the finished ones at any length up to its longest, the last included.
@example(
    call=Call(
        sources=((5, 19, 20, 2), (2,)),
        model=ModelSpec(pad_token_id=None),
        options=(("length_penalty", 2.0), ("num_beams", 4), ("num_return_sequences", 2)),
    )
)
@example(
    call=Call(
        sources=((10, 16, 21, 2), (15, 14, 5, 2), (22, 23, 13, 15, 11, 21, 2)),
        model=ModelSpec(max_positions=40),
        holes=(((1, 4),), (), ()),
        as_config=True,
        prefixes=((), (9,), (10, 16, 21)),
        prompt_mask=True,
        options=(
            ("cache_implementation", "static"),
            ("disable_compile", False),
            ("encoder_repetition_penalty", 0.5),
            ("length_penalty", 2.0),
            ("num_beams", 4),
            ("num_return_sequences", 4),
            ("output_attentions", True),
            ("output_logits", True),
            ("output_scores", True),
            ("return_dict_in_generate", True),
        ),
        allowed=True,
    )
)
def test_generate_keeps_its_promises_for_any_arguments(call):
    check_call(call)


@pytest.mark.slow
@settings(max_examples=2000, **PROFILE)
@given(call=calls())
def test_generate_keeps_its_promises_for_thousands_of_drawn_arguments(call):
    check_call(call)


@pytest.mark.slow
@settings(max_examples=300, **PROFILE)
@given(call=calls(bounded_searches=True))
def test_the_beam_search_ends_a_sentence_only_once_no_live_hypothesis_can_win(call):
    """The stop rule's bound decides where no processor lifts a score: a search that stops early, or late, leaves
    another result or other scores than the definition's."""
    check_call(call)


# --- The modes the paper's methods leave to transformers. ---

# Each mode with the settings that shape it, those it always sets and those it may: decoded by transformers' own
# method, exactly as with paper_decoding=False (or refused as it refuses it). Assisted decoding's settings serve with
# prompt lookup, its assistant-free form.
MODES = {
    "sampling": (
        {"do_sample": st.just(True)},
        {
            "temperature": numbers(0.3, 2.0, 0.7),
            "top_k": st.integers(0, 10),
            "top_p": numbers(0.3, 1.0, 0.9),
            "min_p": numbers(0.0, 0.5, 0.1),
            "typical_p": numbers(0.3, 1.0, 0.9),
            "epsilon_cutoff": numbers(0.0, 0.2, 0.05),
            "eta_cutoff": numbers(0.0, 0.2, 0.05),
            "top_h": numbers(0.1, 1.0, 0.5),
            "watermarking_config": st.just({"greenlist_ratio": 0.25}),
            "num_beams": st.sampled_from([1, 2]),
        },
    ),
    "group beam search": (
        {"num_beams": st.just(4), "num_beam_groups": st.just(2), "diversity_penalty": numbers(0.1, 2.0, 0.5)},
        {},
    ),
    "contrastive search": (
        {"num_beams": st.just(1), "penalty_alpha": numbers(0.1, 0.9, 0.6)},
        {"top_k": st.integers(2, 5)},
    ),
    "DoLa": ({"num_beams": st.just(1), "dola_layers": st.sampled_from(["low", "high"])}, {}),
    "constrained beam search": (
        {"force_words_ids": st.lists(st.lists(words, min_size=1, max_size=1), min_size=1, max_size=1)},
        {"constraints": st.just([[5, 6]])},
    ),
    "assisted decoding": (
        {"num_beams": st.just(1), "prompt_lookup_num_tokens": st.integers(1, 3)},
        {
            "max_matching_ngram_size": st.integers(1, 3),
            "num_assistant_tokens": st.integers(1, 5),
            "num_assistant_tokens_schedule": st.sampled_from(["heuristic", "constant"]),
            "assistant_confidence_threshold": numbers(0.0, 1.0, 0.4),
            "assistant_early_exit": st.integers(1, 2),
            "assistant_ensemble_weight": numbers(0.0, 1.0, 0.5),
            "assistant_lookbehind": st.integers(1, 10),
            "target_lookbehind": st.integers(1, 10),
            "is_assistant": st.booleans(),
            "speculation_type": st.just("dflash"),
            "use_mtp": st.booleans(),
        },
    ),
    "classifier-free guidance": (
        {"guidance_scale": numbers(1.5, 3.0, 2.0)},
        {
            "negative_prompt_ids": st.just(torch.tensor([[5, 2]])),
            "negative_prompt_attention_mask": st.just(torch.ones(1, 2)),
        },
    ),
    "a tokenizer's strings": ({}, {"stop_strings": st.just(["w5"]), "token_healing": st.just(True)}),
    "beam search in less memory": ({"low_memory": st.just(True)}, {}),
    "continuous batching": ({"continuous_batching_config": st.just(None)}, {}),
}


@st.composite
def mode_calls(draw) -> Call:
    """A drawn call in one of transformers' modes, with a limit of max_new_tokens (the paper's limit is the paper's
    methods' own): ours and transformers' then decode alike."""
    call = draw(calls())
    required, optional = MODES[draw(st.sampled_from(sorted(MODES)))]
    mode = draw(st.fixed_dictionaries(required, optional=optional))
    options = {**call.settings, **mode, "max_new_tokens": draw(st.integers(1, 8))}
    options.pop("max_length", None)
    return replace(call, options=tuple(sorted(options.items())))


def uses_the_papers_methods(call: Call) -> bool:
    """Whether the call's mode is one the paper's methods serve (plain beam or greedy search), so that it decodes
    with the GNMT penalty rather than transformers' own method."""
    settings = {"num_beams": 4, **call.settings}
    return not settings.get("do_sample") and not any(
        key in settings
        for key in (
            "num_beam_groups",
            "penalty_alpha",
            "dola_layers",
            "force_words_ids",
            "prompt_lookup_num_tokens",
            "constraints",
        )  # fmt: skip
    )


def check_mode(call: Call) -> None:
    """The same tokens, scores and errors as transformers' method, from the same random state; where the paper's
    methods serve the mode, its own properties (check_call)."""
    if uses_the_papers_methods(call):
        check_call(call)
        return
    torch.manual_seed(0)
    ours = run(call)
    torch.manual_seed(0)
    theirs = run(call, paper_decoding=False)
    if ours.error is not None or theirs.error is not None:
        assert (type(ours.error), str(ours.error)) == (type(theirs.error), str(theirs.error))
        return
    assert torch.equal(sequences_of(ours.output), sequences_of(theirs.output))


@settings(max_examples=10, derandomize=True, **PROFILE)
@given(call=mode_calls())
def test_the_modes_left_to_transformers_decode_as_transformers(call):
    check_mode(call)


@pytest.mark.slow
@settings(max_examples=200, **PROFILE)
@given(call=mode_calls())
def test_the_modes_left_to_transformers_decode_as_transformers_in_hundreds_of_drawn_calls(call):
    check_mode(call)


# --- The entry points over generate(): translate_batch and the translation pipeline. ---


@functools.cache
def word_ids_tokenizer(padding_side: str):
    """A tokenizer of the tiny model's vocabulary: words w4 to w23 are ids 4 to 23, and every text ends with </s>."""
    tokenizer = word_tokenizer(words=[f"w{token}" for token in range(FIRST_WORD, SMALL_VOCAB_SIZE)])
    tokenizer.padding_side = padding_side
    return tokenizer


def text(tokens) -> str:
    return " ".join(f"w{token}" for token in tokens)


@dataclass(frozen=True)
class Texts:
    """Texts to translate (one per source, its words without </s>), each with a prefix or none, through `entry`: the
    translation pipeline or `translate_batch`, with a tokenizer that pads on `padding_side`."""

    texts: tuple[str, ...]
    prefixes: tuple[str, ...] | None
    entry: str
    padding_side: str
    options: tuple[tuple[str, object], ...]


# The options `texts()` draws for the entry points, besides the texts and their prefixes.
TEXT_OPTIONS = {"num_beams", "num_return_sequences", "return_scores", "max_source_length", "return_alignments",
                "alignment_layer", "truncation"}  # fmt: skip


@st.composite
def texts(draw) -> Texts:
    sources = draw(st.lists(st.lists(words, min_size=1, max_size=7), min_size=1, max_size=4))
    prefixes = None
    if draw(st.booleans()):
        prefixes = tuple(text(draw(st.lists(words, max_size=3))) for _ in sources)
    options = {"num_beams": draw(st.sampled_from([4, 1, 2])), "return_scores": draw(st.booleans())}
    if options["num_beams"] > 1:
        options["num_return_sequences"] = draw(st.integers(1, options["num_beams"]))
    if draw(st.booleans()):
        options["max_source_length"] = draw(st.integers(2, 8))
    if draw(st.booleans()):
        options.update(return_alignments=True, alignment_layer=draw(st.sampled_from([-1, 0])))
    entry = draw(st.sampled_from(["pipeline", "translate_batch"]))
    if entry == "pipeline" and draw(st.booleans()):
        options["truncation"] = True
    return Texts(
        texts=tuple(map(text, sources)),
        prefixes=prefixes,
        entry=entry,
        padding_side=draw(st.sampled_from(["right", "left"])),
        options=tuple(sorted(options.items())),
    )


def translated(call: Texts, indices) -> list:
    """The answers of the call's entry point for the texts at `indices`, together in one call."""
    model, tokenizer = model_for(ModelSpec()), word_ids_tokenizer(call.padding_side)
    texts = [call.texts[i] for i in indices]
    prefixes = None if call.prefixes is None else [call.prefixes[i] for i in indices]
    if call.entry == "translate_batch":
        return translate_batch(model, tokenizer, texts, prefixes, **dict(call.options))
    answers = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)(
        texts, prefix=prefixes, **dict(call.options)
    )
    return [answer if isinstance(answer, list) else [answer] for answer in answers]


def check_texts(call: Texts) -> None:
    """Each text gets in a batch what it gets alone, whichever side the tokenizer pads on."""
    batch = translated(call, range(len(call.texts)))
    for index, answers in enumerate(batch):
        alone = translated(call, [index])[0]
        assert [answer["translation_text"] for answer in answers] == [a["translation_text"] for a in alone]
        for answer, alone_answer in zip(answers, alone):
            assert answer.keys() == alone_answer.keys()
            assert answer.get("alignment") == alone_answer.get("alignment")
            if "score" in answer:
                assert answer["score"] == pytest.approx(alone_answer["score"], rel=1e-5, abs=1e-5)


@settings(max_examples=6, derandomize=True, **PROFILE)
@given(call=texts())
# A left-padding tokenizer and prefixes of different lengths: each source whole, not cut to the padding.
@example(
    call=Texts(
        texts=("w9 w6 w23 w7", "w22"),
        prefixes=("w13 w5", ""),
        entry="translate_batch",
        padding_side="left",
        options=(("num_beams", 1),),
    )
)
def test_the_entry_points_translate_each_text_as_alone(call):
    check_texts(call)


@pytest.mark.slow
@settings(max_examples=100, **PROFILE)
@given(call=texts())
def test_the_entry_points_translate_each_text_as_alone_in_hundreds_of_drawn_calls(call):
    check_texts(call)


# --- What the fuzzer reaches: transformers' own surface, read from the installed release. ---

# The calls' own fields and the options of `calls()`: the GenerationConfig fields every drawn call may set.
DRAWN_FIELDS = {
    "num_beams",
    "num_return_sequences",
    "length_penalty",
    "max_new_tokens",
    "max_length",
    "output_scores",
    "output_logits",
    "output_attentions",
    "output_hidden_states",
    "return_dict_in_generate",
    "max_cache_len",
    "cache_config",
    *OPTIONS,
}
# Each argument not drawn, with the test that holds it by name.
HELD_BY_NAME = {
    "prefill_chunk_size": "test_generation_modes.py::test_chunked_prefill_is_refused_for_the_one_pass_prompt_of_an_encoder_decoder",
    "streamer": "test_generation_modes.py::test_a_streamer_with_beam_search_is_refused_before_any_work",
    "assistant_model": "test_generation_modes.py::test_assisted_decoding_is_transformers_and_gives_the_greedy_translation",
    "synced_gpus": "test_synced_decoding.py::test_processes_in_step_decode_what_each_decodes_alone",
    "custom_generate": "test_generation_modes.py::test_a_callers_custom_generate_runs_in_place_of_the_papers",
    "cache": "test_generation.py::test_generation_continues_from_the_cache_it_returned",
    "decoder_start_token_id": "test_generation_modes.py::test_the_start_token_given_to_generate_starts_every_sequence",
}
# Not settings of a decoding: the version a config was saved with.
NOT_SETTINGS = {"transformers_version"}


def drawn_model_inputs() -> set[str]:
    """The model inputs the drawn calls pass: every source form, the masks, the decoder prompt and its extras."""
    call = Call(
        sources=((5, 2),), prefixes=((6,),), prompt_mask=True, extras=tuple(EXTRAS), options=(("use_cache", False),)
    )
    names = {name for form in FORMS for name in source_arguments(replace(call, form=form))}
    return names | set(arguments(call)) | {"decoder_attention_mask", "use_cache"}


def test_every_argument_of_generate_is_drawn_or_held_by_name():
    """transformers' GenerationConfig fields, generate()'s parameters and the model's inputs, as the installed release
    has them, and the entry points' options: each is drawn by the properties above or held by a test of its own. A
    field a new release adds fails here until it is."""
    fields = {name for name in vars(GenerationConfig()) if not name.startswith("_")}
    mode_fields = {name for required, optional in MODES.values() for name in (*required, *optional)}
    covered = DRAWN_FIELDS | mode_fields | set(HELD_BY_NAME) | NOT_SETTINGS
    assert not fields - covered, (
        f"GenerationConfig fields neither drawn nor held by a test: {sorted(fields - covered)}"
    )

    parameters = set(inspect.signature(GenerationMixin.generate).parameters) - {"self", "kwargs"}
    forward = set(inspect.signature(VaswaniForConditionalGeneration.forward).parameters) - {
        "self",
        "kwargs",
        "return_dict",
    }
    generate_drawn = {"generation_config", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn"}
    generate_drawn |= {"negative_prompt_ids", "negative_prompt_attention_mask"} & mode_fields
    covered = generate_drawn | drawn_model_inputs() | set(HELD_BY_NAME) | {"inputs"}
    assert not (parameters | forward) - covered, f"not drawn: {sorted((parameters | forward) - covered)}"

    entry = set(inspect.signature(translate_batch).parameters) - {"model", "tokenizer", "generate_kwargs"}
    entry |= set(inspect.signature(VaswaniTranslationPipeline._sanitize_parameters).parameters) - {
        "self",
        "generate_kwargs",
        "generation_parameters",
    }
    texts_drawn = {"texts", "prefixes", *TEXT_OPTIONS}
    assert not entry - texts_drawn, f"entry point options not drawn: {sorted(entry - texts_drawn)}"

    for node in HELD_BY_NAME.values():
        file, name = node.split("::")
        assert hasattr(importlib.import_module(file.removesuffix(".py")), name), f"no test {node}"
