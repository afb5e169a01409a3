"""Section 6.1's decoding (modeling/generation_vaswani.py): beam search scored with the GNMT length penalty
((5 + |Y|) / 6) ** alpha, and each sentence's own limit of its source length + 50 tokens."""

import copy
import logging
import math

import pytest
import torch
from helpers import pad_pairs
from transformers import (
    GenerationConfig,
    GenerationMixin,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.evaluation.bleu import tokenized_bleu
from vaswani.modeling import generation_vaswani, modeling_vaswani
from vaswani.modeling.generation_vaswani import gnmt_length_penalty


EOS = 2


def padded_sources(translation_pairs, rows=(0, 6, 2)):
    """Three sources of different lengths, right-padded into one batch."""
    input_ids, attention_mask, _ = pad_pairs([translation_pairs[i] for i in rows])
    return input_ids, attention_mask


def generated_length(sequence: torch.Tensor) -> int:
    """|Y|: the tokens after the start token, up to and including the first </s>."""
    tokens = sequence[1:].tolist()
    return tokens.index(EOS) + 1


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_sequences_scores_are_the_gnmt_formula_of_the_token_log_probabilities(
    trained_tiny_model, translation_pairs, alpha
):
    input_ids, attention_mask = padded_sources(translation_pairs)
    out = trained_tiny_model.generate(
        input_ids,
        attention_mask=attention_mask,
        num_return_sequences=4,
        length_penalty=alpha,
        output_scores=True,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[0] == 12 and out.sequences_scores.shape == (12,)
    for row, (sequence, score) in enumerate(zip(out.sequences, out.sequences_scores)):
        sentence = row // 4
        length = generated_length(sequence)
        with torch.no_grad():
            logits = trained_tiny_model(
                input_ids=input_ids[sentence : sentence + 1],
                attention_mask=attention_mask[sentence : sentence + 1],
                decoder_input_ids=sequence[None, :length],
            ).logits[0]
        log_probability = logits.log_softmax(-1).gather(1, sequence[1 : length + 1, None]).sum()
        torch.testing.assert_close(score, log_probability / ((5 + length) / 6) ** alpha, atol=1e-5, rtol=1e-5)
    # Best first, for each sentence.
    for sentence_scores in out.sequences_scores.view(3, 4):
        assert torch.all(sentence_scores[:-1] >= sentence_scores[1:])
    # The best hypothesis is the translation itself (the model was trained to give it).
    for sentence, pair in enumerate(translation_pairs[i] for i in (0, 6, 2)):
        target = pair[1]
        assert out.sequences[4 * sentence, 1 : len(target) + 1].tolist() == target


class DiscourageEnd(LogitsProcessor):
    """Takes 30 nats from </s>, so that no hypothesis ends before it is made to."""

    def __call__(self, input_ids, scores):
        scores[:, EOS] -= 30.0
        return scores


@pytest.mark.parametrize("num_beams", [1, 4])
def test_each_sentence_of_a_padded_batch_stops_at_its_own_length_plus_50(tiny_config, num_beams):
    torch.manual_seed(0)
    tiny_config.max_position_embeddings = 128
    model = VaswaniForConditionalGeneration(tiny_config).eval()
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [11, 12, 2, 0, 0, 0, 0], [13, 14, 15, 16, 2, 0, 0]])
    attention_mask = (input_ids != 0).long()
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        num_beams=num_beams,
        num_return_sequences=num_beams,
        logits_processor=[DiscourageEnd()],
        return_dict_in_generate=True,
        output_scores=True,
    )
    source_lengths = attention_mask.sum(1).repeat_interleave(num_beams)
    for sequence, source_length in zip(out.sequences, source_lengths):
        assert generated_length(sequence) == source_length + 50
    assert out.sequences.shape[1] == 1 + 7 + 50  # the longest sentence's limit, not more
    # transformers' decoding limits the whole batch by its padded length instead.
    batch_limited = model.generate(
        input_ids,
        attention_mask=attention_mask,
        num_beams=num_beams,
        paper_decoding=False,
        logits_processor=[DiscourageEnd()],
    )
    assert (batch_limited[:, 1:] != 0).sum(1).tolist() == [57, 57, 57]


def test_greedy_decoding_and_transformers_beam_search_are_unchanged(trained_tiny_model, translation_pairs):
    input_ids, attention_mask = padded_sources(translation_pairs)
    limit = {"max_new_tokens": input_ids.shape[1] + 50}

    def plain(**options):  # transformers' own generate(), without this package's override
        return GenerationMixin.generate(trained_tiny_model, input_ids, attention_mask=attention_mask, **options)

    beam = trained_tiny_model.generate(input_ids, attention_mask=attention_mask, paper_decoding=False)
    assert torch.equal(beam, plain(**limit))
    greedy = trained_tiny_model.generate(input_ids, attention_mask=attention_mask, num_beams=1)
    assert torch.equal(greedy, plain(num_beams=1, **limit))
    # A model whose generation config was saved before paper_decoding existed decodes as it did then.
    old_config = GenerationConfig(**trained_tiny_model.generation_config.to_diff_dict())
    del old_config.paper_decoding
    trained_tiny_model.generation_config = old_config
    old = trained_tiny_model.generate(input_ids, attention_mask=attention_mask)
    assert torch.equal(old, beam)


def test_paper_and_transformers_beam_search_rank_by_their_own_penalty(trained_tiny_model, translation_pairs):
    """The two searches differ only in how a finished hypothesis is scored: |Y| ** alpha against lp(Y)."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    options = {"num_return_sequences": 4, "output_scores": True, "return_dict_in_generate": True}
    ours = trained_tiny_model.generate(input_ids, attention_mask=attention_mask, **options)
    theirs = trained_tiny_model.generate(input_ids, attention_mask=attention_mask, paper_decoding=False, **options)
    lengths = torch.tensor([generated_length(sequence) for sequence in theirs.sequences])
    raw = theirs.sequences_scores * lengths**0.6  # transformers divides by |Y| ** alpha
    torch.testing.assert_close(ours.sequences_scores[::4], (raw / ((5 + lengths) / 6) ** 0.6)[::4], atol=1e-5, rtol=0)


def test_beam_sampling_on_the_default_config_is_transformers_beam_sampling_with_a_notice(
    trained_tiny_model, translation_pairs, caplog
):
    """The paper's search does not sample: do_sample=True with beams runs transformers' beam sampling, and says so."""
    input_ids, attention_mask, _ = pad_pairs(translation_pairs[:3])
    options = {"do_sample": True, "num_beams": 4, "temperature": 2.0, "max_new_tokens": 8}

    def sample(**extra):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return trained_tiny_model.generate(input_ids, attention_mask=attention_mask, **options, **extra)

    logging.Logger.warning_once.cache_clear()  # transformers' once-per-process notices: this test must see it
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(caplog.handler)  # the library's loggers do not propagate to the root logger
    try:
        default = sample()
    finally:
        transformers_logger.removeHandler(caplog.handler)
    assert torch.equal(default, sample(paper_decoding=False))
    notices = [record.getMessage() for record in caplog.records if "beam sampling" in record.getMessage()]
    assert notices == [
        "The paper's decoding is beam search without sampling (section 6.1): do_sample=True with num_beams > 1 runs "
        "transformers' beam sampling."
    ]


def test_a_new_model_decodes_as_the_paper(tiny_config):
    config = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=50)).generation_config
    assert (config.num_beams, config.length_penalty, config.paper_decoding) == (4, 0.6, True)


def test_tokenized_bleu_splits_compounds_as_tensor2tensor_does():
    # Moses tokens: "the cat ##AT##-##AT## like dog sat ." against "the cat ##AT##-##AT## like dog sat on the mat .":
    # precisions 7/7, 5/6, 4/5, 3/4; brevity penalty exp(1 - 10/7).
    score = tokenized_bleu(["the cat-like dog sat."], ["the cat-like dog sat on the mat."], "en")
    expected = 100 * math.exp(1 - 10 / 7) * (1 * 5 / 6 * 4 / 5 * 3 / 4) ** 0.25
    assert score.score == pytest.approx(expected, abs=1e-9)
    assert (score.sys_len, score.ref_len) == (7, 10)
    # Moses splits the final full stop and the comma; the hyphen of a compound is its own token, counted as matched.
    assert tokenized_bleu(
        ["Ein rich-text Format, bitte."], ["Ein rich-text Format, bitte."], "de"
    ).score == pytest.approx(100.0)
    # "Ein rich ##AT##-##AT## text Format" against "Ein rich ##AT##-##AT## text ##AT##-##AT## Format".
    score = tokenized_bleu(["Ein rich-text Format"], ["Ein rich-text-Format"], "de")
    assert (score.sys_len, score.ref_len) == (5, 6)


class NeverEnds(StoppingCriteria):
    """Ends nothing; a stopping criterion of the caller's may count on the batch's rows, so the search keeps every
    sentence in the batch to its end."""

    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def decoded_rows(model, input_ids, **options):
    """generate()'s output, and the number of rows the model decoded at each step."""
    rows = []
    hook = model.lm_head.register_forward_hook(lambda module, args, output: rows.append(args[0].shape[0]))
    try:
        output = model.generate(input_ids, output_scores=True, return_dict_in_generate=True, **options)
    finally:
        hook.remove()
    return output, rows


def test_finished_sentences_leave_the_batch_and_no_translation_or_score_changes(trained_tiny_model, translation_pairs):
    input_ids, attention_mask = padded_sources(translation_pairs)
    options = {"attention_mask": attention_mask, "num_return_sequences": 2}
    dropping, rows = decoded_rows(trained_tiny_model, input_ids, **options)
    whole, whole_rows = decoded_rows(
        trained_tiny_model, input_ids, stopping_criteria=StoppingCriteriaList([NeverEnds()]), **options
    )
    assert set(whole_rows) == {12}
    assert rows[0] == 12 and rows[-1] < 12 and rows == sorted(rows, reverse=True), rows
    assert torch.equal(dropping.sequences, whole.sequences)
    assert torch.equal(dropping.beam_indices, whole.beam_indices)
    torch.testing.assert_close(dropping.sequences_scores, whole.sequences_scores)
    # A finished sentence's steps score -inf either way.
    torch.testing.assert_close(torch.stack(dropping.scores), torch.stack(whole.scores))


def test_a_sentence_stops_once_the_hypotheses_it_returns_are_settled(trained_tiny_model, translation_pairs):
    """Returning the best hypothesis only, the search stops sooner than returning all four, with the same best."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    best, best_rows = decoded_rows(trained_tiny_model, input_ids, attention_mask=attention_mask)
    all_four, all_rows = decoded_rows(
        trained_tiny_model, input_ids, attention_mask=attention_mask, num_return_sequences=4
    )
    assert sum(best_rows) < sum(all_rows)
    for sentence, sequence in enumerate(best.sequences):
        length = generated_length(sequence) + 1
        assert torch.equal(sequence[:length], all_four.sequences[4 * sentence, :length])
    torch.testing.assert_close(best.sequences_scores, all_four.sequences_scores[::4])


def test_greedy_decoding_drops_finished_sentences_and_decodes_as_transformers_greedy_search(
    trained_tiny_model, translation_pairs
):
    """Greedy decoding (num_beams=1) computes the sentences still decoded, as CTranslate2 does, where transformers'
    greedy search computes every row to the end; the translations are transformers' greedy search's, and asking for
    every step's scores keeps every row to the end, as transformers returns them."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    rows = []
    hook = trained_tiny_model.lm_head.register_forward_hook(lambda module, args, output: rows.append(len(args[0])))
    try:
        dropping = trained_tiny_model.generate(input_ids, attention_mask=attention_mask, num_beams=1)
        dropping_rows, rows[:] = list(rows), []
        whole = trained_tiny_model.generate(
            input_ids, attention_mask=attention_mask, num_beams=1, paper_decoding=False
        )
        whole_rows, rows[:] = list(rows), []
        scored = trained_tiny_model.generate(
            input_ids, attention_mask=attention_mask, num_beams=1, output_scores=True, return_dict_in_generate=True
        )
    finally:
        hook.remove()
    assert set(whole_rows) == {3} and set(rows) == {3}
    assert dropping_rows[0] == 3 and dropping_rows[-1] < 3, dropping_rows
    assert dropping_rows == sorted(dropping_rows, reverse=True) and len(dropping_rows) == len(whole_rows)
    assert torch.equal(dropping, whole) and torch.equal(scored.sequences, whole)


def test_beam_steps_show_the_search_at_work_without_changing_it(trained_tiny_model, translation_pairs):
    """`generate(beam_steps=[])`: a record per step of every sentence still searched, its 2k candidates best first
    (k live, the ones that ended, the rest dropped); the translations and scores are those of a search not watched."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    options = {"attention_mask": attention_mask, "return_dict_in_generate": True, "output_scores": True}
    steps = []
    watched = trained_tiny_model.generate(input_ids, beam_steps=steps, **options)
    unwatched = trained_tiny_model.generate(input_ids, **options)
    assert torch.equal(watched.sequences, unwatched.sequences)
    torch.testing.assert_close(watched.sequences_scores, unwatched.sequences_scores)
    num_beams, batch = trained_tiny_model.generation_config.num_beams, input_ids.shape[0]
    assert steps[0].sentences.tolist() == list(range(batch)) and len(steps[-1].sentences) < batch  # sentences leave
    for number, step in enumerate(steps, start=1):
        assert step.tokens.shape == (len(step.sentences), 2 * num_beams, number)
        assert torch.equal(step.scores, step.scores.sort(dim=1, descending=True).values)
        assert not (step.live & step.ended).any()
        # The live ones are the k best of those that did not end: every dropped candidate scores below them.
        assert (step.live.sum(1) == num_beams).all()
        dropped = ~step.live & ~step.ended
        worst_live = step.scores.masked_fill(~step.live, float("inf")).min(1).values
        assert (step.scores.masked_fill(~dropped, -float("inf")).max(1).values <= worst_live).all()
    # Each sentence's translation ended at some step, its summed log-probability there its score times lp(|Y|).
    for sentence, (sequence, score) in enumerate(zip(watched.sequences, watched.sequences_scores)):
        generated = sequence[1 : generated_length(sequence) + 1]
        found = [
            step.scores[row, candidate]
            for step in steps
            for row in (step.sentences == sentence).nonzero().view(-1).tolist()
            for candidate in step.ended[row].nonzero().view(-1).tolist()
            if step.tokens.shape[2] == len(generated) and torch.equal(step.tokens[row, candidate], generated)
        ]
        assert found and found[0] / gnmt_length_penalty(len(generated), 0.6) == pytest.approx(score.item(), abs=1e-5)


def test_a_hypothesis_keeps_the_cache_row_of_the_one_it_first_extends(
    trained_tiny_model, translation_pairs, monkeypatch
):
    """Each step copies the cache only into rows whose new hypothesis extends another row's (a parent's second child
    takes a row no hypothesis extends): fewer rows than the search holds, with the hypotheses, scores and beam indices
    of a search without a cache."""
    copied, searched_rows = [], []
    copy_rows = generation_vaswani.copy_cache_rows

    def counting(cache, sources, targets, filled):
        assert not set(sources.tolist()) & set(targets.tolist())
        copied.append(len(targets))
        copy_rows(cache, sources, targets, filled)

    monkeypatch.setattr(generation_vaswani, "copy_cache_rows", counting)
    input_ids, attention_mask = padded_sources(translation_pairs)
    options = {"attention_mask": attention_mask, "num_return_sequences": 4, "return_dict_in_generate": True}
    options["output_scores"] = True
    hook = trained_tiny_model.lm_head.register_forward_hook(lambda _, args, __: searched_rows.append(len(args[0])))
    try:
        cached = trained_tiny_model.generate(input_ids, **options)
    finally:
        hook.remove()
    uncached = trained_tiny_model.generate(input_ids, use_cache=False, **options)
    assert copied and sum(copied) < sum(searched_rows[1:]) / 2, (copied, searched_rows)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert torch.equal(cached.beam_indices, uncached.beam_indices)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores)


def test_follow_keeps_a_first_child_in_its_parents_row_and_gives_the_others_the_unextended_rows_in_order():
    state = generation_vaswani.BeamSearchState.start(
        torch.ones((8, 1), dtype=torch.long), GenerationConfig(num_beams=4, max_length=5), LogitsProcessorList()
    )
    # Best first, the new hypotheses extend rows [2, 2, 0, 2] and [1, 0, 3, 2]; no hypothesis extends rows 1, 3.
    sources = state.follow(torch.tensor([[2, 2, 0, 2], [1, 0, 3, 2]]))
    assert state.held.tolist() == [[2, 1, 0, 3], [1, 0, 3, 2]]  # the rank of the hypothesis each row holds
    assert sources.tolist() == [[0, 2, 2, 2], [0, 1, 2, 3]]  # the row each row's cache comes from


def searched(model, input_ids, packed: bool, monkeypatch, **options):
    """generate()'s output with the linear layers packed for oneDNN or torch's own, and the layers whose packed
    weights it multiplied by, in the order it did."""
    calls = []
    packed_linear = generation_vaswani.packed_linear
    layers = [layer for layer in model.modules() if isinstance(layer, torch.nn.Linear)]

    def counting(weight, bias, inputs):
        calls.append(next(layer for layer in layers if torch.equal(layer.weight, weight.to_dense())))
        return packed_linear(weight, bias, inputs)

    with monkeypatch.context() as patch:
        patch.setattr(generation_vaswani, "packed_linear", counting)
        if not packed:
            patch.setattr(generation_vaswani, "packs_linear_layers", lambda model: False)
        output = model.generate(input_ids, return_dict_in_generate=True, output_scores=True, **options)
    return output, calls


@pytest.mark.parametrize("num_beams", [4, 1])
@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_packed_linear_layers_decode_as_torchs_and_see_every_change_of_the_weights(
    trained_tiny_model, translation_pairs, monkeypatch, num_beams, part
):
    """On an x86 CPU generate() computes the encoder's linear layers, and the paper's searches the decoder's, from
    weights packed for oneDNN, with the translations and scores of torch's linear layers; the packed weights are made
    for each call, so weights changed in place between two calls decode as changed, and every layer is torch's own
    again after a call."""
    model = copy.deepcopy(trained_tiny_model)
    with torch.no_grad():
        if not generation_vaswani.packs_linear_layers(model):
            pytest.skip("oneDNN's packed linear layers run on x86 CPUs with oneDNN")
    input_ids, attention_mask = padded_sources(translation_pairs)
    monkeypatch.setattr(modeling_vaswani, "PACKED_ENCODER_TOKENS", input_ids.numel())  # a source just long enough
    options = {"attention_mask": attention_mask, "num_beams": num_beams}
    changed = getattr(model.model, part).layers
    decoded = []
    for change in (None, -1.0):
        if change is not None:
            with torch.no_grad():
                for layer in changed:
                    layer.feed_forward.fc2.weight.mul_(change)
        packed, calls = searched(model, input_ids, True, monkeypatch, **options)
        plain, no_calls = searched(model, input_ids, False, monkeypatch, **options)
        assert all(any(call is layer.feed_forward.fc2 for call in calls) for layer in changed) and not no_calls
        assert torch.equal(packed.sequences, plain.sequences)
        torch.testing.assert_close(torch.stack(packed.scores), torch.stack(plain.scores))
        assert not any("forward" in vars(module) for module in model.modules())
        decoded.append(plain.sequences)
    assert not torch.equal(*decoded)  # the change shows in the translations


def test_a_source_shorter_than_packing_repays_leaves_the_encoder_layers_to_torch(
    trained_tiny_model, translation_pairs, monkeypatch
):
    """Packing a weight takes a fixed time, which the encoder's one call repays only on enough tokens: generate()
    packs the encoder's weights for a source of at least `PACKED_ENCODER_TOKENS` tokens (rows times positions,
    padding included), and leaves a shorter one's layers to torch."""
    with torch.no_grad():
        if not generation_vaswani.packs_linear_layers(trained_tiny_model):
            pytest.skip("oneDNN's packed linear layers run on x86 CPUs with oneDNN")
    input_ids, attention_mask = padded_sources(translation_pairs)
    encoder_layers = [
        module for module in trained_tiny_model.model.encoder.modules() if type(module) is torch.nn.Linear
    ]
    for threshold, packs in ((input_ids.numel(), True), (input_ids.numel() + 1, False)):
        monkeypatch.setattr(modeling_vaswani, "PACKED_ENCODER_TOKENS", threshold)
        _, calls = searched(trained_tiny_model, input_ids, True, monkeypatch, attention_mask=attention_mask)
        assert any(call is layer for call in calls for layer in encoder_layers) == packs, threshold
