"""Export a trained vaswani model to CTranslate2 (vaswani.export.ctranslate2), weight for weight.

    python scripts/export_ctranslate2.py --model OUT --output_dir CT2 [--quantization int8] [--check [--check_sentences S ...]]
    (or: vaswani-export-ctranslate2 ...)

With --check, a few sentences are translated both ways, and the command fails unless the greedy outputs are equal.
"""

from dataclasses import dataclass, field
from typing import Literal

from vaswani.checks import UsageError, check_model_folder, check_writable_dir
from vaswani.cli import command, parse_arguments


CHECK_SENTENCES = [
    "In the beginning God created the heavens and the earth.",
    "Jesus wept.",
    "The Lord is my shepherd; I shall not want.",
]


@dataclass
class ExportArguments:
    model: str = field(metadata={"help": "a folder (or Hub id) saved by scripts/train.py"})
    output_dir: str = field(metadata={"help": "the CTranslate2 model folder (overwritten)"})
    quantization: Literal["float32", "int8", "int8_float32", "int16", "float16", "bfloat16"] | None = field(
        default=None,
        metadata={"help": "the weights' type in model.bin; default: the model's own (float32 from vaswani-train)"},
    )
    check: bool = field(default=False, metadata={"help": "translate --check_sentences with both engines and compare"})
    check_sentences: list[str] = field(default_factory=lambda: list(CHECK_SENTENCES))


@command(extra="export", needs=("ctranslate2",))
def main(argv):
    (args,) = parse_arguments([ExportArguments], argv, description=__doc__.split("\n\n")[0])
    check_model_folder(args.model, model_types={"vaswani"}, hub=True)
    check_writable_dir(args.output_dir)
    import ctranslate2
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import vaswani  # noqa: F401  (registers the model with the Auto classes)
    from vaswani.export.ctranslate2 import export, translate_ids, vocabulary

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    # OSError: a Hub id that cannot be fetched (offline, no such repo), a damaged folder; ValueError: a folder
    # without the tokenizer's files.
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot load --model {args.model}: {str(error).splitlines()[0]}") from error
    if model.config.model_type != "vaswani":  # a Hub id, which the folder check could not look into
        raise UsageError(f"--model {args.model} is a {model.config.model_type!r} model; only vaswani models export.")
    output = export(model, args.output_dir, tokenizer, args.quantization)
    print(f"CTranslate2 model written to {output}")
    if not args.check:
        return output

    sentences = args.check_sentences
    batch = [tokenizer(sentence).input_ids for sentence in sentences]
    ours = []
    for ids in batch:
        generated = model.generate(torch.tensor([ids]), num_beams=1)[0].tolist()
        ours.append([i for i in generated[1:] if i not in (tokenizer.eos_token_id, tokenizer.pad_token_id)])
    translator = ctranslate2.Translator(str(output), device="cpu")
    theirs = translate_ids(translator, vocabulary(model, tokenizer), batch)
    for sentence, a, b in zip(sentences, ours, theirs):
        mark = "same" if a == b else "DIFFERENT"
        print(f"[{mark}] {sentence}\n  transformers: {tokenizer.decode(a)}\n  ctranslate2:  {tokenizer.decode(b)}")
    if ours != theirs:
        raise UsageError("CTranslate2 and transformers disagree on the greedy translations above.")
    print(f"Greedy outputs identical on {len(sentences)} sentences.")
    return output


if __name__ == "__main__":
    main()
