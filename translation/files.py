"""A text file translated line for line into another, at any size: in one process, or in every process that
`accelerate launch` starts, each decoding its own share; resumable after a kill; the output whole or absent.

The input is read as a stream of chunks: chunk i holds lines i * chunk_lines to (i + 1) * chunk_lines - 1, and process
r of n translates the chunks i with i % n == r. A chunk is translated on its own, its lines sorted by length and
batched within it (the sorting window), so that its translation is the same whichever process decodes it and however
many there are, and so that memory does not grow with the file. Each finished chunk is written whole (a temporary file
renamed) into the work folder OUTPUT.parts beside the output, with a manifest of the run's settings. A run that finds
that folder translates only the chunks still missing, and refuses in one sentence a folder left by a run with other
settings. Once every chunk is there, the main process joins them into a temporary file, renames it to the output and
removes the work folder.
"""

import atexit
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import gather_object

from ..checks import UsageError, check_device, check_source_lengths, token_bound, token_lengths
from ..progress import progress_bar, watched


# Lines a chunk holds by default: the window within which lines are sorted by length into batches (wide enough for
# batches of thousands of tokens to gather sentences of one length), and what a killed process loses at most.
CHUNK_LINES = 10_000

# How long a process that has finished its share waits at the last barrier for the others' shares, which on a large
# file may take hours longer (torch's default, 30 minutes, would end the run); a process lost ends the launch at once.
SHARE_WAIT = timedelta(hours=24)

MANIFEST = "manifest.json"


def launch(device: str | None, int8: bool) -> tuple[PartialState, str]:
    """The processes `accelerate launch` started (or this one alone), which wait SHARE_WAIT for each other at a
    barrier and part at exit, and the device this process decodes on: `device` in a single process; each process's own
    (`cuda:LOCAL_RANK`) when several; an accelerator if there is one; the CPU, over gloo, for `device` cpu, `int8` or
    a machine without an accelerator."""
    if device is not None:
        check_device(device)  # refused in one sentence before the processes meet
    on_cpu = int8 or (device or "").startswith("cpu") or not torch.accelerator.is_available()
    state = PartialState(cpu=on_cpu, timeout=SHARE_WAIT)
    if state.num_processes > 1:
        # Before the interpreter ends: torch (2.15) aborts a process that ends with its process group alive
        # ("terminate called without an active exception"), after the command's work is done.
        atexit.register(state.destroy_process_group)
    return state, str(device if device and state.num_processes == 1 else state.device)


def utf8_line(line: bytes, number: int, where: str) -> str:
    """A line's text, refused by its number where it is not UTF-8."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"line {number} of {where} is not UTF-8 text (byte {error.start + 1} of the line): convert the file to UTF-8."
        ) from None


def stream_chunks(stream, chunk_lines: int, where: str):
    """The lines of a binary stream (standard input), `chunk_lines` at a time as they arrive, never all of them;
    a line ends as a `LineFile`'s does."""
    chunk = []
    for number, line in enumerate(stream, start=1):
        chunk.append(utf8_line(line, number, where).removesuffix("\n").removesuffix("\r"))
        if len(chunk) == chunk_lines:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass(frozen=True)
class LineFile:
    """A UTF-8 text file read a chunk of lines at a time, never whole: its number of lines, a digest of its bytes,
    and the byte at which each chunk starts (then the file's size). A line ends at "\\n" (a "\\r" before it is
    dropped); a last line without one counts."""

    path: Path
    chunk_lines: int
    lines: int
    digest: str
    offsets: tuple[int, ...]

    @classmethod
    def scan(cls, path, chunk_lines: int, flag: str = "--input") -> "LineFile":
        """Read `path` once: refused if it does not exist, is empty or holds a line that is not UTF-8."""
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"{flag} {path} does not exist.")
        digest, offsets, position, lines = hashlib.blake2b(digest_size=16), [], 0, 0
        with path.open("rb") as file:
            for lines, line in enumerate(file, start=1):
                if (lines - 1) % chunk_lines == 0:
                    offsets.append(position)
                utf8_line(line, lines, f"{flag} {path}")
                digest.update(line)
                position += len(line)
        if not lines:
            raise UsageError(f"{flag} {path} is empty: give one sentence per line (a blank line gives a blank one).")
        return cls(path, chunk_lines, lines, digest.hexdigest(), (*offsets, position))

    @property
    def chunks(self) -> int:
        return len(self.offsets) - 1

    def chunk(self, index: int) -> list[str]:
        with self.path.open("rb") as file:
            file.seek(self.offsets[index])
            text = file.read(self.offsets[index + 1] - self.offsets[index]).decode("utf-8")
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        return [line.removesuffix("\r") for line in lines]

    def describe(self) -> dict:
        """What the manifest keeps of the file: a resume must read the same bytes."""
        return {
            "path": str(self.path.resolve()),
            "lines": self.lines,
            "bytes": self.offsets[-1],
            "digest": self.digest,
        }


class FileTranslation:
    """The translation of `source` into `output` by the processes of `state`: `check_lengths` before any work, then
    `run`.

    `settings` (a JSON-able dict: the model, the decoding, the output's format) go into the manifest with the input's
    and `prefixes`' descriptions; a work folder whose manifest differs is refused in one sentence."""

    def __init__(self, source: LineFile, output, settings: dict, state: PartialState, prefixes: LineFile = None):
        if prefixes is not None and prefixes.lines != source.lines:
            raise UsageError(
                f"--prefixes has {prefixes.lines} lines but --input {source.lines}: give one per sentence."
            )
        self.source, self.prefixes, self.state = source, prefixes, state
        self.output = Path(output)
        self.parts = self.output.with_name(self.output.name + ".parts")
        self.removed = self.output.with_name(self.output.name + ".parts.removed")
        self.manifest = {
            "input": source.describe(),
            "prefixes": None if prefixes is None else prefixes.describe(),
            "chunk_lines": source.chunk_lines,
            **settings,
        }
        self.check_manifest()
        self.mine = range(state.process_index, source.chunks, state.num_processes)

    def part(self, index: int) -> Path:
        return self.parts / f"{index:08d}.txt"

    def check_manifest(self):
        """Refuse a work folder left by a run with other settings, naming the first that differs."""
        path = self.parts / MANIFEST
        if not path.is_file():
            return
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            found = {}
        differs = next((key for key in {**self.manifest, **found} if found.get(key) != self.manifest.get(key)), None)
        if differs is not None:
            raise UsageError(
                f"{self.parts} holds the work of another run ({differs} was {found.get(differs)!r}, now "
                f"{self.manifest.get(differs)!r}): run the same command again, or remove {self.parts} to start over."
            )

    def check_lengths(self, tokenizer, limit, max_source_length):
        """`check_source_lengths` of every line still to translate, each process reading its own share: all
        processes refuse the first line too long, before any of them translates."""
        first = []
        if max_source_length is not None or limit is None:
            check_source_lengths(tokenizer, [], limit, max_source_length)
        else:
            bound = token_bound(tokenizer)
            for index in self.missing():
                try:
                    check_source_lengths(
                        tokenizer,
                        self.source.chunk(index),
                        limit,
                        None,
                        first_line=index * self.source.chunk_lines + 1,
                        bound=bound,
                    )
                except UsageError as error:
                    first = [(index, str(error))]
                    break
        refusals = sorted(gather_object(first))
        if refusals:
            raise UsageError(refusals[0][1])

    def missing(self) -> list[int]:
        return [index for index in self.mine if not self.part(index).exists()]

    def run(self, translate_chunk, tokenizer) -> dict:
        """Translate this process's missing chunks with `translate_chunk(lines, prefixes, first_line, on_batch)`,
        which returns a chunk's output lines and calls `on_batch(indices)` after each batch (`translations`); then
        join the chunks into the output. Returns, over all processes, the input's `lines`, those `translated` (decoded)
        by this run and those `done_before` it (in chunks found on disk), and this run's `seconds`."""
        start = time.perf_counter()
        if self.state.is_main_process:
            shutil.rmtree(self.removed, ignore_errors=True)  # the work folder of a finished run, killed as it went
            self.parts.mkdir(exist_ok=True)
            for leftover in self.parts.glob("*.tmp"):  # a chunk being written when a run was killed
                leftover.unlink()
            write_whole(self.parts / MANIFEST, json.dumps(self.manifest, indent=1) + "\n")
        self.state.wait_for_everyone()
        missing = self.missing()
        share = sum(
            min(self.source.chunk_lines, self.source.lines - index * self.source.chunk_lines) for index in missing
        )
        bar = LineProgress(share, shown=self.state.is_main_process)
        for index in missing:
            lines = self.source.chunk(index)
            prefixes = None if self.prefixes is None else self.prefixes.chunk(index)
            lengths = token_lengths(tokenizer, lines)
            output = translate_chunk(
                lines,
                prefixes,
                index * self.source.chunk_lines,
                lambda indices, lengths=lengths: bar.advance(len(indices), sum(lengths[i] for i in indices)),
            )
            write_whole(self.part(index), "".join(line.replace("\n", " ") + "\n" for line in output))
        bar.close()
        # The lines each process decoded (counted batch by batch) and those its missing chunks held.
        decoded, shares = zip(*gather_object([(bar.done, share)]))
        self.state.wait_for_everyone()
        if self.state.is_main_process:
            self.join()
        self.state.wait_for_everyone()
        return {
            "lines": self.source.lines,
            "translated": sum(decoded),
            "done_before": self.source.lines - sum(shares),
            "seconds": time.perf_counter() - start,
        }

    def join(self):
        """The chunks, in order, into a temporary file renamed to the output; then the work folder removed."""
        temporary = self.parts / "output.tmp"
        with temporary.open("wb") as joined:
            for index in range(self.source.chunks):
                with self.part(index).open("rb") as part:
                    shutil.copyfileobj(part, joined)
            durable(joined)
        os.replace(temporary, self.output)
        # Renamed before it is emptied: a run killed meanwhile leaves no work folder with some chunks gone.
        os.replace(self.parts, self.removed)
        shutil.rmtree(self.removed)


def write_whole(path: Path, text: str):
    """`text` written into `path` whole or not at all: into a temporary file beside it, made durable, then renamed."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as file:
        file.write(text)
        durable(file)
    os.replace(temporary, path)


def durable(file):
    """An open file's writes on the disk, before it is renamed: a crash then leaves the old name or the whole file."""
    file.flush()
    os.fsync(file.fileno())


# Where nobody watches (a log), a line each time this share of the work is done.
LOG_STEP = 0.05


class LineProgress:
    """Lines and source tokens a second and the time left: a live bar on a terminal (`progress_bar`), a line at each
    LOG_STEP of the work in a log. Nothing where not `shown` (the processes other than the main one)."""

    def __init__(self, total: int, shown: bool):
        self.total, self.done, self.tokens, self.start = total, 0, 0, time.perf_counter()
        self.live = shown and watched()
        self.logged = shown and not watched()
        self.next_line = LOG_STEP
        self.bar = progress_bar(total=total, desc="translating", unit="line", disable=not self.live)

    def advance(self, lines: int, tokens: int):
        self.done += lines
        self.tokens += tokens
        seconds = max(time.perf_counter() - self.start, 1e-9)
        if self.live:
            self.bar.set_postfix_str(f"{self.tokens / seconds:,.0f} tokens/s", refresh=False)
            self.bar.update(lines)
        elif self.logged and self.done >= self.next_line * self.total:
            left = (self.total - self.done) * seconds / self.done
            print(
                f"translated {self.done:,} of {self.total:,} lines ({self.done / self.total:.0%}): "
                f"{self.done / seconds:,.1f} lines/s, {self.tokens / seconds:,.0f} source tokens/s, "
                f"{timedelta(seconds=round(left))} left",
                file=sys.stderr,
            )
            self.next_line = (int(self.done / self.total / LOG_STEP) + 1) * LOG_STEP

    def close(self):
        self.bar.close()
