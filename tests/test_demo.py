"""The attention explorer (`vaswani-demo`, vaswani.inspection.app) as a user reaches it: started by its command on a
trained model folder, asked through gradio_client as the page asks (the app's own HTTP API), beside the translation
pipeline with the same settings."""

import concurrent.futures
import html
import re
import shutil
import sys
import time
from pathlib import Path

import gradio
import pytest
import torch
import transformers
from gradio_client import Client
from gradio_client.exceptions import AppError
from helpers import PAIRS, exit_message, finish, free_port, run_command, script_command, start
from hub_server import HubServer
from huggingface_hub import HfApi, ModelCard

from vaswani import VaswaniTranslationPipeline
from vaswani.inspection.app import AVERAGE, attention_html
from vaswani.inspection.maps import KINDS, AttentionMaps
from vaswani.scripts.demo import main


@pytest.fixture(scope="module")
def served(trained_text_model):
    """The address of the page served by `vaswani-demo --model FOLDER`."""
    port = free_port()
    app = main(["--model", trained_text_model[2], "--port", port], block=False)
    yield f"http://127.0.0.1:{port}/"
    app.close()


@pytest.fixture(scope="module")
def page(served, trained_text_model):
    """A client of the page, and the model and tokenizer it serves."""
    model, tokenizer, _ = trained_text_model
    return Client(served, verbose=False), model, tokenizer


ALICE_TOKEN = "hf_aliceSecretToken0123456789"


def wait_for_page(url, process, timeout=300):
    """A client of the page at `url` once it answers; fails with the output of `process`, which serves it, if that
    ends first."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            stdout, stderr = finish(process)
            pytest.fail(f"the page's process ended (code {process.returncode}):\n{stdout[-2000:]}\n{stderr[-4000:]}")
        try:
            return Client(url, verbose=False)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def axes(attention: str) -> tuple[list[str], list[str]]:
    """The column and row labels of an attention map's HTML table."""
    columns = re.findall(r'<th style="writing-mode[^"]*">(.*?)</th>', attention)
    rows = re.findall(r'<th style="text-align: right">(.*?)</th>', attention)
    return [html.unescape(label) for label in columns], [html.unescape(label) for label in rows]


def ascii_only(text: str) -> str:
    return "".join(character for character in text if character.isascii())


def spelt(labels: list[str]) -> str:
    """The text that token labels spell, "_" read as the space it shows; a character that the tokenizer splits over
    two tokens shows as two replacement characters, left out with every other non-ASCII one."""
    return ascii_only("".join(labels).replace("_", " "))


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
    assert "layer 2, head 3" in attention
    # The axes: the source and the translation behind <s>, token by token, each as the text it stands for.
    columns, rows = axes(attention)
    assert spelt(columns) == ascii_only(source + "</s>") and spelt(rows) == ascii_only("<s>" + translation)
    # One cell a (target position, source token) pair, its weight under the pointer.
    assert attention.count("<td title=") == len(columns) * len(rows)
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
    assert exit_message(main, ["--model", tmp_path, "--private"]).endswith(
        "--private makes a Space private: give --space."
    )


@pytest.mark.browser
def test_a_reader_translates_in_a_real_browser_and_sees_the_sentences_tokens(served, trained_text_model, tmp_path):
    """Headless Chromium (Debian's `chromium` and `chromium-driver`) on the page `vaswani-demo` serves: type,
    translate, read what the page shows, and take its screenshot (as docs/images/demo.png shows the main job's)."""
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    model, tokenizer, _ = trained_text_model
    source, screenshot = PAIRS[0][0], tmp_path / "vaswani-demo.png"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1500"):
        options.add_argument(argument)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    try:
        browser.get(served)
        wait = WebDriverWait(browser, 120)
        wait.until(lambda page: page.find_elements(By.CSS_SELECTOR, "#sentence textarea"))[0].send_keys(source)
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda page: "<td title=" in page.find_element(By.ID, "attention").get_attribute("innerHTML"))
        browser.save_screenshot(str(screenshot))
        translation = browser.find_element(By.CSS_SELECTOR, "#translation textarea").get_property("value")
        attention = browser.find_element(By.ID, "attention").get_attribute("innerHTML")
    finally:
        browser.quit()
    print(f"screenshot: {screenshot}")
    expected = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)(source, num_beams=4, length_penalty=0.6)
    assert translation == expected[0]["translation_text"]
    columns, rows = axes(attention)
    assert spelt(columns) == ascii_only(source + "</s>") and spelt(rows) == ascii_only("<s>" + translation)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000


HIDE_THE_PACKAGE = """
import importlib.abc, runpy, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vaswani" or name.startswith("vaswani."):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
runpy.run_path("app.py", run_name="__main__")
"""


@pytest.mark.slow  # a push to a local Hub, and the Space's app started in a process of its own
def test_the_space_runs_what_was_pushed_without_the_package(trained_text_model, tmp_path):
    """`vaswani-demo --model REPO --space SPACE` against a local Hub: the Space's files, then its app.py run from a
    download of them in a Python where vaswani cannot be imported, answering as the pipeline does."""
    model, tokenizer, folder = trained_text_model
    with HubServer(users={"alice": ALICE_TOKEN}) as hub:
        env = hub.client_env(tmp_path / "home", ALICE_TOKEN)
        run_command(
            script_command("push_to_hub", "--model_dir", folder, "--repo_id", "alice/tiny"), env=env, check=True
        )
        pushed = run_command(
            script_command("demo", "--model", "alice/tiny", "--space", "alice/tiny-explorer"), env=env, check=True
        )
        assert "alice/tiny-explorer" in pushed.stdout and ALICE_TOKEN not in pushed.stdout + pushed.stderr
        api = HfApi(endpoint=hub.url, token=ALICE_TOKEN)
        # A repo that holds another kind of model: refused in one sentence, served or pushed as a Space.
        api.create_repo("alice/marian")
        api.upload_file(
            path_or_fileobj=b'{"model_type": "marian"}', path_in_repo="config.json", repo_id="alice/marian"
        )
        for command in (["--model", "alice/marian"], ["--model", "alice/marian", "--space", "alice/marian-explorer"]):
            refused = run_command(script_command("demo", *command), env=env)
            assert refused.returncode == 1 and "Traceback" not in refused.stderr
            assert refused.stderr.strip().endswith("alice/marian holds a model of type 'marian', not a vaswani model.")
        space = Path(api.snapshot_download("alice/tiny-explorer", repo_type="space", cache_dir=tmp_path / "cache"))
        assert sorted(p.relative_to(space).as_posix() for p in space.rglob("*") if p.is_file()) == [
            ".gitattributes", "README.md", "app.py", "explorer/__init__.py", "explorer/app.py",
            "explorer/figures.py", "explorer/maps.py", "requirements.txt",
        ]  # fmt: skip
        pins = dict(line.split("==") for line in (space / "requirements.txt").read_text().splitlines())
        assert pins["torch"] == torch.__version__.split("+")[0] and pins["transformers"] == transformers.__version__
        card = ModelCard.load(space / "README.md", repo_type="space")
        assert (card.data.sdk, card.data.sdk_version, card.data.models) == (
            "gradio",
            gradio.__version__,
            ["alice/tiny"],
        )

        port = free_port()
        serving = start(
            [sys.executable, "-c", HIDE_THE_PACKAGE], cwd=space, env={**env, "GRADIO_SERVER_PORT": str(port)}
        )
        try:
            client = wait_for_page(f"http://127.0.0.1:{port}/", serving)
            answer = ask(client, PAIRS[3][0], nbest=2)
        finally:
            serving.terminate()
            finish(serving)
    expected = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)(
        PAIRS[3][0], num_beams=4, length_penalty=0.6, num_return_sequences=2
    )
    assert [row[2] for row in answer[1]["data"]] == [hypothesis["translation_text"] for hypothesis in expected]


def test_a_layer_or_head_one_stack_lacks_is_said_in_the_page():
    """Stacks of different depths (Table 3 allows them): the choices run to the deeper one, the shallower says so."""
    maps = AttentionMaps(
        source_tokens=["a", "</s>"],
        decoder_tokens=["<s>", "b"],
        encoder_self=(torch.full((2, 2, 2), 0.5),) * 3,
        decoder_self=(torch.full((2, 2, 2), 0.5),),
        encoder_decoder=(torch.full((2, 2, 2), 0.5),),
    )
    assert attention_html(maps, KINDS[0], "3", "2").count("<td title=") == 4
    assert attention_html(maps, KINDS[2], "3", AVERAGE) == "<p>The decoder has 1 layers of 2 heads.</p>"
    assert attention_html(maps, KINDS[1], "1", "3") == "<p>The decoder has 1 layers of 2 heads.</p>"
