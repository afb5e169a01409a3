"""The checks that more than one command makes on what a user hands it, each written once.

Every check raises `UsageError` with a message that names the problem and what to do about it; the commands turn
it into one exit style (`vaswani.training.cli.command`), and a user's own code can catch it (it is a `ValueError`).
"""

import os
from pathlib import Path


class UsageError(ValueError):
    """Bad input from the user (a missing folder, a mismatched tokenizer, a changed setting on resume): the message
    says what is wrong and how to fix it, and no work is lost."""


def check_writable_dir(path, flag="--output_dir"):
    """Create `path` if needed and prove that files can be written there, before any time is spent."""
    path = Path(path)
    existing = next((parent for parent in (path, *path.parents) if parent.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"cannot write to {flag} {path}: {existing} is a file.")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_test_{os.getpid()}"  # one per process: several may start at once
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"cannot write to {flag} {path} ({error}).") from error
    return path


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
