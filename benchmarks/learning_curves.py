"""Learning curves: vaswani (with each weight initialisation) and MarianMTModel trained side by side, step for step.

    python -m benchmarks.learning_curves [--variants vaswani:tensor2tensor vaswani:fairseq vaswani:fairseq+bias marian]
                                         [--seeds 1 2] [--max_steps 1500] [--report_only]

Each run (one variant from one seed) resumes where it stopped and is skipped once finished:
OUTPUT_DIR/runs/VARIANT-seedN.json, and OUTPUT_DIR/learning_curves.{md,png} rewritten as each ends. The variants, the
recipe and what is measured: docs/benchmarks/README.md.
"""

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import MarianMTModel

from benchmarks import harness
from benchmarks.benchmark import marian_config
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.checks import UsageError, tokenizer_ids
from vaswani.cli import command, parse_arguments
from vaswani.configuration.configuration_vaswani import INIT_SCHEMES
from vaswani.corpora.tokenizer import load_tokenizer
from vaswani.evaluation.bleu import corpus_bleu, load_pairs, translate
from vaswani.inspection.figures import pyplot
from vaswani.progress import progress_bar
from vaswani.training import validate
from vaswani.training.batching import StepBatches, TokenBucketSampler
from vaswani.training.checkpoints import TrainState
from vaswani.training.data import PairCollator, load_translation_dataset, pair_loader, tokenize_split
from vaswani.training.schedule import inverse_sqrt_schedule
from vaswani.training.step import recipe_adam, train_step


@dataclass
class RecipeArguments:
    """The corpus and the recipe every run of a study shares (also benchmarks/table3.py's)."""

    dataset_dir: str = "outputs/main_job/data"
    tokenizer: str = "outputs/main_job/tokenizer"
    source_lang: str = "en"
    target_lang: str = "es"
    max_steps: int = 1500
    batch_tokens: int = 4000
    warmup_steps: int = 150
    peak_lr: float = 1.3e-3
    eval_steps: int = 50
    bleu_samples: int = field(default=500, metadata={"help": "pairs scored at the end (0: no BLEU)"})
    report_only: bool = field(default=False, metadata={"help": "only rewrite the table and plot"})


BIASES = ("", "+bias", "+bias-paired")  # none, attention biases, attention biases from the run without them
VARIANTS = ["marian", *(f"vaswani:{scheme}{bias}" for scheme in INIT_SCHEMES for bias in BIASES)]


@dataclass
class CurveArguments(RecipeArguments):
    output_dir: str = "docs/benchmarks/learning_curves"
    variants: list[str] = field(
        default_factory=lambda: ["vaswani:tensor2tensor", "vaswani:fairseq", "vaswani:bart", "marian"],
        metadata={"help": "marian, vaswani:INIT_SCHEME, vaswani:INIT_SCHEME+bias or vaswani:INIT_SCHEME+bias-paired"},
    )
    seeds: list[int] = field(default_factory=lambda: [1])
    preset: str = "small"
    label_smoothing_factor: float = 0.1
    report_steps: list[int] = field(default_factory=lambda: [400, 800, 1500])

    def __post_init__(self):
        unknown = [variant for variant in self.variants if variant not in VARIANTS]
        if unknown:
            raise UsageError(f"unknown variants {unknown}: use {', '.join(VARIANTS)}")


def build_model(variant: str, config: VaswaniConfig):
    if variant == "marian":
        return MarianMTModel(marian_config(config))
    scheme, _, bias = variant.partition(":")[2].partition("+")
    config.init_scheme, config.attention_bias = scheme, bias == "bias"
    if bias != "bias-paired":
        return VaswaniForConditionalGeneration(config)
    # The run without biases as the seed draws it, and the random state it leaves for the dropout masks; the biases
    # start at zero in every scheme, so the model computes what the run without them computes until it trains.
    without = VaswaniForConditionalGeneration(config)
    random_state = torch.get_rng_state()
    model = VaswaniForConditionalGeneration(replace(config, attention_bias=True))
    missing, unexpected = model.load_state_dict(without.state_dict(), strict=False)
    assert not unexpected and all(name.endswith("proj.bias") for name in missing), (missing, unexpected)
    torch.set_rng_state(random_state)
    return model


@dataclass
class StudyData:
    """What every run of a study reads: the tokenizer, the tokenized training split, the validation batches, the
    pairs scored at the end (sources, references), and the CPU accelerator."""

    tokenizer: object
    train_split: object
    valid_loader: object
    other_source_batches: list
    bleu_pairs: tuple
    accelerator: Accelerator


def other_sources(batch: dict) -> dict:
    """The batch with each target beside the source of the pair before it (the first beside the last's): what the
    model predicts without its own source."""
    return batch | {name: batch[name].roll(1, dims=0) for name in ("input_ids", "attention_mask")}


def load_study_data(args: RecipeArguments, bleu_split: str) -> StudyData:
    """The corpus of --dataset_dir tokenized with --tokenizer; the first --bleu_samples pairs of `bleu_split`."""
    languages = args.source_lang, args.target_lang
    dataset = load_translation_dataset(args.dataset_dir, *languages)
    tokenizer = load_tokenizer(args.tokenizer)
    train, valid = (tokenize_split(dataset[name], tokenizer, *languages) for name in ("train", "validation"))
    sampler = TokenBucketSampler(
        valid.source_lengths, valid.target_lengths, args.batch_tokens, shuffle=False, drop_remainder=False
    )
    valid_loader = pair_loader(valid, sampler, PairCollator(tokenizer.pad_token_id, tokenizer.bos_token_id))
    sources, references, _, _ = load_pairs(
        args.dataset_dir, bleu_split, *languages, max_samples=args.bleu_samples or 1
    )
    others = [other_sources(batch) for batch in valid_loader]
    return StudyData(tokenizer, train, valid_loader, others, (sources, references), Accelerator(cpu=True))


def train_curve(model, seed: int, args: RecipeArguments, data: StudyData, state_path: Path, label_smoothing: float):
    """Train `model` (built after `torch.manual_seed(seed)`) for --max_steps, the validation NLL every --eval_steps
    steps; resumable from `state_path`, saved at each evaluation. Returns the prepared model and its curve."""
    optimizer = recipe_adam(data.accelerator, model.parameters())
    scheduler = inverse_sqrt_schedule(optimizer, args.warmup_steps, args.peak_lr)
    split = data.train_split
    sampler = TokenBucketSampler(split.source_lengths, split.target_lengths, args.batch_tokens, seed=seed)
    collator = PairCollator(model.config.pad_token_id, model.config.decoder_start_token_id)
    state, curve = TrainState(), []
    if state_path.exists():
        saved = torch.load(state_path, weights_only=False)
        for name, part in [("model", model), ("optimizer", optimizer), ("scheduler", scheduler)]:
            part.load_state_dict(saved[name])
        torch.set_rng_state(saved["rng"])
        state, curve = TrainState(**saved["state"]), saved["curve"]
    accelerator = data.accelerator
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    batches = StepBatches(pair_loader(split, sampler, collator), state, per_step=1)
    model.train()
    progress = progress_bar(total=args.max_steps, initial=state.step, desc=state_path.stem, dynamic_ncols=True)
    while state.step < args.max_steps:
        started = time.perf_counter()
        step = train_step(accelerator, model, optimizer, scheduler, next(batches), label_smoothing)
        state.add_step(step, time.perf_counter() - started)
        progress.update()
        if state.step % args.eval_steps == 0 or state.step == args.max_steps:
            train_loss = state.take_log_record(step.learning_rate)["loss"]
            val_nll = validate(accelerator, model, data.valid_loader)["val_loss"]
            other_source = validate(accelerator, model, data.other_source_batches)["val_loss"]
            point = {"step": state.step, "train_loss": train_loss, "val_nll": val_nll}
            curve.append(point | {"val_nll_other_source": other_source})
            beside = f"({other_source:.3f} beside other sources)"
            progress.write(f"{state_path.stem}: step {state.step}, validation NLL {val_nll:.3f} {beside}")
            saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            saved |= {"scheduler": scheduler.state_dict(), "rng": torch.get_rng_state()}
            saved |= {"state": asdict(state), "curve": curve}
            write_whole(state_path, lambda temporary: torch.save(saved, temporary))
    progress.close()
    return model, curve


def bleu_of(model, data: StudyData, **decoding) -> dict:
    """sacreBLEU of `model`'s beam-4 translations of the BLEU pairs: {"bleu", "bleu_signature", "bleu_pairs"}."""
    sources, references = data.bleu_pairs
    hypotheses = translate(model, data.tokenizer, sources, num_beams=4, **decoding)
    score, signature = corpus_bleu(hypotheses, references.to_pylist())
    return {"bleu": score.score, "bleu_signature": signature, "bleu_pairs": len(sources)}


def write_whole(path: Path, write) -> None:
    """`write(temporary)`, then the temporary renamed to `path`: no process of the study reads a half-written file, and
    a run stopped while it writes keeps what `path` held (a result half written would count as finished)."""
    temporary = path.with_name(path.name + ".tmp")
    write(temporary)
    os.replace(temporary, path)


def finish_run(run_path: Path, result: dict, data: StudyData) -> None:
    """Write a finished run's result, then drop its resume state and free its model and optimizer."""
    write_whole(run_path, lambda temporary: temporary.write_text(json.dumps(result, indent=1)))
    run_path.with_suffix(".pt").unlink()
    data.accelerator.free_memory()


def train_run(variant, seed, args, data: StudyData, run_path: Path) -> dict:
    """One variant from one seed: its result, the curve and test BLEU; resumable from run_path's .pt state."""
    config = VaswaniConfig.from_preset(args.preset, **tokenizer_ids(data.tokenizer))
    torch.manual_seed(seed)
    model = build_model(variant, config)
    model, curve = train_curve(model, seed, args, data, run_path.with_suffix(".pt"), args.label_smoothing_factor)
    result = {"variant": variant, "seed": seed, "settings": asdict(args), "parameters": model.num_parameters()}
    result |= {"curve": curve, **harness.environment("torch", "transformers")}
    if args.bleu_samples:
        longest = max(len(ids) for ids in data.tokenizer(data.bleu_pairs[0].to_pylist())["input_ids"])
        # One output limit for every model (the longest test source + 50), and transformers' beam search for every
        # variant (Marian has no other; the paper's GNMT penalty would favour vaswani's scores alone).
        paper_decoding = False if isinstance(model, VaswaniForConditionalGeneration) else None
        scores = bleu_of(model, data, max_new_tokens=longest + 50, paper_decoding=paper_decoding)
        result |= {"test_bleu": scores.pop("bleu"), **scores}
    return result


# What the source must be worth to a model, in nats per target token, for it to count as reading it: a run on the
# plateau of the target language alone measures 0.00-0.04 here, one that has left it 0.2 and more by the next
# evaluation.
READS_SOURCE_NATS = 0.1


def source_worth(point: dict) -> float:
    """What the source is worth at an evaluation: the NLL beside other sources minus the true NLL (zero for a model
    that ignores it)."""
    return point["val_nll_other_source"] - point["val_nll"]


def reads_source_from(run: dict) -> str:
    """The first evaluated step at which the source is worth READS_SOURCE_NATS to `run`'s model, ">LAST" if it never
    was, "n/a" for runs measured before the other-source NLL was recorded."""
    curve = run["curve"]
    if "val_nll_other_source" not in curve[0]:
        return "n/a"
    for point in curve:
        if source_worth(point) >= READS_SOURCE_NATS:
            return str(point["step"])
    return f">{curve[-1]['step']}"


def mean_and_each(values: list, digits: int) -> str:
    """The mean of the values and, in brackets, each one; n/a for none."""
    each = ", ".join(f"{value:.{digits}f}" for value in values)
    return f"{sum(values) / len(values):.{digits}f} ({each})" if values else "n/a"


def write_report(args, output_dir: Path):
    """The table (validation NLL at --report_steps, test BLEU, the step each run starts to read its source; mean and
    each seed) and the plot, from finished runs."""
    runs = [json.loads(path.read_text()) for path in sorted((output_dir / "runs").glob("*.json"))]
    if not runs:
        return "no finished runs yet"
    variants = sorted({run["variant"] for run in runs}, key=lambda v: (v == "marian", v))
    header = ["variant", "seeds", *(f"val NLL @ {step}" for step in args.report_steps), "test BLEU (beam 4)"]
    rows, plt = [], pyplot()
    figure, (axis, source_axis) = plt.subplots(1, 2, figsize=(13, 6), layout="constrained")
    for color, variant in enumerate(variants):
        mine = [run for run in runs if run["variant"] == variant]
        points = [point for run in mine for point in run["curve"]]
        cells = [mean_and_each([p["val_nll"] for p in points if p["step"] == step], 3) for step in args.report_steps]
        bleu = mean_and_each([run["test_bleu"] for run in mine if "test_bleu" in run], 2)
        seeds = ", ".join(str(run["seed"]) for run in mine)
        reads = ", ".join(reads_source_from(run) for run in mine)
        rows.append([variant, seeds, *cells, bleu, reads])
        for index, run in enumerate(mine):  # one colour per variant, one line style per seed
            steps, nll = zip(*[(point["step"], point["val_nll"]) for point in run["curve"]])
            style = ("-", "--", ":", "-.")[index % 4]
            axis.plot(steps, nll, style, color=f"C{color}", alpha=0.9, label=f"{variant}, seed {run['seed']}")
            read = [(p["step"], source_worth(p)) for p in run["curve"] if "val_nll_other_source" in p]
            if read:  # runs measured before the other-source NLL was recorded have none
                source_axis.plot(*zip(*read), style, color=f"C{color}", alpha=0.9)
    axis.set(xlabel="optimizer step", ylabel="validation NLL per target token")
    # The runs' own recipe, not this command's arguments: --report_only redraws a study run with other flags.
    recipe = runs[0]["settings"]
    axis.set_title(f"{recipe['preset']} preset, {recipe['batch_tokens']} tokens/step, peak lr {recipe['peak_lr']:g}")
    source_axis.set(xlabel="optimizer step", ylabel="nats per target token")
    source_axis.set_title("what the source is worth: NLL beside other sources minus NLL")
    for each in (axis, source_axis):
        each.grid(alpha=0.3)
    # Below both panels: a study of a dozen runs has a legend taller than the curves it would cover.
    figure.legend(loc="outside lower center", ncol=4)
    figure.savefig(output_dir / "learning_curves.png", dpi=120)
    plt.close(figure)
    table = harness.table([*header, "reads its source from step"], rows)
    report = f"{table}\n\n{bias_effects(runs, args.report_steps[-1])}"
    (output_dir / "learning_curves.md").write_text(report + "\n")
    return report


def bias_effects(runs: list, step: int) -> str:
    """Each initialisation's runs with attention biases against its runs without them, seed by seed: the difference
    of their validation NLL at `step`."""

    def nll(variant):
        return {
            run["seed"]: p["val_nll"]
            for run in runs
            if run["variant"] == variant
            for p in run["curve"]
            if p["step"] == step
        }

    rows = []
    for variant in sorted({run["variant"] for run in runs if run["variant"].endswith("+bias")}):
        with_biases, without = nll(variant), nll(variant.removesuffix("+bias"))
        effects = {seed: with_biases[seed] - without[seed] for seed in sorted(with_biases.keys() & without.keys())}
        cells = [f"seed {seed}: {abs(d):.3f} {'behind' if d > 0 else 'ahead'}" for seed, d in effects.items()]
        rows.append([variant.removesuffix("+bias"), "; ".join(cells)])
    return harness.table([f"with attention biases, validation NLL at {step} against without", "each seed"], rows)


def run_study(args, bleu_split: str, runs: dict, train_one, write_report) -> None:
    """Train every run not finished yet, from every seed (`runs`: {file name: what `train_one` trains}), into
    OUTPUT_DIR/runs/NAME-seedN.json, the report rewritten as each ends; then print the report."""
    output_dir = Path(args.output_dir)
    (output_dir / "runs").mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        data = load_study_data(args, bleu_split)
        for seed in args.seeds:
            for name, what in runs.items():
                run_path = output_dir / "runs" / f"{name}-seed{seed}.json"
                if not run_path.exists():
                    finish_run(run_path, train_one(what, seed, args, data, run_path), data)
                    write_report(args, output_dir)
    print(write_report(args, output_dir))


@command
def main(argv=None):
    (args,) = parse_arguments([CurveArguments], argv, description=__doc__.split("\n\n")[0])
    variants = {variant.replace(":", "-"): variant for variant in args.variants}
    run_study(args, "test", variants, train_run, write_report)


if __name__ == "__main__":
    main()
