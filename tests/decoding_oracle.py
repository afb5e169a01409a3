"""The paper's decoding written as plainly as it reads: the definition the model's decoding methods are held to.

Section 6.1 decodes with "beam size of 4 and length penalty alpha = 0.6" and a "maximum output length [of] input
length + 50". The penalty is Wu et al. (2016), eq. 14: a finished hypothesis scores its log-probability divided by
lp(Y) = ((5 + |Y|) / 6) ** alpha, |Y| its tokens after the decoder prompt. The search keeps, as tensor2tensor's beam
search for the paper does, at each step the 2k best one-token continuations of the k live hypotheses: those that end
join the finished ones, the k best others stay live. Greedy decoding appends the most probable token.

Everything else follows transformers' documentation of `generate()`'s arguments (`GenerationConfig`, the logits
processors and stopping criteria): the processors change a step's scores in the order `generate()` builds them (its
own, then the caller's), a sequence ends at an end token, at `max_new_tokens`, or where a stopping criterion says so,
and where the paper's limit applies `</s>` is the only token a hypothesis may take at it.

One sentence at a time, with Python lists, every hypothesis decoded from scratch by the model's forward pass (no
cache), searched until no hypothesis is left to extend: slow and obviously right. Nothing here comes from
modeling/generation_vaswani.py. A plain module: pytest puts tests/ on sys.path (see helpers.py).
"""

import math
from dataclasses import dataclass, field

import torch


NEG_INF = -math.inf


@dataclass(frozen=True)
class Rules:
    """What a `generate()` call asks of each step of one sentence's decoding.

    eos: the end tokens (`eos_token_id`, one or a list); a sequence ends at any of them.
    max_new_tokens: the most tokens after the decoder prompt (`max_new_tokens`, or what `max_length` leaves).
    limit: the paper's limit, the most tokens after the start token (a forced prefix included), or None; at it the
        first end token is the only token left, with the score the processors left it.
    padding: the padding before this sentence's decoder prompt in its batch: transformers' processors that count
        positions (forced_bos_token_id, begin_suppress_tokens, exponential_decay_length_penalty) or read the tokens
        before a hypothesis (sequence_bias, encoder_no_repeat_ngram_size) see the padded row.
    encoder_ids: the source row as generate() was given it as `input_ids` (padding and masked tokens included), which
        the encoder_* processors read; None where the source came in another form (they are then not applied).
    min_length, min_new_tokens, repetition_penalty, no_repeat_ngram_size, bad_words_ids, suppress_tokens,
    begin_suppress_tokens, forced_bos_token_id, forced_eos_token_id, sequence_bias, encoder_repetition_penalty,
    encoder_no_repeat_ngram_size, exponential_decay_length_penalty, remove_invalid_values, renormalize_logits: as
        `GenerationConfig` documents them; forced_eos_token_id forces its tokens at the sentence's last position (the
        paper's limit where it applies, else the last that max_new_tokens leaves).
    allowed: `prefix_allowed_tokens_fn`, a function of the padded row: the tokens it allows next.
    processors: the caller's logits processors, each a function of (tokens, scores) for this sentence alone.
    stops: the caller's stopping criteria, each a function of (tokens, prompt length): whether the sequence ends.
    """

    eos: tuple[int, ...]
    max_new_tokens: int
    limit: int | None = None
    padding: int = 0
    encoder_ids: tuple[int, ...] | None = None
    min_length: int = 0
    min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    forced_bos_token_id: int | None = None
    forced_eos_token_id: tuple[int, ...] = ()
    sequence_bias: tuple[tuple[tuple[int, ...], float], ...] = ()
    encoder_repetition_penalty: float = 1.0
    encoder_no_repeat_ngram_size: int = 0
    exponential_decay_length_penalty: tuple[int, float] | None = None
    remove_invalid_values: bool = False
    renormalize_logits: bool = False
    allowed: object = None
    processors: tuple = field(default=())
    stops: tuple = field(default=())


def next_token_logits(model, source: list[int], hypotheses: list[list[int]]) -> torch.Tensor:
    """The model's logits for the token after each hypothesis (all of one length), in float32 as generate() reads
    them: every decoder position computed again, no cache."""
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([source] * len(hypotheses)),
            decoder_input_ids=torch.tensor(hypotheses),
            use_cache=False,
        ).logits
    return logits[:, -1].float()


def forced(scores: torch.Tensor, tokens, value=None) -> torch.Tensor:
    """Every token -inf but `tokens`, which score `value` (their own scores where None)."""
    kept = torch.full_like(scores, NEG_INF)
    for token in tokens:
        kept[token] = scores[token] if value is None else value
    return kept


def processed(rules: Rules, tokens: list[int], prompt_length: int, scores: torch.Tensor) -> torch.Tensor:
    """The scores of the token after `tokens` (the prompt, then the tokens generated so far), as the processors leave
    them: transformers' own in the order generate() builds them, then the caller's, the renormalisation, and the
    paper's limit."""
    scores = scores.clone()
    row = [0] * rules.padding + tokens  # the row as the batch holds it, behind its prompt's padding
    generated = len(tokens) - prompt_length
    for sequence, bias in rules.sequence_bias:
        if len(sequence) == 1 or (
            len(sequence) - 1 <= len(row) and row[len(row) - len(sequence) + 1 :] == list(sequence[:-1])
        ):
            scores[sequence[-1]] += bias
    if rules.encoder_ids is not None and rules.encoder_repetition_penalty != 1.0:
        penalty = 1 / rules.encoder_repetition_penalty
        for token in set(rules.encoder_ids):
            value = scores[token]
            scores[token] = value * penalty if value < 0 else value / penalty
    if rules.repetition_penalty != 1.0:
        for token in set(tokens):  # a token seen anywhere, the prompt included, is penalised
            value = scores[token]
            scores[token] = value * rules.repetition_penalty if value < 0 else value / rules.repetition_penalty
    n = rules.no_repeat_ngram_size
    if n and len(tokens) >= n:
        for start in range(len(tokens) - n + 1):
            if tokens[start : start + n - 1] == tokens[len(tokens) - n + 1 :]:
                scores[tokens[start + n - 1]] = NEG_INF
    n = rules.encoder_no_repeat_ngram_size
    if rules.encoder_ids is not None and n:
        source = list(rules.encoder_ids)
        for start in range(len(source) - n + 1):
            if tuple(row[len(row) + 1 - n : len(row)]) == tuple(source[start : start + n - 1]):
                scores[source[start + n - 1]] = NEG_INF
    for bad in rules.bad_words_ids:
        if len(bad) == 1 and bad[0] in rules.eos:
            continue  # transformers never bans an end token by itself
        if len(bad) == 1 or tokens[len(tokens) - len(bad) + 1 :] == list(bad[:-1]):
            scores[bad[-1]] = NEG_INF
    if len(tokens) < rules.min_length or generated < rules.min_new_tokens:
        for token in rules.eos:
            scores[token] = NEG_INF
    if rules.allowed is not None:
        scores = forced(scores, rules.allowed(row))
    if rules.forced_bos_token_id is not None and len(row) == 1:
        scores = forced(scores, [rules.forced_bos_token_id], 0.0)
    at_limit = rules.limit is not None and len(tokens) >= rules.limit
    if rules.forced_eos_token_id and (at_limit or generated == rules.max_new_tokens - 1):
        scores = forced(scores, rules.forced_eos_token_id, 0.0)
    if rules.remove_invalid_values:
        scores = torch.nan_to_num(scores, nan=0.0)
    if rules.exponential_decay_length_penalty is not None:
        start, factor = rules.exponential_decay_length_penalty
        if generated > start:
            for token in rules.eos:
                if math.isfinite(scores[token]):
                    scores[token] = scores[token] + abs(scores[token]) * (pow(factor, generated - start) - 1)
    for token in rules.suppress_tokens:
        scores[token] = NEG_INF
    first = 1 if rules.padding + prompt_length == 1 and rules.forced_bos_token_id is not None else 0
    if generated == first:
        for token in rules.begin_suppress_tokens:
            scores[token] = NEG_INF
    for processor in rules.processors:
        scores = processor(tokens, scores)
    if rules.renormalize_logits:
        scores = torch.log_softmax(scores, dim=-1)
    if at_limit:  # the token chosen now would be past the limit: it ends the sentence, allowed or not
        end = rules.eos[0]
        scores = forced(scores, [end], scores[end] if scores[end] > NEG_INF else torch.finfo(scores.dtype).min)
    return scores


def ends(rules: Rules, tokens: list[int], prompt_length: int) -> bool:
    """Whether a sequence ends after its last token: an end token, the most new tokens, or a stopping criterion."""
    return (
        tokens[-1] in rules.eos
        or len(tokens) - prompt_length >= rules.max_new_tokens
        or any(stop(tokens, prompt_length) for stop in rules.stops)
    )


@dataclass
class GreedyResult:
    tokens: list[int]  # the prompt, then the generated tokens
    logits: list[torch.Tensor]  # the model's, one per step
    scores: list[torch.Tensor]  # as the processors left them, one per step


def greedy(model, source: list[int], prompt: list[int], rules: Rules) -> GreedyResult:
    """Greedy decoding: at each step the token the processed scores rank first."""
    result = GreedyResult(list(prompt), [], [])
    while True:
        logits = next_token_logits(model, source, [result.tokens])[0]
        scores = processed(rules, result.tokens, len(prompt), logits)
        result.tokens.append(int(scores.argmax()))
        result.logits.append(logits)
        result.scores.append(scores)
        if ends(rules, result.tokens, len(prompt)):
            return result


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """Wu et al. (2016), eq. 14."""
    return ((5 + length) / 6) ** alpha


@dataclass
class Hypothesis:
    tokens: list[int]
    log_probability: float  # summed over the generated tokens, as the processors scored them


def gnmt_beam_search(
    model, source: list[int], prompt: list[int], rules: Rules, num_beams: int, alpha: float, num_return: int
) -> list[tuple[list[int], float]]:
    """The paper's beam search of one sentence: the `num_return` best finished hypotheses, best first, each with its
    log-probability divided by lp(|Y|)."""
    live = [Hypothesis(list(prompt), 0.0)]
    finished = []
    while live:
        log_probs = torch.log_softmax(next_token_logits(model, source, [h.tokens for h in live]), dim=-1)
        candidates = []
        for hypothesis, row in zip(live, log_probs):
            scores = processed(rules, hypothesis.tokens, len(prompt), row)
            for token, score in enumerate(scores.tolist()):
                if score > torch.finfo(scores.dtype).min:  # the limit's ending that no processor allowed is none
                    # Summed in float32, step by step, as generate() sums a hypothesis' scores.
                    total = (torch.tensor(hypothesis.log_probability) + torch.tensor(score)).item()
                    candidates.append(Hypothesis([*hypothesis.tokens, token], total))
        candidates.sort(key=lambda h: h.log_probability, reverse=True)
        live = []
        for candidate in candidates[: 2 * num_beams]:
            if ends(rules, candidate.tokens, len(prompt)):
                length = len(candidate.tokens) - len(prompt)
                finished.append((candidate.tokens, candidate.log_probability / gnmt_length_penalty(length, alpha)))
            elif len(live) < num_beams:
                live.append(candidate)
    finished.sort(key=lambda pair: pair[1], reverse=True)
    return finished[:num_return]
