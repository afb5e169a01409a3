"""CTranslate2 timed in a process where torch never ran: the measuring process of the benchmarks' CTranslate2 rows.

    python -m benchmarks.ctranslate2_timing JOB.json

A user of CTranslate2 runs it in a process of its own, as a translation service does. torch's OpenMP threads, once
they have run in a process, slow the threads of an engine timed after them there (CTranslate2 decoded at half its
speed after 50 small torch matrix products), so the benchmarks export the model beforehand, in another process, and
time CTranslate2 here: this module imports ctranslate2, tokenizers and the standard library only, and each result
says whether torch was loaded in the process all the same (`torch_loaded`), which the benchmark tests check.

JOB.json holds:
- `model_dir`: the exported CTranslate2 model; `device`, `threads`;
- `decodings`: a list of {"name", "beam_size", ...}, each timed in turn, every other key passed to `translate_batch`;
- `batches`: lists of source sentences, tokenized and detokenized inside the timed region with the model's
  `tokenizer` (its tokenizer.json) as vaswani's decoding does; or, without `tokenizer`, lists of token strings;
- `extra_length` (the limit is each batch's longest source + this many tokens, section 6.1) or `length` (exactly
  this many tokens, for random weights);
- `warmup`, `repeats`: untimed and timed decodings of all the batches.

Prints one JSON line: per decoding, its `times`, and the last decoding's `outputs` (strings or token lists) and their
`tokens` (for comparing translations detokenized as vaswani's are); and `torch_loaded`.
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
