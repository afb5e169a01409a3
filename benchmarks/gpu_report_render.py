"""The GPU report's page, gpu.md and its PNGs, from the sections' JSON.

    python -m benchmarks.gpu_report_render --report_dir DIR [--output_dir docs/benchmarks]

Runs anywhere; `benchmarks.gpu_report_measure` also renders the page after every measurement. A section without
JSON is listed as not measured. The page opens with the targets beside published anchors.
"""

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import fmt_rate, table
from vaswani.checks import UsageError
from vaswani.cli import command, parse_arguments
from vaswani.inspection.figures import pyplot


ANCHORS = (
    "NVIDIA DeepLearningExamples (fairseq), big, 1 A100: ~82,000 tokens/s (~1/3 of peak); MLPerf Transformer: "
    "~100,000 tokens/s per A100"
)


@dataclass
class RenderArguments:
    report_dir: str = field(default="gpu_report", metadata={"help": "the sections' JSON files"})
    output_dir: str = field(default="docs/benchmarks", metadata={"help": "where gpu.md and its PNGs go"})


@command
def main(argv) -> dict:
    (args,) = parse_arguments([RenderArguments], argv, description=__doc__.split("\n\n")[0])
    result = render(Path(args.report_dir), Path(args.output_dir))
    print(f"written {Path(args.output_dir) / 'gpu.md'} and {len(result['pictures'])} PNGs")
    return result


def render(report_dir: Path, output_dir: Path) -> dict:
    """gpu.md and its PNGs in `output_dir`, from the sections' JSON in `report_dir`."""
    plt = pyplot()
    paths = {name: report_dir / f"{name}.json" for name in RENDERERS}
    sections = {name: json.loads(path.read_text()) for name, path in paths.items() if path.exists()}
    if not sections:
        raise UsageError(f"{report_dir} holds no section's JSON: run `python -m benchmarks.gpu_report_measure` first")
    output_dir.mkdir(parents=True, exist_ok=True)
    first = next(iter(sections.values()))
    facts = first["environment"]
    lines = [
        "# GPU report",
        "",
        f"{facts['device']}; driver {facts.get('driver', 'n/a')}, CUDA {facts.get('cuda', 'n/a')}; torch "
        f"{facts['torch']}, transformers {facts['transformers']}, Python {facts['python']}; {facts['date']}."
        + (" **Quick mode: tiny sizes, the figures test the code and mean nothing.**" if first["quick"] else ""),
        "",
        "Written by `benchmarks.gpu_report_render` from the sections' JSON (how each is measured: "
        '`benchmarks/gpu_report_measure.py`; its two commands: `benchmarks/README.md`, "The GPU report").',
        "",
    ]
    targets = []
    for name, renderer in RENDERERS.items():
        if name not in sections:
            lines += [f"## {name}", "", "Not measured: no run wrote this section's JSON into the report's folder.", ""]
            continue
        section = sections[name]
        state = "" if section["complete"] else ", cut off: what follows was measured before the run ended"
        lines += [f"## {name} ({section['minutes']:.1f} min{state})", ""]
        if "not_measured" in section["results"]:
            lines += [f"Not measured, because {section['results']['not_measured']}.", ""]
            continue
        text, section_targets = renderer(section["results"], plt, output_dir)
        lines += [text, ""]
        targets += section_targets
    lines[6:6] = ["## Targets", "", table(["target", "measured", "met"], targets), "", f"Anchors: {ANCHORS}.", ""]
    (output_dir / "gpu.md").write_text("\n".join(lines))
    pictures = sorted(path.name for path in output_dir.glob("gpu_*.png"))
    return {"pictures": pictures, "sections": sorted(sections)}


def ratio(ours: dict, theirs: dict, key: str) -> float | None:
    if key in ours and key in theirs:
        return ours[key]["median"] / theirs[key]["median"]
    return None


def unmeasured(row: dict, cells: int) -> list:
    """A table's `cells` cells for a measurement that has no figures: why, then blanks."""
    return [f"not measured, because {row['not_measured']}", *[""] * (cells - 1)]


def saved(figure, plt, output_dir: Path, name: str, title: str) -> str:
    """Write the figure as output_dir/name; the Markdown that shows it."""
    figure.tight_layout()
    figure.savefig(output_dir / name, dpi=110)
    plt.close(figure)
    return f"![{title}]({name})"


def render_training(results, plt, output_dir, picture_name="gpu_training.png"):
    ceiling = results["matmul_ceiling"]["flops_per_s"] / 1e12
    precision, per_token, sizes = results["precision"], results["flops_per_token"], results["sizes"]
    text = (
        f"Batches of {sizes['batch_tokens']:,} source + as many target tokens, pairs of {sizes['length']} tokens; the "
        f"recipe's training step (`train_step`) in {precision}. tokens/s counts source + target tokens; target "
        "tokens/s counts the target side alone, as fairseq's `wps` does. MFU: model FLOPs (matrix products, forward "
        "and backward: 3 x the forward's 2 x multiply-adds; attention over every key) per second over the "
        f"{'float32' if precision == 'float32' else 'bf16'} matmul peak measured in the same run, {ceiling:.3g} "
        f"TFLOP/s. Per pair of {per_token['length']}-token sentences of the largest preset: "
        f"{per_token['per_source_token'] / 1e6:,.1f} MFLOP per source token, "
        f"{per_token['per_target_token'] / 1e6:,.1f} MFLOP per target token (output projection included)."
    )
    targets, cells = [], []
    by_key = {(r["preset"], r["implementation"], r["compiled"]): r for r in results["rows"]}
    for row in results["rows"]:
        key = [row["preset"], row["implementation"], "yes" if row["compiled"] else "no"]
        if "not_measured" in row:
            cells.append([*key, *unmeasured(row, 6)])
            continue
        speedup = ratio(row, by_key.get((row["preset"], "marian", row["compiled"]), {}), "tokens_per_s")
        versus = f"{speedup:.2f}x" if speedup else "n/a"
        rates = [fmt_rate(row["tokens_per_s"]), fmt_rate(row["target_tokens_per_s"]), versus]
        cells.append(
            [*key, *rates, f"{row['peak_memory_mib']:,.0f}", f"{row['tflops_per_s']:.3g}", f"{row['mfu']:.1%}"]
        )
        if row["implementation"] == "vaswani":
            mode = "compiled" if row["compiled"] else "eager"
            met = speedup is not None and speedup >= 1.2
            targets.append([f"{row['preset']} training, {mode}: >= 1.2x Marian", versus, "yes" if met else "no"])
            if row["preset"] == "big":
                mfu = f"{row['mfu']:.1%} ({fmt_rate(row['tokens_per_s'])} tokens/s)"
                targets.append([f"big, {mode}: >= 50% MFU", mfu, "yes" if row["mfu"] >= 0.5 else "no"])
    shown = [r for r in results["rows"] if "tokens_per_s" in r]
    figure, axis = plt.subplots(figsize=(8, 4))
    axis.bar(
        [f"{r['preset']}\n{r['implementation']}\n{'compiled' if r['compiled'] else 'eager'}" for r in shown],
        [r["tokens_per_s"]["median"] for r in shown],
        color=["C0" if r["implementation"] == "vaswani" else "C1" for r in shown],
    )
    axis.set(ylabel="training tokens/s (source + target)", title=f"Training speed, {precision}")
    header = ["preset", "implementation", "torch.compile", "tokens/s", "target tokens/s", "vs Marian"]
    header += ["peak memory MiB", "TFLOP/s", "MFU"]
    picture = saved(figure, plt, output_dir, picture_name, "training speed")
    return f"{text}\n\n{table(header, cells)}\n\n{picture}", targets


SEARCHES = {"beam1": "greedy", "beam4": "beam 4", "paper_beam4": "the paper's beam 4"}


def render_generation(results, plt, output_dir):
    text = (
        f"The {results['preset']} preset ({results['dtype']} for eager and compiled), random weights (the same for "
        f"every engine), {results['length']}-token sources, exactly {results['length']} generated tokens a sentence; "
        "tokens/s counts the generated (target) tokens. Beam 4 is transformers' beam search for both models; the "
        "paper's beam 4 is vaswani's default decoding. x eager: against the same model's eager row at that batch "
        "(CTranslate2: against vaswani's); x Marian: vaswani against MarianMTModel with the same engine and batch."
    )
    targets, cells = [], []
    measured_rows = [row for row in results["rows"] if "not_measured" not in row]
    eager = {(row["model"], row["batch"]): row for row in measured_rows if row["engine"] == "eager"}
    peers = {(row["engine"], row["batch"]): row for row in measured_rows if row["model"] == "marian"}
    for row in results["rows"]:
        label = [row["batch"], row["model"], row["engine"]]
        if "not_measured" in row:
            cells.append([*label, *unmeasured(row, 3 * len(SEARCHES) + 1)])
            continue
        base = eager.get(("vaswani" if row["engine"].startswith("CTranslate2") else row["model"], row["batch"]), {})
        speedups = {search: ratio(row, base, f"{search}_sentences_per_s") for search in SEARCHES}
        rates = []
        for search, speedup in speedups.items():
            if f"{search}_sentences_per_s" not in row:
                rates += ["", "", ""]
                continue
            rates += [fmt_rate(row[f"{search}_sentences_per_s"]), fmt_rate(row[f"{search}_tokens_per_s"])]
            rates.append(f"{speedup:.2f}x" if speedup else "")
        peer = peers.get((row["engine"], row["batch"])) if row["model"] == "vaswani" else None
        against = [ratio(row, peer or {}, f"beam{beams}_sentences_per_s") for beams in (1, 4)]
        cells.append([*label, *rates, ", ".join(f"{value:.2f}x" for value in against if value) if peer else ""])
        paper, greedy = speedups["paper_beam4"], speedups["beam1"]
        if row["model"] == "vaswani" and row["engine"] == "static cache + compile":
            goal = f"the paper's beam search, static cache + compile >= 1.5x eager, batch {row['batch']}"
            figures = f"{paper:.2f}x (greedy {greedy:.2f}x)" if paper and greedy else "n/a"
            targets.append([goal, figures, "yes" if paper and greedy and paper >= 1.5 else "no"])
        if row["engine"].startswith("CTranslate2"):
            figures = f"greedy {greedy or 0:.2f}x, beam 4 {speedups['beam4'] or 0:.2f}x"
            targets.append([f"{row['engine']} over vaswani eager, batch {row['batch']} (reported)", figures, "-"])
    figure, axes = plt.subplots(1, len(SEARCHES), figsize=(14, 4))
    for axis, (search, name) in zip(axes, SEARCHES.items()):
        shown = [row for row in measured_rows if f"{search}_sentences_per_s" in row]
        axis.bar(
            [f"{r['model']} {r['engine']}\nbatch {r['batch']}" for r in shown],
            [r[f"{search}_sentences_per_s"]["median"] for r in shown],
            color=["C0" if r["model"] == "vaswani" else "C1" for r in shown],
        )
        axis.set(title=name, ylabel="sentences/s", yscale="log")
        axis.tick_params(axis="x", labelsize=6, rotation=60)
    header = ["batch", "model", "engine"]
    header += [f"{name} {column}" for name in SEARCHES.values() for column in ("sentences/s", "tokens/s", "x eager")]
    picture = saved(figure, plt, output_dir, "gpu_generation.png", "generation speed")
    return f"{text}\n\n{table([*header, 'x Marian (greedy, beam 4)'], cells)}\n\n{picture}", targets


def render_time_to_bleu(results, plt, output_dir):
    points, calibration = results["points"], results["calibration"]
    evaluations = [point["evaluation_seconds"] for point in points]
    text = (
        f"The {results['preset']} preset, eager, batches of about {results['batch_tokens']:,} padded tokens, the "
        f"paper's schedule planned for {results['planned_minutes']:.1f} minutes of training: "
        f"{results['planned_steps']:,} steps at the {calibration['seconds_per_step'] * 1000:.0f} ms a step measured "
        f"first ({calibration['steps']} steps of a calibration run), warmup {results['warmup_steps']}, peak learning "
        f"rate {results['peak_lr']:.2e}. It took {results.get('taken_steps', 0):,} steps in "
        f"{results.get('trained_minutes', 0):.1f} minutes"
        + (", stopped early by the run's deadline" if results["stopped_by_deadline"] else "")
        + f". BLEU of beam 4 on {results['test_pairs']} test pairs, `{results['signature']}`"
        + (f"; each evaluation took {min(evaluations):.0f}-{max(evaluations):.0f} s, not counted." if points else ".")
    )
    cells = [[f"{p['minutes']:.1f}", f"{p['steps']:,}", f"{p['train_loss']:.3f}", f"{p['bleu']:.2f}"] for p in points]
    reached = f"{points[-1]['bleu']:.2f} after {points[-1]['minutes']:.1f} min" if points else "n/a"
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot([p["minutes"] for p in points], [p["bleu"] for p in points], marker="o")
    axis.set(xlabel="training minutes", ylabel="test BLEU", title=f"{results['preset']} preset, default corpus")
    axis.grid(alpha=0.3)
    picture = saved(figure, plt, output_dir, "gpu_time_to_bleu.png", "BLEU against minutes")
    page = f"{text}\n\n{table(['training minutes', 'steps', 'training loss', 'test BLEU'], cells)}\n\n{picture}"
    return page, [["time to BLEU (recorded)", reached, "-"]]


def render_correctness(results, plt, output_dir):
    rows, details = [], []
    for name, run in results.items():
        if "not_measured" in run:
            rows.append([name, *unmeasured(run, 4)])
            continue
        failed = [f"{failure['test']}: {failure['message'].splitlines()[0] if failure['message'] else ''}"[:300]
                  for failure in run["failures"]]  # fmt: skip
        notes = "; ".join(failed + [f"skipped: {reason}" for reason in run["skip_reasons"]])
        rows.append([name, run["passed"], run["failed"], run["skipped"], notes.replace("|", "\\|")])
        for failure in run["failures"]:
            details += [f"### {failure['test']}", "", "```", failure["message"], "```", "", "Its output's last lines:"]
            details += ["", "```", *failure["output_tail"], "```", ""]
    text = table(["run", "passed", "failed", "skipped", "failures, skip reasons"], rows)
    return "\n".join([text, "", *details]).rstrip(), []


def render_profile(results, plt, output_dir):
    lines = []
    for run in results["runs"]:
        title = f"{run['preset']}, {'compiled' if run['compiled'] else 'eager'}, {run['batch_tokens']:,} source tokens"
        if "not_measured" in run:
            lines += [f"{title}: not measured, because {run['not_measured']}.", ""]
            continue
        shares = ", ".join(f"{kind} {share:.1%}" for kind, share in run["shares"].items())
        kernels = [
            [f"`{t['kernel']}`", t["kind"], t["calls"], f"{t['ms']:.2f}", f"{t['share']:.1%}"] for t in run["top"]
        ]
        lines += [f"{title}: {run['total_ms']:.1f} ms of {run['timed']}; {shares}.", ""]
        lines += [table(["kernel", "kind", "calls", "ms", "share"], kernels), ""]
    return "\n".join(lines), []


POINT_COLUMNS = {
    "tokens/s": lambda point: fmt_rate(point["tokens_per_s"]),
    "peak memory MiB": lambda point: f"{point['peak_memory_mib']:,.0f}",
}


def point_cells(point: dict, columns) -> list:
    """A training point's cells under `columns` (of POINT_COLUMNS), or why it was not measured."""
    if "not_measured" in point:
        return unmeasured(point, len(columns))
    return [POINT_COLUMNS[column](point) for column in columns]


def render_chunk_sweep(results, plt, output_dir):
    text = (
        f"The loss's values per chunk on the device (the default is 2^26), the {results['preset']} preset eager, "
        f"{results['batch_tokens']:,} source tokens a batch:"
    )
    columns = ("tokens/s", "peak memory MiB")
    cells = [[f"2^{int(math.log2(p['chunk_elements']))}", *point_cells(p, columns)] for p in results["points"]]
    return f"{text}\n\n{table(['values per chunk', *columns], cells)}", []


# The sections in the page's order: the first command's, then the second's (benchmarks.gpu_report_measure.PARTS).
RENDERERS = {
    "correctness": render_correctness,
    "generation": render_generation,
    "training": render_training,
    "time_to_bleu": render_time_to_bleu,
    "compiled_training": functools.partial(render_training, picture_name="gpu_compiled_training.png"),
    "profile": render_profile,
    "chunk_sweep": render_chunk_sweep,
}


if __name__ == "__main__":
    main()
