"""The checks that more than one command makes on what a user hands it, each written once.

Every check raises `UsageError` with a message that names the problem and what to do about it; the commands turn
it into one exit style (`vaswani.cli.command`), and a user's own code can catch it (it is a `ValueError`).
"""

import contextlib
import importlib.util
import json
import math
import os
from pathlib import Path


class UsageError(ValueError):
    """Bad input from the user (a missing folder, a mismatched tokenizer, a changed setting on resume): the message
    says what is wrong and how to fix it, and no work is lost."""


def check_extra(command_name, extra, modules):
    """The optional libraries a command needs, looked for without importing them: a missing one is named with the
    extra that brings it (pyproject.toml's [project.optional-dependencies])."""
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise UsageError(
            f"{command_name} needs the `{extra}` extra ({', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed): pip install 'vaswani[{extra}]'"
        )


def looks_like_path(name) -> bool:
    """Whether a command-line argument that names a folder or a Hub repo is meant as a local path: it starts with
    `.`, `/` or `~` (no Hub id does), holds the system's own separator where that is not `/`, has more than one `/`
    (a Hub id has at most one: NAMESPACE/NAME), or its first folder exists here (`data/wmt14` with a `data/`)."""
    name = os.fspath(name)
    if name.startswith((".", "/", "~")) or (os.sep != "/" and os.sep in name):
        return True
    parts = name.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def check_dataset_exists(name, flag="--dataset_dir"):
    """A dataset argument that names a local folder must exist: a `--dataset_dir` always does, a `--dataset` when it
    looks like a path (`looks_like_path`); anything else may be a Hub name. Checked before datasets is imported, and
    before the Hub is asked (whose client retries for half a minute without a network)."""
    name = os.fspath(name)
    if Path(name).expanduser().exists():
        return
    if flag == "--dataset_dir":
        raise UsageError(f"{flag} {name} does not exist; create it with scripts/prepare_data.py --output_dir {name}.")
    if looks_like_path(name):
        raise UsageError(f"{flag} {name} does not exist (a path: it is not looked up on the Hub).")


def check_model_folder(model, flag="--model", model_types=None, hub=False):
    """A model folder a command is about to load, checked before any time is spent: it exists, is a folder, holds a
    readable config.json, and (with `model_types`, a collection of `model_type` values) is of one of those types.
    With `hub`, a name that does not exist here and does not look like a path (`looks_like_path`) is taken for a Hub
    id and left to the Hub: returns None; else the folder's config.json as a dict."""
    path = Path(model)
    if not path.exists():
        if hub and not looks_like_path(model):
            return None
        raise UsageError(f"{flag} {model} does not exist" + (" (nor is it a Hub id)." if hub else "."))
    if not path.is_dir():
        raise UsageError(f"{flag} {model} is a file, not a model folder (one written by save_pretrained).")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UsageError(f"{flag} {model} has no config.json: it is not a model folder written by save_pretrained.")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{config_file} cannot be read as a model's config.json ({error}).") from error
    found = config.get("model_type") if isinstance(config, dict) else None
    if model_types is not None and found not in model_types:
        takes = (
            " or ".join(map(repr, sorted(model_types))) + " models"
            if len(model_types) <= 3
            else "translation models (the types AutoModelForSeq2SeqLM loads)"
        )
        raise UsageError(f"{flag} {model} holds a model of type {found!r}; this command takes {takes}.")
    return config


def check_tokenizer_folder(tokenizer, flag="--tokenizer", hub=False):
    """A tokenizer folder (saved with save_pretrained) that exists; with `hub`, a name that does not look like a path
    is left to the Hub."""
    path = Path(tokenizer)
    if path.is_dir() or (hub and not path.exists() and not looks_like_path(tokenizer)):
        return
    what = "is a file, not a tokenizer folder" if path.exists() else "does not exist"
    raise UsageError(f"{flag} {tokenizer} {what}.")


def seq2seq_model_types():
    """The model types `AutoModelForSeq2SeqLM` loads, this package's "vaswani" among them (imports transformers)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES

    return {"vaswani", *MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES}


def check_output_file(path, flag="--output"):
    """A file a command will write at the end, checked at the start: its folder must exist (it is not created), the
    path must not be a folder, and the file must be writable there."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise UsageError(f"cannot write {flag} {path}: its folder {folder} {what}.")
    if path.is_dir():
        raise UsageError(f"cannot write {flag} {path}: it is a folder.")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"cannot write {flag} {path}: permission denied.")
    return path


def check_device(device, flag="--device"):
    """The torch device a command is asked to run on, as a `torch.device`, checked before any time is spent: a name
    torch reads, of a device this machine has (the CPU, or `torch.accelerator`'s devices). The refusal names the
    device, why it cannot run, and the devices that can."""
    import torch

    try:
        asked = torch.device(device)
    except RuntimeError:
        raise UsageError(f"{flag} {device} is not a device name (cpu, cuda, cuda:1, mps, ...).") from None
    accelerator = torch.accelerator.current_accelerator(check_available=True)  # None on a machine without one
    count = torch.accelerator.device_count() if accelerator is not None else 0
    if asked.type == "cpu" or (
        accelerator is not None and asked.type == accelerator.type and (asked.index or 0) < count
    ):
        return asked
    if asked.type == "cuda" and not torch.backends.cuda.is_built():
        reason = f"this torch has no CUDA (torch {torch.__version__})"
    elif accelerator is not None and asked.type == accelerator.type:
        reason = f"torch sees {count} {asked.type} device{'s' if count > 1 else ''}"
    else:
        reason = f"torch {torch.__version__} sees no {asked.type} device here"
    raise device_refusal(device, reason, ["cpu", *(f"{accelerator.type}:{i}" for i in range(count))], flag)


def device_refusal(device, reason, available, flag="--device") -> UsageError:
    """The one sentence that refuses a device that cannot run: `reason` why not, and the `available` devices."""
    return UsageError(f"{flag} {device}: {reason}; available: {', '.join(available)}.")


def check_source_lengths(tokenizer, sources, limit, max_source_length, flag="--input", first_line=1, bound=None):
    """Sources the model can encode: without --max_source_length, none may be longer than `limit` tokens (the
    model's positions); --max_source_length itself may not be above it. `sources`: str sentences, in order, the first
    of them line `first_line` of `flag`. `bound`: `token_bound(tokenizer)`, read once by a caller that checks a file
    in many parts (reading it takes a copy of the tokenizer's whole vocabulary)."""
    if limit is None:
        return
    if max_source_length is not None:
        if max_source_length > limit:
            raise UsageError(
                f"--max_source_length {max_source_length} is more than the model's {limit} source positions; "
                f"pass --max_source_length {limit} or less."
            )
        return
    bound = token_bound(tokenizer) if bound is None else bound
    for start, block in blocks(sources):
        # Only a source the bound cannot rule out is tokenized: a file's check costs a read, not a tokenization.
        could_be = [index for index, source in enumerate(block) if bound is None or bound(source) > limit]
        lengths = token_lengths(tokenizer, [block[index] for index in could_be])
        longest = next(((index, length) for index, length in zip(could_be, lengths) if length > limit), None)
        if longest is not None:
            raise UsageError(
                f"line {first_line + start + longest[0]} of {flag} is {longest[1]} tokens long, more than the model's "
                f"{limit} source positions: pass --max_source_length {limit} (or less) to cut longer sources."
            )


def blocks(sources, size=1000):
    """(position, list of str) of each block of `size` sources: a list of str, or a pyarrow string array
    (vaswani-evaluate's), turned into Python strings a block at a time."""
    for start in range(0, len(sources), size):
        block = sources[start : start + size]
        yield start, block.to_pylist() if hasattr(block, "to_pylist") else list(block)


def token_lengths(tokenizer, sources) -> list[int]:
    """The number of tokens of each source, with its special tokens (`sources` as `blocks` takes them)."""
    return [len(ids) for _, block in blocks(sources) if block for ids in tokenizer(block).input_ids]


# How many times longer in UTF-8 bytes each normalizer of a fast tokenizer (its tokenizer.json) may make a text, at
# most: Unicode's normal forms (UAX #15's maximum expansion factors: 3 for NFC and NFD, 11 for NFKC and NFKD),
# lower-casing ("İ" gives "i̇") and BERT's (lower-casing, accents stripped after NFD, spaces around CJK characters). ASCII
# text none of them lengthens. A sentencepiece charsmap (`Precompiled`), a `Replace` or a `Prepend` may do anything.
NORMALIZER_GROWTH = {"NFC": 3, "NFD": 3, "NFKC": 11, "NFKD": 11, "Lowercase": 2, "Strip": 1, "StripAccents": 1,
                     "BertNormalizer": 12}  # fmt: skip
# Pre-tokenizers that split a text and add at most one character in front (ByteLevel's prefix space, Metaspace's "▁",
# which also takes each space's place), and models of which each token covers a character or more, or one byte of
# one (byte fallback).
SPLITTING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits",
                            "Split", "BertPreTokenizer", "CharDelimiterSplit"}  # fmt: skip
CHARACTER_MODELS = {"BPE", "Unigram", "WordPiece", "WordLevel"}


def token_bound(tokenizer):
    """A function giving, without tokenizing, at least as many tokens as `tokenizer` gives a source, its special
    tokens included: 1 + the special tokens + the UTF-8 bytes of the source as its normalizers may lengthen it
    (NORMALIZER_GROWTH; ASCII as it is), where each token covers a byte or more of that text (SPLITTING_PRE_TOKENIZERS,
    CHARACTER_MODELS). None for a tokenizer with other parts (a slow one among them)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    parts = json.loads(backend.to_str())
    model, normalizers = parts["model"], leaves(parts["normalizer"], "normalizers")
    pre_tokenizers = leaves(parts["pre_tokenizer"], "pretokenizers")
    vocab = model.get("vocab") or {}
    pieces = set(vocab) if isinstance(vocab, dict) else {entry[0] for entry in vocab}  # Unigram's: [piece, score]
    spaces = {part.get("replacement") for part in pre_tokenizers if part["type"] == "Metaspace"}
    if (
        not {part["type"] for part in normalizers} <= NORMALIZER_GROWTH.keys()
        or not {part["type"] for part in pre_tokenizers} <= SPLITTING_PRE_TOKENIZERS
        or model["type"] not in CHARACTER_MODELS
        or (model.get("byte_fallback") and not spaces <= pieces)  # a "▁" out of the vocabulary: three byte tokens
    ):
        return None
    growth = math.prod(NORMALIZER_GROWTH[part["type"]] for part in normalizers)
    added = 1 + tokenizer.num_special_tokens_to_add(pair=False)
    return lambda source: added + (len(source) if source.isascii() else growth * len(source.encode("utf-8")))


def leaves(part, sequence_key) -> list[dict]:
    """The parts of a tokenizer.json normalizer or pre-tokenizer, those of a `Sequence` one by one."""
    if part is None:
        return []
    if part["type"] == "Sequence":
        return [leaf for inner in part[sequence_key] for leaf in leaves(inner, sequence_key)]
    return [part]


# The folders `check_writable_dir` created in this process, deepest first: a command that fails removes those it left
# empty (`remove_empty_created_dirs`).
_created_dirs = []


def check_writable_dir(path, flag="--output_dir"):
    """Create `path` if needed and prove that files can be written there, before any time is spent. A command that
    then fails on its input leaves no empty folder behind: `vaswani.cli.command` removes the folders created
    here that are still empty."""
    path = Path(path)
    existing = next((parent for parent in (path, *path.parents) if parent.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"cannot write to {flag} {path}: {existing} is a file.")
    try:
        _created_dirs.extend(folder for folder in (path, *path.parents) if not folder.exists())
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_test_{os.getpid()}"  # one per process: several may start at once
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"cannot write to {flag} {path} ({error}).") from error
    return path


def remove_empty_created_dirs():
    """Remove the folders `check_writable_dir` created that are still empty, deepest first; what holds anything stays."""
    for folder in _created_dirs:
        with contextlib.suppress(OSError):  # not empty, or already gone
            folder.rmdir()
    _created_dirs.clear()


def tokenizer_ids(tokenizer) -> dict:
    """What a new model's config takes from its tokenizer: the vocabulary size and the special ids (the decoder
    starts from <s>)."""
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.bos_token_id,
    }


def check_tokenizer_matches_config(tokenizer, config, where="the model"):
    """The model's embedding and special ids must be the tokenizer's, or every id means something else.

    Every id the tokenizer makes needs a row of the embedding (a model may have more rows than the tokenizer has
    tokens, as when the vocabulary is padded), the padding and end-of-sentence ids must agree, and the decoder must
    start from one of the tokenizer's sentence markers (<s> in this package's models, </s> in fairseq's).
    """
    problems = []
    if len(tokenizer) > config.vocab_size:
        problems.append(
            f"the tokenizer has {len(tokenizer)} tokens but the vocabulary of {where} only "
            f"{config.vocab_size} (config.vocab_size): ids from {config.vocab_size} on have no embedding"
        )
    ids = tokenizer_ids(tokenizer)
    for field in ("pad_token_id", "eos_token_id"):
        token_id = ids[field]
        if getattr(config, field) != token_id:
            problems.append(
                f"config.{field} of {where} is {getattr(config, field)} but the tokenizer's id is {token_id}"
            )
    markers = (tokenizer.bos_token_id, tokenizer.eos_token_id)
    if config.decoder_start_token_id not in markers:
        problems.append(
            f"config.decoder_start_token_id of {where} is {config.decoder_start_token_id} but the tokenizer's <s> "
            f"and </s> are {markers[0]} and {markers[1]}"
        )
    if problems:
        raise UsageError(
            "the tokenizer does not match the model: "
            + "; ".join(problems)
            + ". Use the tokenizer the model was trained with."
        )


def check_safetensors_weights(model_dir):
    """A model folder to load must hold safetensors weights: pickles (pytorch_model.bin) can run code when read."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UsageError(f"model folder {model_dir} does not exist.")
    if not any((model_dir / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        others = sorted(p.name for p in model_dir.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        found = f" (found {', '.join(others)})" if others else ""
        raise UsageError(
            f"{model_dir} has no model.safetensors{found}; weights are only read from safetensors "
            "files, never from pickles. Save the model with save_pretrained(folder)."
        )
    return model_dir
