"""vaswani-translate on a large file: one against two CPU processes, memory and start time as the file grows, and
CTranslate2's `translate_file` beside it.

    python -m benchmarks.translate_files run --model M --dataset_dir BIBLE --workdir WORK [--lines 100000]
        [--seconds 240] [--big 1000000,10000000] [--max_tokens 1024] [--chunk_lines 200] [--ctranslate2_lines 2000]
        [--load TEXT] [--notes TEXT]
    python -m benchmarks.translate_files large ... [--max_source_length 1024]   (the large files again: their rows
        replace those of the same size and flag)
    python -m benchmarks.translate_files compare --workdir WORK       (CTranslate2's translations beside vaswani's)
    python -m benchmarks.translate_files report        (the page again from its JSON)

Writes `translate_files.{json,md}` in docs/benchmarks. How it measures:

- The corpus is --lines English sentences of BIBLE's train split, cycled; the large files (--big) the same, longer.
- A measurement is one start of scripts/translate.py in a session of its own: 1 process, or 2 gloo processes through
  `accelerate launch --multi_gpu`, with OMP_NUM_THREADS=1, the paper's beam search, --max_tokens and --chunk_lines.
- A bounded run is stopped after --seconds (SIGKILL to every process). The finished chunks are on disk; a process's
  lines a second are the lines of its chunks finished after its first, over the time between the first's write and
  the last's; the processes' rates add up. The lines translated are those in finished chunks.
- psutil samples every process every 0.2 s; a process's peak memory is the kernel's (VmHWM).
- The start time runs from the start to the first chunk's write: reading the whole file once (line count, digest,
  UTF-8) and checking the lengths of the process's lines, loading the model, translating one chunk. The large files
  are stopped there.
- CTranslate2 (a process without torch) translates the corpus's first --ctranslate2_lines lines with `translate_file`:
  beam 4, length penalty 0.6 (its |Y| ** alpha), batches of --max_tokens tokens (`batch_type="tokens"`), sorted
  within --chunk_lines lines (`read_batch_size`), its output limit 256 tokens; 1 thread, then 2 translators of one
  thread each (`inter_threads=2`), the CPU's two processes.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness


RESULTS = harness.REPO / "docs" / "benchmarks" / "translate_files"


def build_corpus(dataset_dir: Path, path: Path, lines: int) -> Path:
    """`lines` English sentences of the train split, cycled, one a line (kept where already built)."""
    if path.exists() and sum(1 for _ in path.open("rb")) == lines:
        return path
    from datasets import load_from_disk

    sentences = [pair["en"].replace("\n", " ") for pair in load_from_disk(str(dataset_dir))["train"]["translation"]]
    with path.open("w", encoding="utf-8") as file:
        for index in range(lines):
            file.write(sentences[index % len(sentences)] + "\n")
    return path


def translate_command(processes: int, arguments: list) -> list:
    script = [str(harness.REPO / "scripts" / "translate.py"), *map(str, arguments)]
    if processes == 1:
        return [sys.executable, *script]
    launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes)]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return [sys.executable, *launch, "--main_process_port", str(harness.free_port()), *script]


def measure(model, corpus: Path, output: Path, processes: int, args, stop_at_first: bool, log: Path) -> dict:
    """One start of the command, stopped after args.seconds (or at the first chunk): its workers' peak memory, the
    time to the first chunk, the lines translated and the lines a second (the module's docstring)."""
    parts = output.with_name(output.name + ".parts")
    if parts.exists():
        for path in parts.iterdir():
            path.unlink()
        parts.rmdir()
    flags = ["--max_tokens", args.max_tokens, "--chunk_lines", args.chunk_lines, "--device", "cpu"]
    if args.max_source_length is not None:
        flags += ["--max_source_length", args.max_source_length]
    command = translate_command(processes, ["--model", model, "--input", corpus, "--output", output, *flags])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    started, peaks, first_chunk = time.perf_counter(), {}, None
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=harness.REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        tree = harness.ProcessTree(process.pid)
        while process.poll() is None:
            for pid, (_, argv, _, _, peak) in tree.sample().items():
                if any(part.endswith("translate.py") for part in argv) and "accelerate.commands.launch" not in argv:
                    peaks[pid] = max(peaks.get(pid, 0), peak)
            chunks = list(parts.glob("*[0-9].txt")) if parts.exists() else []
            elapsed = time.perf_counter() - started
            if chunks and first_chunk is None:
                first_chunk = elapsed
            if (stop_at_first and chunks) or elapsed > (args.start_timeout if stop_at_first else args.seconds):
                break
            time.sleep(harness.SAMPLE_SECONDS)
        tree.kill(process)
    if first_chunk is None:
        raise SystemExit(f"no chunk was finished in {elapsed:.0f} s; see {log}")
    chunks = [
        (int(path.stem), path.stat().st_mtime, sum(1 for _ in path.open("rb"))) for path in parts.glob("*[0-9].txt")
    ]
    rate = 0.0
    for rank in range(processes):
        mine = sorted((when, lines) for index, when, lines in chunks if index % processes == rank)
        if len(mine) < 2:  # no rate without two chunks of each process
            rate = None
            break
        rate += sum(lines for _, lines in mine[1:]) / (mine[-1][0] - mine[0][0])
    return {
        "processes": processes,
        "input_lines": sum(1 for _ in corpus.open("rb")),
        "seconds": round(time.perf_counter() - started, 1),
        "to_first_chunk_s": round(first_chunk, 1),
        "lines_translated": sum(lines for *_, lines in chunks),
        "chunks_finished": len(chunks),
        "lines_per_s": None if stop_at_first or rate is None else round(rate, 2),
        "peak_memory_per_process_mib": sorted(round(peak / 2**20) for peak in peaks.values()),
        "max_source_length": args.max_source_length,
    }


def ctranslate2_job(job_file: str) -> dict:
    """CTranslate2's translate_file of the job (`run_ctranslate2`), timed; imports no torch."""
    import ctranslate2
    from tokenizers import Tokenizer

    job = json.loads(Path(job_file).read_text())
    tokenizer = Tokenizer.from_file(job["tokenizer"])
    tokenizer.no_padding()
    tokenizer.no_truncation()
    results = {}
    for name, inter_threads in (("1 thread", 1), ("2 translators, 1 thread each", 2)):
        translator = ctranslate2.Translator(
            job["model_dir"], device="cpu", inter_threads=inter_threads, intra_threads=1
        )
        start = time.perf_counter()
        stats = translator.translate_file(
            job["input"],
            job["output"],
            max_batch_size=job["max_tokens"],
            batch_type="tokens",
            read_batch_size=job["chunk_lines"],
            beam_size=4,
            length_penalty=0.6,
            source_tokenize_fn=lambda line: tokenizer.encode(line).tokens,
            target_detokenize_fn=lambda tokens: tokenizer.decode(
                [tokenizer.token_to_id(token) for token in tokens], skip_special_tokens=True
            ).strip(),
        )
        seconds = time.perf_counter() - start
        results[name] = {
            "lines": stats.num_examples,
            "seconds": round(seconds, 1),
            "lines_per_s": round(stats.num_examples / seconds, 2),
        }
    return results


def run_ctranslate2(model, corpus: Path, workdir: Path, args) -> dict:
    head = workdir / f"head_{args.ctranslate2_lines}.txt"
    with corpus.open(encoding="utf-8") as source, head.open("w", encoding="utf-8") as target:
        for _, line in zip(range(args.ctranslate2_lines), source):
            target.write(line)
    model_dir = workdir / "ct2"
    if not (model_dir / "model.bin").exists():
        harness.export_ctranslate2(model, model_dir, "float32")
    job = {
        "model_dir": str(model_dir),
        "tokenizer": str(Path(model) / "tokenizer.json"),
        "input": str(head),
        "output": str(workdir / "ct2_out.txt"),
        "max_tokens": args.max_tokens,
        "chunk_lines": args.chunk_lines,
    }
    (workdir / "ct2_job.json").write_text(json.dumps(job))
    return harness.run_json(["-m", "benchmarks.translate_files", "ctranslate2", workdir / "ct2_job.json"])


def compare_outputs(workdir: Path, lines: int) -> dict:
    """CTranslate2's translations of the first `lines` lines beside vaswani's (the chunks the 2-process run finished,
    in order): how many are the same, and how many ran past 100 words (a sentence whose translation does not end)."""
    ctranslate2 = (workdir / "ct2_out.txt").read_text(encoding="utf-8").splitlines()
    parts = sorted((workdir / "out.txt.parts").glob("*[0-9].txt"))
    vaswani = [line for part in parts for line in part.read_text(encoding="utf-8").splitlines()][:lines]
    ctranslate2 = ctranslate2[: len(vaswani)]
    return {
        "lines": len(vaswani),
        "identical": sum(a == b for a, b in zip(ctranslate2, vaswani)),
        "over_100_words": {
            "ctranslate2": sum(len(line.split()) > 100 for line in ctranslate2),
            "vaswani": sum(len(line.split()) > 100 for line in vaswani),
        },
    }


def render(data: dict) -> str:
    scaling = data["scaling"]
    rows = [
        [
            row["processes"],
            "n/a" if row["lines_per_s"] is None else f"{row['lines_per_s']:.2f}",
            "n/a"
            if None in (row["lines_per_s"], scaling[0]["lines_per_s"])
            else f"{row['lines_per_s'] / scaling[0]['lines_per_s']:.2f}x",
            f"{row['lines_translated']:,} of {row['input_lines']:,} in {row['seconds']:.0f} s",
            ", ".join(f"{mib:,}" for mib in row["peak_memory_per_process_mib"]),
            f"{row['to_first_chunk_s']:.1f}",
        ]
        for row in scaling
    ]
    big = [
        [
            f"{row['input_lines']:,}",
            row["processes"],
            row.get("max_source_length") or "",
            ", ".join(f"{mib:,}" for mib in row["peak_memory_per_process_mib"]),
            f"{row['to_first_chunk_s']:.1f}",
        ]
        for row in [scaling[0], *data["large_files"]]
    ]
    ct2 = [
        [name, f"{row['lines_per_s']:.2f}", f"{row['lines']:,} lines in {row['seconds']:.1f} s"]
        for name, row in data["ctranslate2"].items()
    ]
    same = data.get("ctranslate2_outputs")
    if same:
        ct2.append(
            [
                "translations beside vaswani's",
                "",
                f"{same['identical']:,} of {same['lines']:,} the same; past 100 words: "
                f"{same['over_100_words']['ctranslate2']} (vaswani: {same['over_100_words']['vaswani']})",
            ]
        )
    settings = data["settings"]
    return (
        "\n\n".join(
            [
                "# Translating a large file (`benchmarks/translate_files.py`)",
                f"{harness.describe(data['environment'])}. The model: {settings['model']}. The paper's beam search "
                f"(beam 4), float32, --max_tokens {settings['max_tokens']}, --chunk_lines {settings['chunk_lines']}, "
                f"one thread a process. {data['load']}",
                "## One against two processes",
                harness.table(
                    [
                        "processes",
                        "lines/s",
                        "scaling",
                        "translated (bounded run)",
                        "peak MiB per process",
                        "to the first chunk (s)",
                    ],  # fmt: skip
                    rows,
                ),
                "## Memory and start time as the file grows (stopped at the first chunk)",
                harness.table(
                    [
                        "input lines",
                        "processes",
                        "--max_source_length",
                        "peak MiB per process",
                        "to the first chunk (s)",
                    ],
                    big,
                ),
                "## CTranslate2's translate_file on the corpus's first lines",
                harness.table(["CTranslate2 float32", "lines/s", "run"], ct2),
                data["notes"],
            ]
        )
        + "\n"
    )


def large_files(args) -> list:
    """The large files, each measured to its first chunk in one process."""
    rows = []
    for lines in map(int, args.big.split(",")):
        big = build_corpus(args.dataset_dir, args.workdir / f"corpus_{lines}.txt", lines)
        log = args.workdir / f"log_{lines}"
        rows.append(measure(args.model, big, args.workdir / "out_big.txt", 1, args, True, log))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "large", "compare", "ctranslate2", "report"])
    parser.add_argument("job", nargs="?", help="ctranslate2's JOB.json (run writes it)")
    parser.add_argument("--model", help="a model folder with its tokenizer")
    parser.add_argument("--dataset_dir", type=Path, help="BIBLE, the default corpus (prepare_data.py's DatasetDict)")
    parser.add_argument("--workdir", type=Path, help="where the corpora, outputs and logs go")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=240, help="a bounded run's length")
    parser.add_argument("--big", default="1000000,10000000", help="the large files' lines, comma-separated")
    parser.add_argument("--start_timeout", type=float, default=1800, help="a large file's limit to its first chunk")
    parser.add_argument("--max_tokens", type=int, default=1024)
    parser.add_argument("--chunk_lines", type=int, default=200)
    parser.add_argument("--ctranslate2_lines", type=int, default=2000)
    parser.add_argument(
        "--max_source_length",
        type=int,
        help="large: the large files again with it (no line's tokens are counted before the first chunk)",
    )
    parser.add_argument("--load", default="", help="what else ran on the machine, for the page")
    parser.add_argument("--notes", default="", help="a paragraph for the page")
    args = parser.parse_args()
    if args.command == "ctranslate2":
        print(json.dumps(ctranslate2_job(args.job)))
        return
    if args.command == "report":
        data = json.loads(Path(f"{RESULTS}.json").read_text())
        harness.write_page(RESULTS, data, render(data))
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.command == "compare":  # CTranslate2's translations beside vaswani's, added to the record
        data = json.loads(Path(f"{RESULTS}.json").read_text())
        data["ctranslate2_outputs"] = compare_outputs(args.workdir, args.ctranslate2_lines)
        harness.write_page(RESULTS, data, render(data))
        return
    if args.command == "large":  # rows of large files, in the record's place of those of the same size and flag
        data = json.loads(Path(f"{RESULTS}.json").read_text())
        measured = {(row["input_lines"], row.get("max_source_length")): row for row in large_files(args)}
        for index, row in enumerate(data["large_files"]):
            data["large_files"][index] = measured.pop((row["input_lines"], row.get("max_source_length")), row)
        data["large_files"] += measured.values()
        data["notes"] = args.notes or data["notes"]
        harness.write_page(RESULTS, data, render(data))
        return
    corpus = build_corpus(args.dataset_dir, args.workdir / f"corpus_{args.lines}.txt", args.lines)
    scaling = [
        measure(
            args.model, corpus, args.workdir / "out.txt", processes, args, False, args.workdir / f"log_{processes}"
        )
        for processes in (1, 2)
    ]
    data = {
        "environment": harness.environment("torch", "transformers", "accelerate", "ctranslate2"),
        "settings": {key: getattr(args, key) for key in ("model", "lines", "seconds", "max_tokens", "chunk_lines")},
        "load": args.load,
        "notes": args.notes,
        "scaling": scaling,
        "large_files": large_files(args),
        "ctranslate2": run_ctranslate2(args.model, corpus, args.workdir, args),
    }
    data["ctranslate2_outputs"] = compare_outputs(args.workdir, args.ctranslate2_lines)
    harness.write_page(RESULTS, data, render(data))


if __name__ == "__main__":
    main()
