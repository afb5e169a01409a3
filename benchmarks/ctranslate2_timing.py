"""CTranslate2 timed in a process where torch never ran: the measuring process of the benchmarks' CTranslate2 rows.

    python -m benchmarks.ctranslate2_timing JOB.json

torch's OpenMP threads, once they have run in a process, slow an engine timed after them there (benchmarks/README.md,
"Each engine alone"), so this module imports ctranslate2, tokenizers and the standard library only. JOB.json holds
`model_dir`, `device`, `threads`; `decodings` ({"name", "beam_size", ...}: the other keys go to `translate_batch`);
`batches` (sentences, tokenized with the job's `tokenizer` inside the timed region, or token strings without one);
`extra_length` (limit: the longest source + this many tokens) or `length` (exactly this many); `warmup`, `repeats`.
Prints one JSON line: each decoding's `times`, the last decoding's `outputs` and their `tokens`, and `torch_loaded`.
"""

import json
import sys
import time


def torch_loaded() -> bool:
    """Whether torch is in this process: imported from Python, or its library mapped into memory by anything."""
    if "torch" in sys.modules:
        return True
    try:
        with open("/proc/self/maps") as maps:
            return any("libtorch" in line for line in maps)
    except OSError:  # not Linux: the module table is all there is to read
        return False


def batches(sentences: list[str], batch_size: int) -> list[list[int]]:
    """The batches `vaswani.evaluation.bleu.translations` decodes: indices of sentences of similar length, longest
    (in characters) first."""
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def decode_all(translator, tokenizer, job: dict, options: dict) -> tuple[list, list[list[str]]]:
    """Every batch of the job, translated with `options`: the outputs (strings where the job has a tokenizer, else
    token lists) and each output's tokens."""
    outputs, tokens = [], []
    for batch in job["batches"]:
        if tokenizer is not None:
            batch = [encoding.tokens for encoding in tokenizer.encode_batch(batch)]
        if "length" in job:
            limits = {"max_decoding_length": job["length"], "min_decoding_length": job["length"]}
        else:
            limits = {"max_decoding_length": max(map(len, batch)) + job["extra_length"]}
        results = translator.translate_batch(batch, **options, **limits)
        hypotheses = [result.hypotheses[0] for result in results]
        tokens += hypotheses
        if tokenizer is not None:
            ids = [[tokenizer.token_to_id(token) for token in hypothesis] for hypothesis in hypotheses]
            hypotheses = [text.strip() for text in tokenizer.decode_batch(ids, skip_special_tokens=True)]
        outputs += hypotheses
    return outputs, tokens


def main(job_file: str) -> dict:
    import ctranslate2

    job = json.loads(open(job_file).read())
    tokenizer = None
    if job.get("tokenizer"):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(job["tokenizer"])
        # A saved tokenizer.json keeps the padding and truncation it was last used with; each sentence goes in whole
        # and unpadded, as transformers' tokenizer gives it to vaswani.
        tokenizer.no_padding()
        tokenizer.no_truncation()
    translator = ctranslate2.Translator(job["model_dir"], device=job["device"], intra_threads=job["threads"])
    results = {}
    for decoding in job["decodings"]:
        options = {key: value for key, value in decoding.items() if key != "name"}
        times = []
        for repeat in range(job["warmup"] + job["repeats"]):
            start = time.perf_counter()
            outputs, tokens = decode_all(translator, tokenizer, job, options)
            if repeat >= job["warmup"]:
                times.append(time.perf_counter() - start)
        results[decoding["name"]] = {"times": times, "outputs": outputs, "tokens": tokens}
    return {"decodings": results, "torch_loaded": torch_loaded()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
