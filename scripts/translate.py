"""Translate a text file, one sentence per line, with a saved vaswani model folder (needs the `train` extra).

    python scripts/translate.py --model M --input F --output G [--num_beams 4] [--nbest 3 --scores] [--alignments]
                                [--prefixes P] [--max_source_length 250]        (or: vaswani-translate ...)
    python scripts/translate.py --model M --input F --output G --int8               (int8 linear layers, on the CPU)
    python scripts/translate.py --model M --ctranslate2 CT2 --input F --output G   (CTranslate2, the fastest on CPUs)
    sacremoses normalize < raw.txt | vaswani-translate --model M > hyp.txt       (a pipe: standard input and output)

    accelerate launch --num_processes 8 scripts/translate.py --model M --input F --output G --max_tokens 8192
                                                         (every launched process translates its share of the file)

--input and --output left out, or given as -, are standard input and standard output (UTF-8), so that the command sits
in a shell pipeline as fairseq-interactive and marian-decoder do; its progress and summary go to standard error.
Sentences are decoded in batches of similar length (less padding), --batch_size sentences or --max_tokens source
tokens each, and written in their input order, one line each. A file is read --chunk_lines lines at a time and
translated chunk by chunk, shared by every process `accelerate launch` starts; each finished chunk is kept in
OUTPUT.parts, so that the same command, run again after a kill, goes on where the run stopped; the output appears
whole at the end (vaswani.translation.files).
With --nbest, --scores or --alignments, each line is instead tab-separated, --nbest lines per sentence, best first:
the sentence's line number (from 0), the hypothesis' rank, the score (with --scores: its log-probability divided by
the length penalty, as the beam ranked it), the translation, and the alignment (with --alignments: fairseq's
"source-target" index pairs, from the encoder-decoder attention of --alignment_layer averaged over its heads).
--prefixes names a file with one beginning per sentence that each translation is forced to start with.
--ctranslate2 names the model's CTranslate2 export (vaswani-export-ctranslate2, `export` extra) to translate with
instead, tokenized by --model's tokenizer: CTranslate2's beam search with --num_beams and --length_penalty (its length
penalty is |Y| ** alpha, as transformers' beam search's), each batch limited to its longest source + 50 tokens; a
file is shared, resumed and written whole as with the model.
"""

import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vaswani.checks import (
    UsageError,
    check_model_folder,
    check_output_file,
    check_source_lengths,
    device_refusal,
    seq2seq_model_types,
)
from vaswani.cli import command, parse_arguments
from vaswani.evaluation.arguments import DecodingArguments


# --chunk_lines' default (vaswani.translation.files.CHUNK_LINES, which imports accelerate: --help answers without it).
CHUNK_LINES = 10_000


@dataclass
class TranslateArguments:
    model: str = field(metadata={"help": "a model folder (saved with save_pretrained)"})
    input: str = field(default="-", metadata={"help": "text file, one source sentence per line (-: standard input)"})
    output: str = field(
        default="-",
        metadata={"help": "where the translations go (overwritten; its folder must exist; -: standard output)"},
    )
    nbest: int = field(default=1, metadata={"help": "hypotheses written per sentence (at most --num_beams)"})
    scores: bool = field(default=False, metadata={"help": "write each hypothesis' score"})
    alignments: bool = field(default=False, metadata={"help": "write source-target word alignments"})
    alignment_layer: int = field(default=-1, metadata={"help": "decoder layer whose attention aligns (-1: last)"})
    prefixes: str | None = field(default=None, metadata={"help": "file of forced translation beginnings, one a line"})
    ctranslate2: str | None = field(
        default=None,
        metadata={"help": "translate with this CTranslate2 export of --model (vaswani-export-ctranslate2)"},
    )
    chunk_lines: int = field(
        default=CHUNK_LINES,
        metadata={"help": "lines of a file translated, sorted by length and kept on disk together"},
    )


STANDARD_STREAM = "-"


def read_lines(path: str, what: str) -> list[str]:
    if path == STANDARD_STREAM:
        return sys.stdin.buffer.read().decode("utf-8").splitlines()
    if not Path(path).is_file():
        raise UsageError(f"{what} {path} does not exist.")
    return Path(path).read_text(encoding="utf-8").splitlines()


def write_lines(path: str, lines: list[str]):
    """One line each (a newline inside a translation becomes a space), to the file or standard output."""
    text = "".join(line.replace("\n", " ") + "\n" for line in lines).encode("utf-8")
    if path == STANDARD_STREAM:
        sys.stdout.flush()
        sys.stdout.buffer.write(text)
        sys.stdout.buffer.flush()
    else:
        Path(path).write_bytes(text)


def report(message: str):
    """The command's summary, on standard error: standard output may be the translations."""
    print(message, file=sys.stderr)


def destination(output: str) -> str:
    return "standard output" if output == STANDARD_STREAM else output


def format_answer(index: int, rank: int, answer: dict, args: TranslateArguments) -> str:
    if args.nbest == 1 and not args.scores and not args.alignments:
        return answer["translation_text"]
    fields = [str(index), str(rank)]
    if args.scores:
        fields.append(f"{answer['score']:.4f}")
    fields.append(answer["translation_text"])
    if args.alignments:
        fields.append(" ".join(f"{source}-{target}" for source, target in answer["alignment"]))
    return "\t".join(fields)


def ctranslate2_device(args: TranslateArguments, decoding: DecodingArguments) -> str:
    """--ctranslate2: the device CTranslate2 decodes on (its own choice: cuda where it sees one), with every flag it
    cannot honour refused, before any work."""
    unsupported = [flag for flag, used in (("--nbest", args.nbest > 1), ("--scores", args.scores),
                   ("--alignments", args.alignments), ("--prefixes", args.prefixes),
                   ("--max_source_length", decoding.max_source_length is not None)) if used]  # fmt: skip
    if unsupported:
        raise UsageError(
            f"--ctranslate2 writes one translation a line of each whole source: leave out {', '.join(unsupported)}."
        )
    if decoding.dtype != "float32":
        raise UsageError("--ctranslate2 decodes in its model's own type (--int8 for int8): leave out --dtype.")
    if not (Path(args.ctranslate2) / "model.bin").is_file():
        raise UsageError(
            f"--ctranslate2 {args.ctranslate2} holds no CTranslate2 model (model.bin): write one with "
            f"vaswani-export-ctranslate2 --model {args.model} --output_dir {args.ctranslate2}."
        )
    try:
        import ctranslate2
    except ImportError as error:
        raise UsageError("--ctranslate2 needs CTranslate2: pip install 'vaswani[export]'.") from error
    devices = ["cpu", "cuda"] if ctranslate2.get_cuda_device_count() else ["cpu"]  # CTranslate2's own, not torch's
    device = decoding.device or devices[-1]
    if device not in devices:
        reason = f"CTranslate2 {ctranslate2.__version__} " + (
            "sees no CUDA device" if device == "cuda" else "runs on cpu or cuda"
        )
        raise device_refusal(device, reason, devices)
    return device


class CTranslate2Engine:
    """--ctranslate2: the export's translator on `device` (`device_index`: a launched process's own GPU), with
    --model's tokenizer, translating lines as `translate_sentences` does."""

    def __init__(self, args: TranslateArguments, decoding: DecodingArguments, device: str, device_index: int = 0):
        import ctranslate2
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(args.model)
        self.translator = ctranslate2.Translator(
            args.ctranslate2,
            device=device,
            device_index=device_index,
            compute_type="int8" if decoding.int8 else "default",
        )
        self.decoding = decoding

    def __call__(self, lines: list[str], on_batch=None) -> list[str]:
        from vaswani.export.ctranslate2 import translate_sentences

        decoding = self.decoding
        return translate_sentences(
            self.translator,
            self.tokenizer,
            lines,
            decoding.batch_size,
            decoding.max_tokens,
            on_batch,
            beam_size=decoding.num_beams,
            length_penalty=decoding.length_penalty,
        )

    def describe(self) -> str:
        return f"with CTranslate2 ({self.translator.compute_type}) "


def source_positions(model: str) -> int | None:
    """The source positions of --model's config: the longest source it encodes."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", None)


@command(extra="train", needs=("pyarrow", "datasets", "sacrebleu", "sacremoses"))
def main(argv):
    args, decoding = parse_arguments(
        [TranslateArguments, DecodingArguments], argv, description=__doc__.split("\n\n")[0]
    )
    if not 1 <= args.nbest <= decoding.num_beams:
        raise UsageError(f"--nbest must be between 1 and --num_beams ({decoding.num_beams}), got {args.nbest}.")
    if args.output != STANDARD_STREAM:
        check_output_file(args.output)
    if args.prefixes == STANDARD_STREAM == args.input:
        raise UsageError("--prefixes - and --input - would both read standard input: give one of them as a file.")
    if args.chunk_lines < 1:
        raise UsageError(f"--chunk_lines must be at least 1, got {args.chunk_lines}.")
    if STANDARD_STREAM not in (args.input, args.output, args.prefixes):
        if not args.ctranslate2:
            check_model_folder(args.model, model_types=seq2seq_model_types())
        return translate_file(args, decoding)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun's, set in each process accelerate launch starts
        raise UsageError(
            "standard input and output are one process's: under accelerate launch, give --input and --output files."
        )
    sources = read_lines(args.input, "--input")
    if not sources:
        source = "standard input" if args.input == STANDARD_STREAM else f"--input {args.input}"
        raise UsageError(f"{source} is empty: give one sentence per line (a blank line gives a blank one).")
    prefixes = read_lines(args.prefixes, "--prefixes") if args.prefixes else None
    if prefixes is not None and len(prefixes) != len(sources):
        raise UsageError(f"--prefixes has {len(prefixes)} lines but --input {len(sources)}: give one per sentence.")
    if args.ctranslate2:
        engine = CTranslate2Engine(args, decoding, ctranslate2_device(args, decoding))
        check_source_lengths(engine.tokenizer, sources, source_positions(args.model), None)
        start = time.time()
        answers = engine(sources)
        write_lines(args.output, answers)
        report(
            f"Translated {len(sources)} sentences {engine.describe()}in {time.time() - start:.1f}s into "
            f"{destination(args.output)}"
        )
        return answers
    check_model_folder(args.model, model_types=seq2seq_model_types())
    from vaswani.evaluation.bleu import load_translation_model, translations

    model, tokenizer = load_translation_model(
        args.model, device=decoding.device, int8=decoding.int8, dtype=decoding.dtype
    )
    limit = getattr(model.config, "max_position_embeddings", None)
    check_source_lengths(tokenizer, sources, limit, decoding.max_source_length)

    start = time.time()
    answers = translations(
        model, tokenizer, sources, prefixes=prefixes, progress=True, **answer_options(args, decoding)
    )
    seconds = time.time() - start
    lines = [
        format_answer(i, rank, answer, args)
        for i, hypotheses in enumerate(answers)
        for rank, answer in enumerate(hypotheses)
    ]
    write_lines(args.output, lines)
    report_cut(
        [i for i, hypotheses in enumerate(answers) if "source_tokens_dropped" in hypotheses[0]],
        decoding.max_source_length,
    )
    report(
        f"Translated {len(sources)} sentences in {seconds:.1f}s ({len(sources) / seconds:.1f}/s) into "
        f"{destination(args.output)}"
    )
    return answers


def answer_options(args: TranslateArguments, decoding: DecodingArguments) -> dict:
    """What the command asks of each translation: its decoding, and the hypotheses, scores and alignments answered."""
    return {
        **decoding.options(),
        "num_return_sequences": args.nbest,
        "return_scores": args.scores,
        "return_alignments": args.alignments,
        "alignment_layer": args.alignment_layer,
    }


def translate_file(args: TranslateArguments, decoding: DecodingArguments) -> dict:
    """--input and --output files: translated chunk by chunk by every launched process, resumably
    (`FileTranslation`). Returns its summary."""
    import torch
    from accelerate.utils import gather_object

    from vaswani.evaluation.bleu import load_translation_model, translations
    from vaswani.translation.files import FileTranslation, LineFile, launch

    if args.ctranslate2:
        engine_device = ctranslate2_device(args, decoding)
        state, _ = launch("cpu", decoding.int8)  # the processes meet over gloo; CTranslate2 places its own work
        weights = Path(args.ctranslate2) / "model.bin"
    else:
        state, device = launch(decoding.device, decoding.int8)
        engine_device = torch.device(device).type
        weights = Path(args.model) / "model.safetensors"
    source = LineFile.scan(args.input, args.chunk_lines)
    prefixes = LineFile.scan(args.prefixes, args.chunk_lines, "--prefixes") if args.prefixes else None
    settings = {
        "model": str(Path(args.model).resolve()),
        "ctranslate2": str(Path(args.ctranslate2).resolve()) if args.ctranslate2 else None,
        "weights": [weights.stat().st_size, weights.stat().st_mtime_ns] if weights.is_file() else None,
        "device": engine_device,
        **{key: value for key, value in asdict(decoding).items() if key != "device"},
        **{key: getattr(args, key) for key in ("nbest", "scores", "alignments", "alignment_layer")},
    }
    job = FileTranslation(source, args.output, settings, state, prefixes)
    cut, engine_name = [], ""
    if args.ctranslate2:
        index = state.local_process_index if engine_device == "cuda" else 0  # each launched process its own GPU
        translator = CTranslate2Engine(args, decoding, engine_device, index)
        tokenizer, limit, engine_name = translator.tokenizer, source_positions(args.model), translator.describe()

        def translate_chunk(lines, prefixes, first_line, on_batch):
            return translator(lines, on_batch)

    else:
        model, tokenizer = load_translation_model(args.model, device=device, int8=decoding.int8, dtype=decoding.dtype)
        limit = getattr(model.config, "max_position_embeddings", None)

        def translate_chunk(lines, prefixes, first_line, on_batch):
            answers = translations(
                model, tokenizer, lines, prefixes=prefixes, on_batch=on_batch, **answer_options(args, decoding)
            )
            cut.extend(
                first_line + i for i, hypotheses in enumerate(answers) if "source_tokens_dropped" in hypotheses[0]
            )
            return [
                format_answer(first_line + i, rank, answer, args)
                for i, hypotheses in enumerate(answers)
                for rank, answer in enumerate(hypotheses)
            ]

    job.check_lengths(tokenizer, limit, decoding.max_source_length)
    done = job.run(translate_chunk, tokenizer)
    cut = sorted(gather_object(cut))
    if state.is_main_process:
        report_cut(cut, decoding.max_source_length)
        earlier = f"; {done['done_before']} were translated before" if done["done_before"] else ""
        report(
            f"Translated {done['translated']} of {done['lines']} sentences {engine_name}in {done['seconds']:.1f}s "
            f"({done['translated'] / done['seconds']:.1f}/s, {state.num_processes} processes){earlier}, into "
            f"{args.output}"
        )
    return done


def report_cut(cut: list[int], max_source_length: int | None):
    if cut:
        report(
            f"{len(cut)} sources longer than --max_source_length {max_source_length} tokens were cut (lines "
            f"{', '.join(map(str, cut[:20]))}{', ...' if len(cut) > 20 else ''}, counted from 0)."
        )


if __name__ == "__main__":
    main()
