"""The attention explorer (`vaswani-demo`, vaswani.inspection.app) as a user reaches it: started by its command on a
trained model folder, asked through gradio_client as the page asks (the app's own HTTP API), beside the translation
pipeline with the same settings."""

import concurrent.futures
import html

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from helpers import PAIRS, exit_message, free_port

from vaswani import VaswaniTranslationPipeline
from vaswani.inspection.app import AVERAGE
from vaswani.inspection.maps import KINDS
from vaswani.scripts.demo import main


@pytest.fixture(scope="module")
def page(trained_text_model):
    """The page served by `vaswani-demo --model FOLDER` and a client of it; the model and tokenizer beside."""
    model, tokenizer, folder = trained_text_model
    port = free_port()
    app = main(["--model", folder, "--port", port], block=False)
    yield Client(f"http://127.0.0.1:{port}/", verbose=False), model, tokenizer
    app.close()


def ask(client, text, num_beams=4, length_penalty=0.6, nbest=1, kind=KINDS[2], layer="1", head=AVERAGE):
    """What the page shows for one request: translation, n-best table, attention, alignment, beam steps."""
    return client.predict(text, num_beams, length_penalty, nbest, kind, layer, head, api_name="/translate")


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_page_translates_as_the_pipeline_does_with_the_same_settings(page, num_beams):
    client, model, tokenizer = page
    translate = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)
    for source, _ in PAIRS:
        expected = translate(source, num_beams=num_beams, length_penalty=0.6, num_return_sequences=num_beams,
                             return_scores=True)  # fmt: skip
        translation, nbest, *_ = ask(client, source, num_beams=num_beams, nbest=num_beams)
        assert translation == expected[0]["translation_text"]
        assert [row[2] for row in nbest["data"]] == [answer["translation_text"] for answer in expected]
        assert [row[1] for row in nbest["data"]] == [pytest.approx(a["score"], abs=1e-4) for a in expected]


def test_the_attention_view_holds_the_sentences_tokens_and_every_weight(page):
    client, model, tokenizer = page
    source, target = PAIRS[0]
    translation, _, attention, alignment, _ = ask(client, source, kind=KINDS[2], layer="2", head="3")
    source_tokens = [t.replace("Ġ", "_") for t in tokenizer.convert_ids_to_tokens(tokenizer(source).input_ids)]
    target_tokens = tokenizer.convert_ids_to_tokens(tokenizer(text_target=translation).input_ids)
    assert "layer 2, head 3" in attention
    words = [t.replace("Ġ", "_") for t in target_tokens if t not in tokenizer.all_special_tokens]
    for token in source_tokens + words:
        assert f">{html.escape(token)}</th>" in attention
    # One cell a (target position, source token) pair, its weight under the pointer.
    assert attention.count("<td title=") == len(source_tokens) * len(target_tokens)
    assert "&rarr;" in alignment


def test_the_beam_search_is_shown_step_by_step(page):
    client, *_ = page
    translation, *_, steps = ask(client, PAIRS[1][0], num_beams=4)
    rows = steps["data"]
    assert [row[0] for row in rows] == list(range(1, len(rows) + 1))
    assert all(row[1].count("(") == 4 for row in rows[:-1])  # k hypotheses kept live at every step but the last
    assert any(translation in row[2] for row in rows)  # the translation ended at one of the steps
    assert rows[-1][3] != ""  # a finished hypothesis, with its penalised score
    assert all(row[4].count("(") <= 1 for row in rows)  # the best dropped candidate, one at most
    greedy = ask(client, PAIRS[1][0], num_beams=1)
    assert greedy[-1]["data"] == []  # greedy decoding keeps no beam


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"text": "   "}, "Type or paste a sentence"),
        ({"text": "the " * 200}, "this model reads at most 128"),
        ({"text": PAIRS[0][0], "num_beams": 99}, "Value 99 is greater than maximum value 16"),
        ({"text": PAIRS[0][0], "num_beams": 2, "nbest": 3}, "at most the beam size (2)"),
    ],
)
def test_bad_input_gets_a_message_in_the_page_and_the_server_keeps_serving(page, request_, message):
    client, *_ = page
    with pytest.raises(AppError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ask(client, **request_)
    assert ask(client, PAIRS[2][0])[0]


def test_sixteen_concurrent_requests_get_what_they_get_one_by_one(page):
    client, *_ = page
    sources = [source for source, _ in PAIRS] * 4
    alone = {source: ask(client, source)[:2] for source in sources[: len(PAIRS)]}
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda source: ask(client, source)[:2], sources))
    assert together == [alone[source] for source in sources]


def test_a_folder_that_is_not_a_vaswani_model_is_refused_at_start_in_one_sentence(tmp_path, trained_text_model):
    (tmp_path / "config.json").write_text('{"model_type": "marian"}')
    message = exit_message(main, ["--model", tmp_path])
    assert message.endswith(f"--model {tmp_path} holds a model of type 'marian'; this command takes 'vaswani' models.")
    message = exit_message(main, ["--model", tmp_path / "missing"])
    assert "does not exist" in message
