"""Table 3 in miniature: every row of the paper's Table 3, scaled down, trained alike, scored as the paper scores it.

    python -m benchmarks.table3 [--width_divisor 4] [--layer_divisor 2] [--max_steps 1200] [--seeds 1 2]
                                [--rows base "(A) h=1" ...] [--quick] [--report_only]

Runs resume as learning_curves' do; OUTPUT_DIR/table3.{md,json,png} are rewritten as each ends: each row's dev
perplexity and dev BLEU beside the paper's, and the paper's findings. --quick rehearses it (widths / 16, 4 steps,
4 BLEU pairs). The rows and the recipe: docs/benchmarks/README.md.
"""

import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import mean

import torch

from benchmarks import harness
from benchmarks.learning_curves import RecipeArguments, bleu_of, run_study, train_curve
from vaswani import VaswaniForConditionalGeneration
from vaswani.checks import UsageError, tokenizer_ids
from vaswani.cli import command, parse_arguments
from vaswani.configuration.table3 import TABLE3
from vaswani.inspection.figures import pyplot
from vaswani.training.schedule import paper_peak_lr


ROWS = {row.name: row for row in TABLE3}


@dataclass
class Table3Arguments(RecipeArguments):
    output_dir: str = "docs/benchmarks/table3"
    rows: list[str] = field(default_factory=lambda: list(ROWS), metadata={"help": "the rows to train (all)"})
    seeds: list[int] = field(default_factory=lambda: [1])
    width_divisor: int = 4
    layer_divisor: int = 2
    max_steps: int = 1200
    bleu_samples: int = field(default=300, metadata={"help": "validation pairs scored with BLEU (0: none)"})
    quick: bool = field(default=False, metadata={"help": "a rehearsal: widths / 16, 4 steps, 4 BLEU pairs"})

    def __post_init__(self):
        unknown = [name for name in self.rows if name not in ROWS]
        if unknown:
            raise UsageError(f"unknown rows {unknown}: Table 3's are {list(ROWS)}")
        if self.quick:
            self.width_divisor, self.max_steps, self.eval_steps, self.warmup_steps, self.bleu_samples = 16, 4, 2, 2, 4


# The paper's findings from Table 3 (sections 5.4 and 6.2), each a comparison of two rows: (what it says, the row that
# should be worse, the row that should be better, by dev perplexity or by dev BLEU). Row (E) is "nearly identical" to
# the base model: a tie, checked apart.
FINDINGS = [
    ("single-head attention is worse than 8 heads", "(A) h=1", "base", "perplexity"),
    ("reducing the attention key size d_k hurts", "(B) d_k=16", "base", "perplexity"),
    ("reducing the attention key size d_k hurts", "(B) d_k=32", "base", "perplexity"),
    ("bigger models are better: fewer layers", "(C) N=2", "base", "perplexity"),
    ("bigger models are better: more layers", "base", "(C) N=8", "perplexity"),
    ("bigger models are better: narrower", "(C) d_model=256", "base", "perplexity"),
    ("bigger models are better: wider", "base", "(C) d_model=1024", "perplexity"),
    ("bigger models are better: wider feed-forward", "(C) d_ff=1024", "(C) d_ff=4096", "perplexity"),
    ("bigger models are better: the big model", "base", "big", "perplexity"),
    ("dropout is very helpful in avoiding over-fitting", "(D) P_drop=0.0", "base", "perplexity"),
    ("label smoothing hurts perplexity", "base", "(D) eps_ls=0.0", "perplexity"),
    ("label smoothing improves BLEU", "(D) eps_ls=0.0", "base", "BLEU"),
]
# "Nearly identical": learned positions within this fraction of the sinusoids' dev perplexity (the paper's: 0%).
ON_PAR = 0.02


def row_peak_lr(config, args: Table3Arguments) -> float:
    """The row's peak learning rate: --peak_lr for the base row's d_model, and for a row of another width what
    equation 3 gives it, d_model^-0.5 (section 5.3: the paper's rows of other widths trained at their own rates)."""
    base = ROWS["base"].config(args.width_divisor, args.layer_divisor)
    ratio = paper_peak_lr(config.d_model, args.warmup_steps) / paper_peak_lr(base.d_model, args.warmup_steps)
    return args.peak_lr * ratio


def train_row(row, seed: int, args: Table3Arguments, data, run_path: Path) -> dict:
    """One row from one seed: its result, with dev perplexity, dev BLEU of the paper's decoding, and parameters."""
    config = row.config(args.width_divisor, args.layer_divisor, **tokenizer_ids(data.tokenizer))
    recipe = replace(args, peak_lr=row_peak_lr(config, args))
    torch.manual_seed(seed)
    model = VaswaniForConditionalGeneration(config)
    model, curve = train_curve(model, seed, recipe, data, run_path.with_suffix(".pt"), row.label_smoothing)
    result = {"row": row.name, "seed": seed, "settings": asdict(args), "config": config.to_diff_dict()}
    result |= {"peak_lr": recipe.peak_lr, "label_smoothing": row.label_smoothing, "parameters": model.num_parameters()}
    result |= {"curve": curve, "dev_perplexity": math.exp(curve[-1]["val_nll"])}
    result |= harness.environment("torch", "transformers")
    if args.bleu_samples:
        result.update(bleu_of(model, data, paper_decoding=True))
    return result


def findings(runs_by_row: dict) -> list[dict]:
    """Each of the paper's findings as the miniature's runs answer it: for the seeds both rows have, how many agree."""
    checks = []
    for claim, worse, better, measure in FINDINGS:
        if worse in runs_by_row and better in runs_by_row:
            seeds = sorted(set(runs_by_row[worse]) & set(runs_by_row[better]))
            pairs = [(runs_by_row[worse][seed], runs_by_row[better][seed]) for seed in seeds]
            if measure == "perplexity":
                agree, rows = sum(w["dev_perplexity"] > b["dev_perplexity"] for w, b in pairs), f"{worse} > {better}"
            else:
                agree, rows = sum(w["bleu"] < b["bleu"] for w, b in pairs), f"BLEU: {worse} < {better}"
            checks.append({"claim": claim, "rows": rows, "agree": agree, "seeds": len(pairs)})
    if "(E) positional embedding" in runs_by_row and "base" in runs_by_row:
        learned, sinusoids = runs_by_row["(E) positional embedding"], runs_by_row["base"]
        seeds = sorted(set(learned) & set(sinusoids))
        agree = sum(abs(learned[s]["dev_perplexity"] / sinusoids[s]["dev_perplexity"] - 1) <= ON_PAR for s in seeds)
        claim = f"learned positions are on par with the sinusoids (within {ON_PAR:.0%})"
        checks.append({"claim": claim, "rows": "(E) ~ base", "agree": agree, "seeds": len(seeds)})
    return checks


def separate(labels: list, figure) -> None:
    """Move each label that would cover one placed before it down beside its point until it covers none (rows of
    nearly the same coordinates, such as (E) and (C) d_ff=1024, would otherwise print over each other)."""
    renderer = figure.canvas.get_renderer()
    placed = []
    for label in sorted(labels, key=lambda label: -label.xy[1]):
        for _ in range(20):
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            label.xyann = (label.xyann[0], label.xyann[1] - 8)
        placed.append(label.get_window_extent(renderer))


def write_report(args: Table3Arguments, output_dir: Path) -> str:
    """table3.md (each row beside the paper's, then the findings), table3.json and table3.png from finished runs."""
    runs = [json.loads(path.read_text()) for path in sorted((output_dir / "runs").glob("*.json"))]
    if not runs:
        return "no finished runs yet"
    runs_by_row = {}
    for run in runs:
        runs_by_row.setdefault(run["row"], {})[run["seed"]] = run
    rows, cells = [], []
    for name, row in ROWS.items():
        if name not in runs_by_row:
            continue
        seeds = runs_by_row[name]
        perplexities = [run["dev_perplexity"] for run in seeds.values()]
        bleus = [run["bleu"] for run in seeds.values() if "bleu" in run]
        params = next(iter(seeds.values()))["parameters"] / 1e6
        rows.append(
            {"row": name, "parameters_millions": params, "dev_perplexity": perplexities, "dev_bleu": bleus}
            | {"paper": {"params": row.params or 65, "dev_perplexity": row.perplexity, "dev_bleu": row.bleu}}
        )
        spread = f" ({', '.join(f'{p:.2f}' for p in perplexities)})" if len(perplexities) > 1 else ""
        bleu = f"{mean(bleus):.2f}" if bleus else "n/a"
        paper = [row.params or 65, f"{row.perplexity:.2f}", f"{row.bleu:.1f}"]
        cells.append([name, f"{params:.2f}", f"{mean(perplexities):.2f}{spread}", bleu, *paper])
    checks = findings(runs_by_row)
    header = ["row", "params (M)", "dev PPL", "dev BLEU", "paper: params (M)", "paper: dev PPL", "paper: dev BLEU"]
    agreement = [[c["claim"], c["rows"], f"{c['agree']} of {c['seeds']}"] for c in checks]
    finding_header = ["the paper's finding", "rows (dev PPL unless marked)", "seeds that agree"]
    table = harness.table(header, cells) + "\n\n" + harness.table(finding_header, agreement)

    # Each row's change of dev perplexity against the base row, the paper's beside the miniature's (each seed against
    # the base row of its own seed): a point in the shaded quadrants moves the way the paper's row moved.
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8, 6.5))
    base, labels = runs_by_row.get("base", {}), []
    for index, entry in enumerate(rows):
        name = entry["row"]
        seeds = [seed for seed in runs_by_row[name] if seed in base]
        changes = [100 * (runs_by_row[name][s]["dev_perplexity"] / base[s]["dev_perplexity"] - 1) for s in seeds]
        if name == "base" or not changes:
            continue
        x = 100 * (entry["paper"]["dev_perplexity"] / ROWS["base"].perplexity - 1)
        axis.scatter([x] * len(changes), changes, color=f"C{index % 10}", s=12, alpha=0.5)
        axis.scatter(x, mean(changes), color=f"C{index % 10}")
        labels.append(axis.annotate(name, (x, mean(changes)), fontsize=7, xytext=(3, 3), textcoords="offset points"))
    xlim, ylim = axis.get_xlim(), axis.get_ylim()  # the points' extent, before the quadrants' wide fills
    axis.fill_between([0, 1e3], 0, 1e3, color="green", alpha=0.06)
    axis.fill_between([-1e3, 0], -1e3, 0, color="green", alpha=0.06)
    axis.axhline(0, color="grey", lw=0.8)
    axis.axvline(0, color="grey", lw=0.8)
    axis.set(xlim=(min(xlim[0], -1), max(xlim[1], 1)), ylim=(min(ylim[0], -1), max(ylim[1], 1)))
    axis.set(xlabel="the paper: dev perplexity against its base row (%)",
             ylabel="in miniature: dev perplexity against the base row (%)")  # fmt: skip
    axis.set_title(f"Table 3 in miniature: widths / {args.width_divisor}, layers / {args.layer_divisor}, "
                   f"{args.max_steps} steps (large dots: mean over seeds)")  # fmt: skip
    axis.grid(alpha=0.3)
    figure.tight_layout()
    separate(labels, figure)
    figure.savefig(output_dir / "table3.png", dpi=120)
    plt.close(figure)
    harness.write_page(output_dir / "table3", {"rows": rows, "findings": checks}, table + "\n", show=False)
    return table


@command
def main(argv=None):
    (args,) = parse_arguments([Table3Arguments], argv, description=__doc__.split("\n\n")[0])
    runs = {re.sub(r"[^A-Za-z0-9=._]+", "_", name).strip("_"): ROWS[name] for name in args.rows}  # by file name
    run_study(args, "validation", runs, train_row, write_report)


if __name__ == "__main__":
    main()
