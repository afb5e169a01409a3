"""Memory and start-up time of the training data path at WMT scale.

    python -m benchmarks.data_scale memory   --dataset_dir BIBLE --workdir WORK [--sizes 1M,4.5M] [--processes 1,2]
    python -m benchmarks.data_scale pipeline --dataset_dir BIBLE --workdir WORK [--sizes 36M] [--timeout 14400]
    python -m benchmarks.data_scale report

BIBLE is a DatasetDict of scripts/prepare_data.py; WORK receives corpus_N (BIBLE's train split copied to N pairs, each
copy's words shuffled), the BPE tok4000, the runs and the logs. Results merge into docs/benchmarks/data_scale.json,
keyed by (mode, corpus, processes, cache), and data_scale.md is written from it.
"""

import argparse
import datetime
import json
import shlex
import shutil
import sys
from pathlib import Path

from benchmarks import data_scale_work as work
from benchmarks import harness
from benchmarks.data_scale_work import LAUNCH


RESULTS = harness.REPO / "docs" / "benchmarks" / "data_scale"  # for .json and .md
KEY = ("mode", "corpus", "processes", "cache")  # an entry of data_scale.json replaces the one with its key
PIPELINE_CONFIG, PIPELINE_SAMPLE = "en-es", 1_000_000  # the Hub layout's configuration; train_tokenizer's sample


def parse_pairs(text):
    """A number of train pairs: 40000, 100k, 4.5M; or "default", the --dataset_dir corpus itself."""
    if text == "default":
        return text
    scale = {"k": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    try:
        rows = round(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        rows = 0
    if rows < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of pairs such as 40000, 100k or 4.5M")
    return rows


def comma_list(parse):
    return lambda text: [parse(item) for item in text.split(",") if item]


def corpus_path(args, size):
    return args.dataset_dir if size == "default" else args.workdir / f"corpus_{size}"


def prepare(args):
    """WORK's folders and the corpora of --sizes it lacks."""
    for folder in ("runs", "logs"):
        (args.workdir / folder).mkdir(parents=True, exist_ok=True)
    for size in args.sizes:
        if size != "default":
            work.built(f"corpus of {size:,} pairs", corpus_path(args, size), work.build_corpus, args.dataset_dir, size)


def two_starts(args, mode, size, corpus, processes, tokenizer):
    """A first start of train.py on `corpus` (which tokenizes it) and a cached one, each saved as an entry."""
    rows, name = work.train_rows(corpus), "default" if size == "default" else f"corpus_{size}"
    for cache in ("first run", "cached"):
        print(f"{mode}: {rows:,} pairs, {processes} process(es), cache {cache}", flush=True)
        label = f"{mode}_{name}_{processes}p_{cache.replace(' ', '_')}"
        entry = {"mode": mode, "corpus": name, "rows": rows, "processes": processes, "cache": cache}
        entry |= work.measure(args, corpus, processes, cache, tokenizer, label)
        save_result(args, entry)
        print("  " + " | ".join(memory_cells(entry)), flush=True)


def run_memory(args):
    prepare(args)
    vocab, tokenizer = LAUNCH["vocab"], args.workdir / f"tok{LAUNCH['vocab']}"
    work.built(f"tokenizer, {vocab} tokens", tokenizer, work.train_tokenizer, args.dataset_dir, vocab)
    for size in args.sizes:
        for processes in args.processes:
            two_starts(args, "memory", size, corpus_path(args, size), processes, tokenizer)


def run_pipeline(args):
    """Per corpus size: prepare_data.py from the Hub's layout, train_tokenizer.py on a sample, two starts."""
    prepare(args)
    hf_cache = args.workdir / "hf_cache"
    environment = {"HF_DATASETS_CACHE": str(hf_cache)}  # load_dataset's Arrow copy of the Parquet
    for size in args.sizes:
        hub, corpus = args.workdir / f"hub_{size}", corpus_path(args, size)
        work.built(f"Hub layout of {size:,} pairs", hub, work.write_hub_layout, corpus, PIPELINE_CONFIG)
        prepared, tokenizer = args.workdir / f"prepared_{size}", args.workdir / f"tok_prepared_{size}"
        sample = [f"--vocab_size={LAUNCH['vocab']}", "--max_sentences", str(PIPELINE_SAMPLE)]
        steps = {  # each script's arguments and the folder it writes
            "prepare_data": (["--dataset", str(hub), "--dataset_config", PIPELINE_CONFIG], prepared),
            "train_tokenizer": (["--dataset_dir", str(prepared), *sample], tokenizer),
        }
        for step, (arguments, output) in steps.items():
            print(f"pipeline: {step}, {size:,} pairs", flush=True)
            command = [f"scripts/{step}.py", *arguments, "--output_dir", str(output)]
            shutil.rmtree(output, ignore_errors=True)
            shutil.rmtree(hf_cache, ignore_errors=True)
            log = args.workdir / "logs" / f"pipeline_{step}_{size}.log"
            entry = {"mode": "pipeline", "corpus": f"corpus_{size}", "processes": 2, "cache": step}
            entry |= harness.run_measured([sys.executable, *command], env=environment, log=log)
            entry["bytes"] = harness.folder_bytes([output])
            save_result(args, entry | work.provenance(["python3", *command]))
        two_starts(args, "pipeline", size, prepared, 2, tokenizer)
        shutil.rmtree(hf_cache, ignore_errors=True)


# --- Results: data_scale.json accumulates, data_scale.md is written from all of it. ---


def load_results(stem):
    path = Path(f"{stem}.json")
    return json.loads(path.read_text()) if path.exists() else {"invocations": [], "results": []}


def save_result(args, entry):
    """Merge one entry into the JSON and rewrite the page."""
    data = load_results(args.results)
    if args.invocation not in data["invocations"]:
        data["invocations"].append(args.invocation)
    data["results"] = [old for old in data["results"] if any(old[name] != entry[name] for name in KEY)] + [entry]
    harness.write_page(args.results, data, render_markdown(data), show=False)


def fmt_bytes(value):
    return "n/a" if value is None else f"{value / 1e9:.2f} GB"


def fmt_seconds(value):
    return "n/a" if value is None else f"{value:.1f} s" if value < 10 else f"{value:,.0f} s"


def memory_notes(entry):
    notes = [] if entry["status"] == "ok" else [entry["status"]]
    if len(entry["training_processes"]) != entry["processes"]:
        notes.append(f"{len(entry['training_processes'])} training processes seen")
    if entry["child_processes"]:
        notes.append(f"child processes: {len(entry['child_processes'])}")
    written = entry["cache_files_after"] - entry["cache_files_before"]
    if entry["cache"] == "cached" and not entry["cache_files_before"]:
        notes.append("no cache files found")
    if written > 0:
        notes.append(f"wrote {written} cache files")
    return notes


def memory_cells(entry):
    rows = "default corpus, " * (entry["corpus"] == "default") + f"{entry['rows']:,}"
    peaks = [entry[f"peak_{name}"] for name in ("rss_anon_per_process", "rss_per_process", "rss_anon_all")]
    rate = "n/a" if entry["tokens_per_sec"] is None else f"{entry['tokens_per_sec']:,.0f}"
    seconds, notes = fmt_seconds(entry["seconds_to_first_record"]), "; ".join(memory_notes(entry))
    return [rows, str(entry["processes"]), entry["cache"], *map(fmt_bytes, peaks), seconds, rate, notes]


def render_markdown(data):
    results = data["results"]
    memory = sorted(
        (entry for entry in results if entry["mode"] == "memory"),
        key=lambda entry: (entry["rows"], entry["processes"], entry["cache"] == "cached"),
    )
    dates = sorted(entry["date"][:10] for entry in results)
    setups = sorted(
        {harness.describe({"machine": entry["machine"], "versions": entry["versions"]}) for entry in results}
    )
    memory_header = ["train pairs", "processes", "tokenized cache", "peak RssAnon / process", "peak RSS / process"]
    memory_header += ["peak RssAnon, all", "to first step", "tokens/s", "notes"]
    lines = [
        "# Training data path at scale",
        "",
        f"Written {datetime.date.today()} by `benchmarks/data_scale.py` (docs/benchmarks/README.md says how each "
        "figure is measured)" + (f"; measured from {dates[0]} to {dates[-1]}." if dates else "."),
        "",
        "Machines and versions:",
        *(f"- {setup}" for setup in setups),
        "",
        f"## Memory and start-up: {LAUNCH['preset']} preset, {LAUNCH['vocab']}-token vocabulary, --batch_tokens 2000, "
        f"--logging_steps 1 --max_steps {LAUNCH['max_steps']}",
        "",
        "Per process: the highest of the training processes' peaks (the launcher and its children are not training "
        "processes). RssAnon: anonymous memory, without the memory-mapped Arrow files; RSS: VmHWM. All: the summed "
        "RssAnon of the training processes and their children at the worst sample. Time: from the launch to the log "
        f"record of step 1. Tokens/s: median of the per-step rates of steps {LAUNCH['steady_after'] + 1} to "
        f"{LAUNCH['max_steps']} (source + target tokens, all processes). GB = 10^9 bytes.",
        "",
        harness.table(memory_header, [memory_cells(entry) for entry in memory]),
        "",
        *pipeline_sections([entry for entry in results if entry["mode"] == "pipeline"]),
        "## Commands",
        "",
        "The benchmark:",
        "",
        "```",
        *data["invocations"],
        "```",
        "",
        "One train.py launch of each kind (only --dataset_dir, --output_dir and the port differ between rows):",
        "",
        "```",
        *example_commands(results),
        "```",
        "",
    ]
    return "\n".join(lines)


def pipeline_sections(pipeline):
    """Per corpus: each step of a user's path with its time, memory and bytes, and the first tokenization's rate."""
    lines = []
    for size in sorted({int(entry["corpus"].split("_")[1]) for entry in pipeline}):
        steps = {entry["cache"]: entry for entry in pipeline if entry["corpus"] == f"corpus_{size}"}
        lines += [
            f"## A user's path at {size:,} pairs: the Hub's layout to the first training step, 2 processes",
            "",
            f"corpus_{size} written as the Hub serves a translation dataset (Parquet shards, configuration "
            f"{PIPELINE_CONFIG}), then: prepare_data.py (its --num_proc default), train_tokenizer.py on a sample of "
            f"{PIPELINE_SAMPLE:,} pairs ({LAUNCH['vocab']} tokens), and vaswani-train ({LAUNCH['preset']} preset, 2 "
            "processes) started on the prepared corpus twice: the first start tokenizes it, the second maps the "
            "cache. Time: wall seconds (training: to the record of step 1). Memory: peaks of RssAnon, per process "
            "(training processes) and summed over every process of the step. On disk: what the step wrote (the "
            "training rows: the tokenized cache).",
            "",
        ]
        rows = []
        for name in [name for name in ("prepare_data", "train_tokenizer", "first run", "cached") if name in steps]:
            entry = steps[name]
            if name in ("first run", "cached"):
                cells = [f"vaswani-train, {name}", fmt_seconds(entry["seconds_to_first_record"])]
                cells += [fmt_bytes(entry["peak_rss_anon_per_process"]), fmt_bytes(entry["peak_rss_anon_all"])]
                cells += [fmt_bytes(entry["bytes"]), "; ".join(memory_notes(entry))]
            else:
                cells = [f"{name}.py", fmt_seconds(entry["wall_seconds"]), "—", fmt_bytes(entry["peak_anon"])]
                cells += [fmt_bytes(entry["bytes"]), f"CPU {fmt_seconds(entry['cpu_seconds'])}"]
            rows.append(cells)
        header = ["step", "time", "peak RssAnon / process", "peak RssAnon, all", "on disk", "notes"]
        lines += [harness.table(header, rows), ""]
        first, cached = steps.get("first run"), steps.get("cached")
        if first and cached and first["status"] == cached["status"] == "ok":
            seconds = first["seconds_to_first_record"] - cached["seconds_to_first_record"]
            lines += [
                f"The first tokenization: {seconds:,.0f} s for {first['rows']:,} pairs (the first start less the "
                f"cached one), with 2 tokenizing processes: {first['rows'] / seconds / 2:,.0f} pairs per second per "
                "core.",
                "",
            ]
    return lines


def example_commands(results):
    examples = {}
    for entry in sorted(results, key=lambda entry: entry["date"]):
        step = entry["cache"] if entry["mode"] == "pipeline" else ""
        examples[entry["mode"], entry["processes"], step] = f"(cd {entry['cwd']} && {entry['command']})"
    return [examples[key] for key in sorted(examples)]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["memory", "pipeline", "report"])
    parser.add_argument("--dataset_dir", type=Path, help="BIBLE, the default corpus: a DatasetDict of prepare_data.py")
    parser.add_argument("--workdir", type=Path, help="where the corpora, tokenizers, run folders and logs go (WORK)")
    sizes = "corpus sizes in train pairs, comma-separated; 'default' is --dataset_dir itself (%(default)s)"
    parser.add_argument("--sizes", type=comma_list(parse_pairs), default="default,100k,1M,4.5M", help=sizes)
    parser.add_argument("--processes", type=comma_list(int), help="memory's training processes (default: 1,2)")
    parser.add_argument("--timeout", type=float, default=1200, help="a launch's time limit in seconds (1200)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="RESULTS.json and .md (the docs' page)")
    args = parser.parse_args(argv)
    if args.processes and args.command != "memory":
        parser.error(f"--processes is memory's alone, not {args.command}'s (pipeline always starts 2)")
    args.processes = args.processes or [1, 2]
    if args.command != "report":
        if args.dataset_dir is None or args.workdir is None:
            parser.error(f"{args.command} needs --dataset_dir and --workdir")
        args.dataset_dir, args.workdir = args.dataset_dir.resolve(), args.workdir.resolve()  # train.py runs elsewhere
        if not (args.dataset_dir / "dataset_dict.json").is_file():
            parser.error(f"--dataset_dir {args.dataset_dir} is not a DatasetDict saved with save_to_disk")
    args.invocation = shlex.join(["python3", "-m", "benchmarks.data_scale", *(sys.argv[1:] if argv is None else argv)])
    return args


def main(argv=None):
    args = parse_args(argv)
    plans = {"memory": run_memory, "pipeline": run_pipeline}
    if args.command in plans:
        plans[args.command](args)
    data = load_results(args.results)
    harness.write_page(args.results, data, render_markdown(data))


if __name__ == "__main__":
    main()
