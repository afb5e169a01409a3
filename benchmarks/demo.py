"""The attention explorer as a user meets it: how long `vaswani-demo` takes to serve, how long the page takes to
answer a 20-token sentence with all its attention maps, and a screenshot of the page.

    python -m benchmarks.demo --model outputs/main_job/model [--requests 10] [--output_dir docs/benchmarks]
                              [--screenshot docs/images/demo.png]

`vaswani-demo` starts in a process of its own; each request goes through the page's HTTP API (gradio_client) with the
page's defaults. Writes `demo.{json,md}` in --output_dir: the start, and the median and slowest of --requests answers
after one untimed. --screenshot drives the page in headless Chromium (Debian's `chromium` and `chromium-driver`).
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gradio_client import Client

from benchmarks import harness


SENTENCE = "And God said, Let there be light: and there was light, and God saw the light."


def serve(model: str, port: int) -> tuple[subprocess.Popen, Client, float]:
    """Start `vaswani-demo` and wait for its page: the process, a client of the page, the seconds it took."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "vaswani.scripts.demo", "--model", model, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    while True:
        if process.poll() is not None:
            raise SystemExit(f"vaswani-demo ended (code {process.returncode}):\n{process.stderr.read()[-3000:]}")
        try:
            client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            return process, client, time.perf_counter() - started
        except Exception:
            time.sleep(0.2)


def ask(client: Client, text: str):
    return client.predict(
        text, 4, 0.6, 1, "encoder-decoder attention", "1", "average of the heads", api_name="/translate"
    )


def screenshot(url: str, text: str, path: Path) -> dict:
    """The page in headless Chromium after translating `text`, saved as a PNG at `path`; what the page shows: the
    translation and the attention map's HTML."""
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1500"):
        options.add_argument(argument)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    try:
        browser.get(url)
        wait = WebDriverWait(browser, 120)
        wait.until(lambda page: page.find_elements(By.CSS_SELECTOR, "#sentence textarea"))[0].send_keys(text)
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda page: "<td title=" in page.find_element(By.ID, "attention").get_attribute("innerHTML"))
        path.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(path))
        return {
            "translation": browser.find_element(By.CSS_SELECTOR, "#translation textarea").get_property("value"),
            "attention_html": browser.find_element(By.ID, "attention").get_attribute("innerHTML"),
        }
    finally:
        browser.quit()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", default=SENTENCE)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--output_dir", default="docs/benchmarks")
    parser.add_argument("--screenshot", default=None, help="where the page's screenshot goes (PNG); none by default")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    import vaswani  # noqa: F401  (registers model_type "vaswani", whose folders hold a plain tokenizer)

    tokens = len(AutoTokenizer.from_pretrained(args.model)(args.text).input_ids)
    port = harness.free_port()
    process, client, start = serve(args.model, port)
    try:
        translation = ask(client, args.text)[0]  # untimed
        seconds = []
        for _ in range(args.requests):
            began = time.perf_counter()
            ask(client, args.text)
            seconds.append(time.perf_counter() - began)
        browser = (
            screenshot(f"http://127.0.0.1:{port}/", args.text, Path(args.screenshot)) if args.screenshot else None
        )
    finally:
        process.terminate()
        process.wait()
    result = {
        "model": args.model,
        "text": args.text,
        "source_tokens": tokens,
        "translation": translation,
        "start_s": round(start, 2),
        "answer_median_s": round(statistics.median(seconds), 3),
        "answer_slowest_s": round(max(seconds), 3),
        "requests": args.requests,
        "browser": browser,  # what headless Chromium showed, with --screenshot
        **harness.environment("gradio", "gradio_client", "torch"),
    }
    rows = [
        ["`vaswani-demo` start, until the page answers", result["start_s"]],
        [
            f"one request, {tokens} source tokens, all attention maps: median of {args.requests}",
            result["answer_median_s"],
        ],
        ["the same, slowest", result["answer_slowest_s"]],
    ]
    page = (
        f"# The attention explorer: start and answer\n\n`python -m benchmarks.demo --model {args.model}`; sentence: "
        f"{args.text!r} ({tokens} tokens with </s>), translated {translation!r}; {harness.describe(result)}.\n\n"
        f"{harness.table(['measure', 'seconds'], rows)}\n"
    )
    harness.write_page(Path(args.output_dir) / "demo", result, page)
    return result


if __name__ == "__main__":
    main()
