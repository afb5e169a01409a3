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

import contextlib
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
from vaswani.progress import progress_bar


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


def line_chunks(path: str, chunk_lines: int, flag: str):
    """The lines of a file or of standard input (-), `chunk_lines` at a time, never all of them (a line ends at "\\n",
    a "\\r" before it dropped, as in a file `translate_file` reads); a missing, empty or non-UTF-8 file is refused
    before any work."""
    from vaswani.translation.files import LineFile, stream_chunks

    if path == STANDARD_STREAM:
        yield from stream_chunks(sys.stdin.buffer, chunk_lines, "standard input")
        return
    file = LineFile.scan(path, chunk_lines, flag)
    for index in range(file.chunks):
        yield file.chunk(index)


@contextlib.contextmanager
def line_writer(path: str):
    """A function that writes lines (a newline inside one becomes a space) to standard output at once, or to the file
    `path`, which appears whole when the block ends without an error and not at all otherwise."""
    if path == STANDARD_STREAM:
        sys.stdout.flush()
        stream = sys.stdout.buffer
    else:
        partial = Path(path).with_name(Path(path).name + ".partial")
        stream = partial.open("wb")

    def write(lines: list[str]):
        stream.write("".join(line.replace("\n", " ") + "\n" for line in lines).encode("utf-8"))
        stream.flush()

    if path == STANDARD_STREAM:
        yield write
        return
    try:
        with stream:
            yield write
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


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
    return translate_stream(args, decoding)


def answer_options(args: TranslateArguments, decoding: DecodingArguments) -> dict:
    """What the command asks of each translation: its decoding, and the hypotheses, scores and alignments answered."""
    return {
        **decoding.options(),
        "num_return_sequences": args.nbest,
        "return_scores": args.scores,
        "return_alignments": args.alignments,
        "alignment_layer": args.alignment_layer,
    }


def chunk_translator(args: TranslateArguments, decoding: DecodingArguments, device: str | None, cut: list, index=0):
    """What translates a chunk of lines, `translate(lines, prefixes, first_line, on_batch)` (the chunk's output
    lines; `on_batch(indices)` after each batch), with the tokenizer and the number of source positions its lines are
    checked against, and the engine's name for the summary: --ctranslate2's on `device` (`index`: a launched
    process's own GPU), or the model's. The line numbers of sources cut to --max_source_length join `cut`."""
    if args.ctranslate2:
        translator = CTranslate2Engine(args, decoding, device, index)

        def translate(lines, prefixes, first_line, on_batch=None):
            return translator(lines, on_batch)

        return translate, translator.tokenizer, source_positions(args.model), translator.describe()

    from vaswani.evaluation.bleu import load_translation_model, translations

    model, tokenizer = load_translation_model(args.model, device=device, int8=decoding.int8, dtype=decoding.dtype)

    def translate(lines, prefixes, first_line, on_batch=None):
        answers = translations(
            model, tokenizer, lines, prefixes=prefixes, on_batch=on_batch, **answer_options(args, decoding)
        )
        cut.extend(first_line + i for i, hypotheses in enumerate(answers) if "source_tokens_dropped" in hypotheses[0])
        return [
            format_answer(first_line + i, rank, answer, args)
            for i, hypotheses in enumerate(answers)
            for rank, answer in enumerate(hypotheses)
        ]

    return translate, tokenizer, getattr(model.config, "max_position_embeddings", None), ""


def translate_stream(args: TranslateArguments, decoding: DecodingArguments) -> int:
    """Standard input or output (-) in one process: --chunk_lines lines read at a time, as they come, each chunk
    translated and written before the next is read, so that memory stays flat however long the stream. A chunk's
    lines are checked before its work (too long for the model, prefixes that run out); a refusal there comes after the
    earlier chunks reached standard output, and leaves no --output file. Returns the number of lines translated."""
    if args.ctranslate2:
        device = ctranslate2_device(args, decoding)
    else:
        check_model_folder(args.model, model_types=seq2seq_model_types())
        device = decoding.device
    cut = []
    translate, tokenizer, limit, engine_name = chunk_translator(args, decoding, device, cut)
    prefixes = line_chunks(args.prefixes, args.chunk_lines, "--prefixes") if args.prefixes else None
    done, start = 0, time.time()
    with line_writer(args.output) as write, progress_bar(desc="translating", unit="line") as bar:
        for lines in line_chunks(args.input, args.chunk_lines, "--input"):
            forced = next(prefixes, []) if prefixes is not None else None
            if forced is not None and len(forced) != len(lines):
                raise UsageError(
                    f"--prefixes and --input differ in length from --input's line {done + 1} on: give one prefix "
                    "per sentence."
                )
            check_source_lengths(tokenizer, lines, limit, decoding.max_source_length, first_line=done + 1)
            write(translate(lines, forced, done, lambda indices: bar.update(len(indices))))
            done += len(lines)
        if not done:
            source = "standard input" if args.input == STANDARD_STREAM else f"--input {args.input}"
            raise UsageError(f"{source} is empty: give one sentence per line (a blank line gives a blank one).")
        if prefixes is not None and next(prefixes, None) is not None:
            raise UsageError(f"--prefixes has more lines than --input's {done}: give one per sentence.")
    seconds = time.time() - start
    report_cut(cut, decoding.max_source_length)
    report(
        f"Translated {done} sentences {engine_name}in {seconds:.1f}s ({done / seconds:.1f}/s) into "
        f"{destination(args.output)}"
    )
    return done


def translate_file(args: TranslateArguments, decoding: DecodingArguments) -> dict:
    """--input and --output files: translated chunk by chunk by every launched process, resumably
    (`FileTranslation`). Returns its summary."""
    import torch
    from accelerate.utils import gather_object

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
    cut = []
    index = state.local_process_index if args.ctranslate2 and engine_device == "cuda" else 0  # each process its GPU
    translate_chunk, tokenizer, limit, engine_name = chunk_translator(
        args, decoding, engine_device if args.ctranslate2 else device, cut, index
    )
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
