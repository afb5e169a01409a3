"""The model card of a trained model: `model_card.md`, a Jinja2 template shipped with the package, rendered with
`huggingface_hub.ModelCard` from the model folder's own records (training_summary.json, eval_results.json, config),
with `ModelCardData` metadata and an `EvalResult` per BLEU score. It states only what the records hold: a figure
they lack reads "not measured", and what the card says of the run (languages, data, schedule, decoding) comes from
them.
"""

import importlib.resources
import json
import math
from pathlib import Path

import jinja2
import jinja2.meta
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from safetensors import SafetensorError, safe_open
from transformers import GenerationConfig

from ..checks import UsageError, check_safetensors_weights
from ..training.schedule import peak_lr_of


MODEL_CARD_TEMPLATE = importlib.resources.files("vaswani") / "model_card.md"
NOT_MEASURED = "not measured"


def read_json(path: Path) -> dict | None:
    """A JSON object from a file of the folder, None if the file does not exist."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(record, dict):
        raise UsageError(f"{path} must hold a JSON object.")
    return record


def tensor_shapes(model_dir: Path) -> dict[str, list[int]]:
    """name -> shape of every tensor of the weights (one file, or the shards of its index), without reading them."""
    check_safetensors_weights(model_dir)
    index = read_json(model_dir / "model.safetensors.index.json")
    files = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    missing = [name for name in files if not (model_dir / name).is_file()]
    if missing:
        raise UsageError(
            f"{model_dir} is missing weight shards listed in model.safetensors.index.json: {', '.join(missing)}."
        )
    shapes = {}
    for name in files:
        try:
            with safe_open(model_dir / name, framework="pt") as weights:
                keys = weights.keys()  # a safe_open is not iterable
                shapes.update({key: weights.get_slice(key).get_shape() for key in keys})
        except SafetensorError as error:
            raise UsageError(f"{model_dir / name} is not a safetensors file: {error}") from None
    return shapes


def format_value(value) -> str:
    """A recorded value as the card shows it: numbers as measured (4 significant digits, whole numbers from 1000 on:
    an average of tokens per step is a count), lists joined, a missing value "not measured"."""
    if value is None:
        return NOT_MEASURED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and math.isfinite(value) and abs(value) >= 1000:
        value = round(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(format_value(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


class Record:
    """A record as the template reads it: `{{ training.args.lr }}` follows nested keys, and what the record lacks (the
    file, a key, or a null) prints "not measured"; `{% if training %}` tells whether the value was recorded."""

    def __init__(self, value):
        self._value = value

    def __getattr__(self, key):
        if key.startswith("_"):  # Python's and Jinja's own protocol lookups, never record keys
            raise AttributeError(key)
        return Record(self._value.get(key) if isinstance(self._value, dict) else None)

    def __bool__(self):
        return self._value is not None

    def __str__(self):
        return format_value(self._value)


def flatten(record: dict, prefix: str = "") -> dict:
    """{"bleu": {"test": 27.3}} -> {"bleu.test": 27.3}"""
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def table(header: list[str], rows: list[list]) -> str:
    """A Markdown table of values; a "|" in a value (sacreBLEU signatures have them) is escaped."""
    lines = [header, ["---"] * len(header)]
    lines += [[format_value(value).replace("|", "\\|") for value in row] for row in rows]
    return "".join(f"| {' | '.join(line)} |\n" for line in lines)


def record_table(record: dict | None, file_name: str) -> str:
    if record is None:
        return f"Not measured: the model folder has no {file_name}."
    return table(["", ""], [[key, value] for key, value in flatten(record).items()])


def describe_schedule(args: dict, d_model) -> str:
    """The learning-rate schedule the run used (section 5.3), from its recorded arguments."""
    schedule, warmup = args.get("lr_schedule"), args.get("warmup_steps")
    if schedule == "paper" and None not in (warmup, d_model, args.get("lr_scale")):
        scale = args["lr_scale"]
        peak = peak_lr_of("paper", d_model, warmup, lr_scale=scale)
        scaled = "" if scale == 1 else f", times {format_value(scale)} (`--lr_scale`)"
        return (
            f"the paper's learning rate (equation 3), d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) "
            f"with d_model = {d_model} and warmup_steps = {warmup}{scaled}: a linear rise to {format_value(peak)} "
            f"at step {warmup}, then decay with the inverse square root of the step"
        )
    if schedule == "short" and None not in (warmup, args.get("peak_lr")):
        return (
            f"the shape of the paper's learning rate scaled to peak at {format_value(args['peak_lr'])} "
            f"(`--lr_schedule short`, meant for runs of a few hundred steps): a linear rise over the first "
            f"{warmup} steps, then decay with the inverse square root of the step"
        )
    return f"a learning-rate schedule that was {NOT_MEASURED}"


def measured_bleu(evaluation: dict | None) -> dict[str, dict]:
    """split -> result, for the splits `vaswani-evaluate` scored ({"test": {"bleu": 27.3, "num_beams": 4, ...}})."""
    scored = {split: result for split, result in (evaluation or {}).items() if isinstance(result, dict)}
    return {split: result for split, result in scored.items() if type(result.get("bleu")) in (int, float)}


def results_table(evaluation: dict | None, training: dict | None) -> str:
    """The scores of the evaluated splits (sacreBLEU's BLEU, the paper's tokenized BLEU and chrF where measured), then
    the validation score of the end of training."""
    fields = (
        "bleu", "tokenized_bleu", "chrf", "sentences", "num_beams", "length_penalty", "paper_decoding", "signature"
    )  # fmt: skip
    rows = [[split, *map(result.get, fields)] for split, result in measured_bleu(evaluation).items()]
    if training is not None:
        args = training.get("args") or {}
        beams = args.get("generation_num_beams", args.get("eval_num_beams"))  # the latter: summaries before 0.3
        validation = [training.get("final_val_bleu"), None, None, training.get("bleu_samples"), beams]
        validation += [args.get("eval_length_penalty"), None, training.get("bleu_signature")]
        rows.append(["validation, at the end of training", *validation])
    if not rows:
        return "Not measured: the model folder has no BLEU score (eval_results.json, training_summary.json)."

    def decoding(beams, alpha, paper):
        penalty = "GNMT length penalty" if paper else "length penalty"  # paper_decoding: section 6.1's search
        return f"beam {format_value(beams)}, {penalty} {format_value(alpha)}"

    return table(
        [
            "split",
            "BLEU",
            "tokenized BLEU (Table 2's measure)",
            "chrF",
            "sentences",
            "decoding",
            "sacreBLEU signature",
        ],
        [
            [split, bleu, format_value(tokenized), format_value(chrf), n, decoding(beams, alpha, paper), sig]
            for split, bleu, tokenized, chrf, n, beams, alpha, paper, sig in rows
        ],
    )


def dataset_name(args: dict) -> str:
    """The name of the dataset folder a record names (a training run's arguments, or an evaluation)."""
    return format_value(Path(args["dataset_dir"]).name if args.get("dataset_dir") else None)


def card_data(model_name: str, training: dict | None, evaluation: dict | None) -> ModelCardData:
    """The card's metadata; the languages and the `model-index` of BLEU scores only where the records hold them."""
    args = (training or {}).get("args") or {}
    languages = [args[key] for key in ("source_lang", "target_lang") if args.get(key)]
    # `vaswani-evaluate` records the dataset folder it scored; a record from before names none, and then it is the
    # folder the training record names.
    results = []
    for split, result in measured_bleu(evaluation).items():
        dataset = dataset_name(result if result.get("dataset_dir") else args)
        beams = format_value(result.get("num_beams"))
        for metric, name in (("bleu", "BLEU"), ("chrf", "chrF")):
            if type(result.get(metric)) not in (int, float):  # chrF: evaluations from before it was recorded
                continue
            results.append(
                EvalResult(
                    task_type="translation",
                    task_name="Translation",
                    dataset_type=dataset,
                    dataset_name=f"{dataset} ({split} split)",
                    dataset_split=split,
                    metric_type=metric,
                    metric_value=result[metric],
                    metric_name=f"{name} (sacreBLEU, beam {beams})",
                )
            )
    return ModelCardData(
        language=languages or None,
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=["vaswani", "transformer", "translation", "attention-is-all-you-need"],
        metrics=sorted({result.metric_type for result in results}) or None,
        model_name=model_name if results else None,  # only the model-index uses it
        eval_results=results or None,
    )


def render_model_card(model_dir, repo_id: str, template_path=None) -> str:
    """The README.md of the repo: the Jinja2 template `model_card.md` of the package (or `template_path`) rendered by
    `ModelCard.from_template` with the folder's records. Never invents a figure: what they lack reads "not measured".

    Template values:
        card_data               the YAML metadata (ModelCardData: languages, license, tags, model-index of BLEU)
        repo_id, model_name     the repo ("alice/vaswani-en-es") and its name ("vaswani-en-es")
        parameters              the number of parameters in the weights
        config, generation      config.json and the generation config, e.g. {{ config.d_model }}
        training, eval          training_summary.json and eval_results.json, e.g. {{ training.args.lr }}
        translation             the languages of the run ("from `en` into `es`")
        dataset                 the name of the dataset folder the run trained on
        schedule                the learning-rate schedule the run used, in words
        results_table           the BLEU scores per split
        training_table, eval_table   all of training_summary.json / eval_results.json as tables
        plots                   the folder's *.png plots as images
    An unknown name is an error.
    """
    model_dir = Path(model_dir)
    template_path = Path(template_path) if template_path is not None else MODEL_CARD_TEMPLATE
    template = template_path.read_text(encoding="utf-8")
    config = read_json(model_dir / "config.json") or {}
    training, evaluation = read_json(model_dir / "training_summary.json"), read_json(model_dir / "eval_results.json")
    generation = read_json(model_dir / "generation_config.json")
    if generation is not None:  # the file leaves out the values that are transformers' defaults
        generation = GenerationConfig.from_dict(generation).to_dict()
    args = (training or {}).get("args") or {}
    model_name = repo_id.split("/")[-1]
    metadata = card_data(model_name, training, evaluation)
    plots = sorted(path.name for path in model_dir.glob("*.png"))
    source, target = args.get("source_lang"), args.get("target_lang")
    translation = f"from `{source}` into `{target}`" if source and target else f"between languages {NOT_MEASURED}"
    values = {
        "repo_id": repo_id,
        "model_name": model_name,
        "parameters": format_value(sum(math.prod(shape) for shape in tensor_shapes(model_dir).values())),
        "config": Record(config),
        "generation": Record(generation),
        "training": Record(training),
        "eval": Record(evaluation),
        "translation": translation,
        "dataset": dataset_name(args),
        "schedule": describe_schedule(args, config.get("d_model")),
        "results_table": results_table(evaluation, training),
        "training_table": record_table(training, "training_summary.json"),
        "eval_table": record_table(evaluation, "eval_results.json"),
        "plots": "".join(f"![{Path(name).stem}]({name})\n" for name in plots) or "No training plots.",
    }
    try:
        names = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError as error:
        raise UsageError(f"{template_path.name}, line {error.lineno}: {error.message}") from None
    known = {"card_data", *metadata.to_dict(), *values}
    unknown = sorted(names - known)
    if unknown:
        raise UsageError(
            f"{template_path.name}: unknown placeholder {{{{ {unknown[0]} }}}} (known: {', '.join(sorted(known))})."
        )
    return str(ModelCard.from_template(metadata, template_str=template, **values))
