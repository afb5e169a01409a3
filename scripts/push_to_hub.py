"""Share a trained model on the Hugging Face Hub, in one commit, so that it loads anywhere.

The model folder written by `save_pretrained` (and the training scripts) goes up as it is needed to load the model
without this package: the safetensors weights, `config.json` with its `auto_map`, the code (`configuration_vaswani.py`,
`modeling_vaswani.py`), the generation config and the tokenizer files; with them the run's records if present
(`training_summary.json`, `eval_results.json`, the Trainer's `*_results.json` and `trainer_state.json`,
`train_log.jsonl`, the `*.png` plots), and a README.md model card rendered from the
template `model_card.md` at the root of this repository (see `render_model_card`). Checkpoints, optimizer states,
pickled training arguments and everything else in the folder stay local.

Then anyone can run, with or without this package installed:

    tokenizer = AutoTokenizer.from_pretrained("alice/vaswani-en-es")
    model = AutoModelForSeq2SeqLM.from_pretrained("alice/vaswani-en-es", trust_remote_code=True)

Behaviour:
* Everything goes up in ONE commit (the Hub applies a commit all or nothing), on the branch `--revision` (created
  from main if it does not exist yet). A failed upload leaves the branch as it was, and says what failed.
* A push of an unchanged folder makes no commit: local files are compared by hash with the branch's files first.
  Files this script uploads that are no longer in the folder are deleted in the same commit (a model that went
  from one weights file to shards does not keep both), other files of the repo are left alone.
* The token comes from where the `huggingface_hub` client finds it (`HF_TOKEN`, else the one `hf auth login` stored);
  the Hub from `HF_ENDPOINT` (default https://huggingface.co). The token is never printed: error messages are
  redacted, and a folder in which a file contains the token is refused.

Usage:
  python scripts/push_to_hub.py --model_dir OUT --repo_id alice/vaswani-en-es [--private] [--revision BRANCH]
      [--commit_message "..."]
"""

import argparse
import fnmatch
import hashlib
import json
import math
import re
import struct
import sys
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.hf_api import RepoFile

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_CARD_TEMPLATE = REPO_ROOT / "model_card.md"

# The files of a model folder that go to the Hub (names or glob patterns, at the top of the folder).
CODE_FILES = ("configuration_vaswani.py", "modeling_vaswani.py", "pipeline_vaswani.py")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "chat_template.jinja")
RECORD_FILES = ("training_summary.json", "eval_results.json", "train_results.json", "all_results.json",
                "trainer_state.json", "train_log.jsonl", "*.png")
UPLOADED = ("config.json", "generation_config.json", *CODE_FILES, "model.safetensors", "model-*-of-*.safetensors",
            "model.safetensors.index.json", *TOKENIZER_FILES, *RECORD_FILES)
AUTO_MAP_KEYS = ("AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM")
NOT_MEASURED = "not measured"


class PushError(Exception):
    """A push that cannot go on; the message says why and never holds the token."""


# --- The model folder ------------------------------------------------------------------------------------------------


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes), without reading the tensors."""
    with open(path, "rb") as file:
        prefix = file.read(8)
        length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else 0
        if not 0 < length < 100_000_000:
            raise PushError(f"{path} is not a safetensors file.")
        try:
            return json.loads(file.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise PushError(f"{path} is not a safetensors file: {error}") from None


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of the model: one file, or the shards its index lists. Refuses a folder without them."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [name for name in shards if not (model_dir / name).is_file()]
        if missing:
            raise PushError(f"{model_dir} is missing weight shards listed in {index.name}: {', '.join(missing)}.")
        return [model_dir / name for name in shards]
    if (model_dir / "model.safetensors").is_file():
        return [model_dir / "model.safetensors"]
    others = sorted(p.name for p in model_dir.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    hint = f" (found {', '.join(others)}: only safetensors weights are shared)" if others else ""
    raise PushError(f"{model_dir} has no model weights: no model.safetensors{hint}. "
                    "Save the model with save_pretrained(folder).")


def count_parameters(model_dir: Path) -> int:
    """The number of parameters stored in the weights (tied matrices are stored, and counted, once)."""
    total = 0
    for path in weight_files(model_dir):
        header = read_safetensors_header(path)
        total += sum(math.prod(tensor["shape"]) for name, tensor in header.items() if name != "__metadata__")
    return total


def check_model_dir(model_dir: Path) -> dict:
    """Refuse a folder that is not a vaswani model loadable from the Hub; return its config."""
    if not model_dir.is_dir():
        raise PushError(f"Model folder {model_dir} does not exist.")
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise PushError(f"{model_dir} is not a saved model: it has no config.json. "
                        "Save the model with save_pretrained(folder).")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise PushError(f"{config_file} is not valid JSON: {error}") from None
    if config.get("model_type") != "vaswani":
        raise PushError(f"{model_dir} holds a {config.get('model_type')!r} model, not a vaswani model.")
    missing_code = [name for name in CODE_FILES if not (model_dir / name).is_file()]
    auto_map = config.get("auto_map") or {}
    if missing_code or any(key not in auto_map for key in AUTO_MAP_KEYS):
        raise PushError(f"{model_dir} was saved without its code (missing: "
                        f"{', '.join(missing_code) or 'auto_map in config.json'}), so it would not load without the "
                        "vaswani package. Save it again with save_pretrained() of this package.")
    embeddings = {name: tensor["shape"] for path in weight_files(model_dir)
                  for name, tensor in read_safetensors_header(path).items() if name.endswith("shared.weight")}
    expected = [config.get("vocab_size"), config.get("d_model")]
    if not embeddings or any(shape != expected for shape in embeddings.values()):
        raise PushError(f"The weights in {model_dir} do not fit its config.json: expected shared embeddings of shape "
                        f"{expected}, found {embeddings or 'none'}.")
    return config


def files_to_upload(model_dir: Path) -> dict[str, Path]:
    """path in the repo -> local file, for the files of the folder this script shares."""
    return {path.name: path for path in sorted(model_dir.iterdir())
            if path.is_file() and any(fnmatch.fnmatch(path.name, pattern) for pattern in UPLOADED)}


def file_contains(path: Path, needle: bytes, chunk_size: int = 1 << 24) -> bool:
    """Whether `needle` occurs in the file, read in chunks (weights can be large)."""
    with open(path, "rb") as file:
        tail = b""
        while chunk := file.read(chunk_size):
            if needle in tail + chunk:
                return True
            tail = chunk[-(len(needle) - 1):] if len(needle) > 1 else b""
    return False


# --- The model card --------------------------------------------------------------------------------------------------

DEFAULT_MODEL_CARD = """---
library_name: transformers
pipeline_tag: translation
tags:
- vaswani
- transformer
- translation
---

# {{ model_name }}

The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017), trained with the `vaswani`
package. The code travels with the weights, so the model loads without the package:

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{{ repo_id }}")
model = AutoModelForSeq2SeqLM.from_pretrained("{{ repo_id }}", trust_remote_code=True)
batch = tokenizer(["A sentence to translate."], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

## Model

| | |
| --- | --- |
| d_model | {{ config.d_model }} |
| layers (encoder, decoder) | {{ config.encoder_layers }}, {{ config.decoder_layers }} |
| attention heads | {{ config.encoder_attention_heads }} |
| d_ff | {{ config.encoder_ffn_dim }} |
| vocabulary | {{ config.vocab_size }} |
| parameters | {{ parameters }} |

## Training

{{ training_table }}

## Evaluation

{{ eval_table }}

{{ plots }}
"""

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w.\-]*)\s*\}\}")


def format_value(value) -> str:
    """A recorded value as the card shows it: numbers as measured (floats to 4 significant digits), lists joined."""
    if value is None:
        return NOT_MEASURED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(format_value(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def flatten(record: dict, prefix: str = "") -> dict:
    """{"bleu": {"test": 27.3}} -> {"bleu.test": 27.3}"""
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_record(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise PushError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(record, dict):
        raise PushError(f"{path} must hold a JSON object.")
    return flatten(record)


def record_table(record: dict | None, file_name: str) -> str:
    if record is None:
        return f"Not measured: the model folder has no {file_name}."
    rows = "".join(f"| {key} | {format_value(value)} |\n" for key, value in record.items())
    return "| | |\n| --- | --- |\n" + rows


def model_index(model_name: str, eval_record: dict | None) -> str:
    """The card's `model-index` metadata: one BLEU result per split that `scripts/evaluate.py` measured, or nothing."""
    measured = {split: result for split, result in (eval_record or {}).items()
                if isinstance(result, dict) and isinstance(result.get("bleu"), (int, float))}
    if not measured:
        return ""
    lines = ["model-index:", f"- name: {model_name}", "  results:"]
    for split, result in measured.items():
        lines += [
            "  - task:", "      type: translation", "      name: Translation",
            "    dataset:", "      type: sword-bible-verses", f"      name: Bible verses, {split} split",
            f"      split: {split}",
            "    metrics:", "    - type: bleu", f"      value: {result['bleu']}",
            f"      name: BLEU (sacreBLEU, beam {result.get('num_beams', 'n/a')})", "      verified: false",
        ]
    return "\n".join(lines)


def render_model_card(model_dir, repo_id: str, template_path=None) -> str:
    """The README.md of the repo: `model_card.md` (or, while it does not exist, a short default) with its
    placeholders filled from the model folder. Never invents a figure: what the records lack reads "not measured".

    Placeholders, written `{{ name }}`:
        repo_id, model_name     the repo ("alice/vaswani-en-es") and its name ("vaswani-en-es")
        parameters              the number of parameters in the weights
        config.FIELD            a field of config.json, e.g. {{ config.d_model }}
        training.KEY            a value of training_summary.json, nested keys joined by dots, e.g. {{ training.steps }}
        eval.KEY                a value of eval_results.json, e.g. {{ eval.bleu }} or {{ eval.test.bleu }}
        training_table          all of training_summary.json as a table
        eval_table              all of eval_results.json as a table
        plots                   the folder's *.png plots as images
        model_index             the `model-index` metadata of the measured BLEU scores (empty if none)
    A missing record, key, or a null value reads "not measured"; an unknown placeholder is an error.
    """
    model_dir = Path(model_dir)
    template_path = Path(template_path) if template_path is not None else MODEL_CARD_TEMPLATE
    template = template_path.read_text(encoding="utf-8") if template_path.is_file() else DEFAULT_MODEL_CARD
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    eval_file = model_dir / "eval_results.json"
    records = {"training": read_record(model_dir / "training_summary.json"), "eval": read_record(eval_file)}
    plots = sorted(path.name for path in model_dir.glob("*.png"))
    values = {
        "repo_id": repo_id,
        "model_name": repo_id.split("/")[-1],
        "parameters": format_value(count_parameters(model_dir)),
        "training_table": record_table(records["training"], "training_summary.json"),
        "eval_table": record_table(records["eval"], "eval_results.json"),
        "plots": "".join(f"![{Path(name).stem}]({name})\n" for name in plots) or "No training plots.",
        "model_index": model_index(repo_id.split("/")[-1], json.loads(eval_file.read_text()) if records["eval"] else None),
    }

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name in values:
            return values[name]
        source, _, key = name.partition(".")
        if source == "config" and key:  # a folder saved by an older version may lack a field: not recorded then
            return format_value(config.get(key))
        if source in records and key:
            return format_value((records[source] or {}).get(key))
        known = [*values, "config.FIELD", "training.KEY", "eval.KEY"]
        raise PushError(f"{template_path.name}: unknown placeholder {match.group(0)} (known: {', '.join(known)}).")

    return PLACEHOLDER.sub(fill, template)


# --- The push --------------------------------------------------------------------------------------------------------


def redact(text: str, token: str | None) -> str:
    return text.replace(token, "<token>") if token else text


def describe(error: BaseException) -> str:
    """The message of an error and of the errors that caused it, e.g. which upload failed and the HTTP answer."""
    messages = []
    while error is not None and len(messages) < 5:
        message = str(error).strip()
        if not isinstance(error, HfHubHTTPError):  # its message says what it is ("403 Forbidden: ..."), others may not
            message = f"{type(error).__name__}: {message}" if message else type(error).__name__
        if message not in messages:
            messages.append(message)
        if isinstance(error, HfHubHTTPError):  # it already tells the HTTP answer; what caused it repeats that
            break
        error = error.__cause__ or error.__context__
    return "\n  caused by: ".join(messages)


@contextmanager
def step(what: str, token: str | None):
    """Turn any error of a step into a PushError that says which step failed, with the token redacted."""
    try:
        yield
    except PushError:
        raise
    except Exception as error:
        message = f"{what} failed: {describe(error)}"
        if getattr(getattr(error, "response", None), "status_code", None) == 401:
            message += "\nCheck your token: HF_TOKEN, or the one stored by `hf auth login` (HF_TOKEN wins)."
        raise PushError(redact(message, token)) from None


def git_blob_id(content: bytes) -> str:
    """The id git gives a file's content (what the Hub lists as `blob_id` for files not stored with LFS)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def is_unchanged(local: Path | bytes, remote: RepoFile | None) -> bool:
    """Whether a local file (a path, or bytes) equals the repo's: same sha256 for LFS files, same git blob id for
    the others."""
    if remote is None:
        return False
    size = len(local) if isinstance(local, bytes) else local.stat().st_size
    if size != remote.size:
        return False
    if remote.lfs is not None:
        local_sha256 = hashlib.sha256(local).hexdigest() if isinstance(local, bytes) else sha256_of(local)
        return remote.lfs.sha256 == local_sha256
    return remote.blob_id == git_blob_id(local if isinstance(local, bytes) else local.read_bytes())


def push_to_hub(model_dir, repo_id: str, private: bool = False, revision: str | None = None,
                commit_message: str | None = None) -> str:
    """Upload the model folder to `repo_id` in one commit on branch `revision` (default main); return the commit URL.

    Makes no commit when the branch already holds exactly these files. Raises PushError, token-free, on failure.
    """
    model_dir = Path(model_dir)
    branch = revision or "main"
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", repo_id):
        raise PushError(f"--repo_id must be NAMESPACE/NAME (your user or organization, then the model name), "
                        f"got {repo_id!r}.")
    if re.fullmatch(r"[0-9a-f]{40}", branch) or branch.startswith("refs/"):
        raise PushError(f"--revision must be a branch name, got {branch!r}.")
    config = check_model_dir(model_dir)
    files = files_to_upload(model_dir)
    readme = render_model_card(model_dir, repo_id).encode("utf-8")
    if not any(name in files for name in ("tokenizer.json", "tokenizer_config.json")):
        print(f"Warning: {model_dir} has no tokenizer files; AutoTokenizer and pipeline() will not work from the Hub.",
              file=sys.stderr)

    token = get_token()
    if not token:
        raise PushError("No Hugging Face token: set HF_TOKEN, or log in once with `hf auth login`.")
    leaking = [name for name, path in files.items() if file_contains(path, token.encode())]
    if token.encode() in readme:
        leaking.append("README.md (rendered)")
    if leaking:
        raise PushError(f"Refusing to upload: your Hub token appears in {', '.join(leaking)}.")

    api = HfApi()  # endpoint from HF_ENDPOINT, token found by the client
    with step(f"Checking your token on {api.endpoint}", token):
        me = api.whoami()
    namespace = repo_id.split("/")[0]
    writable = [me["name"], *(org["name"] for org in me.get("orgs") or [])]
    if namespace not in writable:
        raise PushError(f"Your token is {me['name']}'s, who cannot write to the namespace {namespace!r} "
                        f"(only to: {', '.join(writable)}).")
    with step(f"Creating or finding the repo {repo_id} on {api.endpoint}", token):
        repo_url = api.create_repo(repo_id, private=True if private else None, exist_ok=True)
        if private and not api.repo_info(repo_id).private:
            raise PushError(f"{repo_id} already exists and is public; --private cannot make it private. "
                            "Change its visibility in the repo settings first, or push without --private.")
        refs = api.list_repo_refs(repo_id)
        if branch in {tag.name for tag in refs.tags}:
            raise PushError(f"--revision {branch!r} is a tag of {repo_id}; commits go to branches.")
        heads = {ref.name: ref.target_commit for ref in refs.branches}
        if branch not in heads:
            api.create_branch(repo_id, branch=branch, revision=heads.get("main"))
            heads[branch] = heads.get("main") or api.repo_info(repo_id, revision=branch).sha
        head = heads[branch]
    with step(f"Listing the files of {repo_id}@{branch}", token):
        remote = {entry.path: entry for entry in api.list_repo_tree(repo_id, revision=head, recursive=True)
                  if isinstance(entry, RepoFile)}

    local = {**files, "README.md": readme}
    changed = [name for name, content in local.items() if not is_unchanged(content, remote.get(name))]
    stale = [name for name in remote if name not in local and any(fnmatch.fnmatch(name, p) for p in UPLOADED)]
    if not changed and not stale:
        print(f"{repo_id}@{branch} already holds these {len(local)} files: no new commit.")
        return f"{repo_url}/commit/{head}"

    print(f"Pushing to {repo_id}@{branch} ({api.endpoint}): {len(changed)} new or changed file(s)"
          + (f", {len(stale)} deleted" if stale else "") + ":")
    for name in changed:
        print(f"  {name}")
    for name in stale:
        print(f"  {name} (deleted)")
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=local[name]) for name in changed]
    operations += [CommitOperationDelete(path_in_repo=name) for name in stale]
    message = commit_message or f"Upload {config.get('architectures', ['model'])[0]} from {model_dir.name}"
    try:
        with step(f"Uploading to {repo_id}@{branch}", token):
            commit = api.create_commit(repo_id, operations=operations, commit_message=message, revision=branch,
                                       parent_commit=head)
    except PushError as error:
        raise PushError(f"{error}\n{after_failure(api, repo_id, branch, head, token)}") from None
    return commit.commit_url


def after_failure(api: HfApi, repo_id: str, branch: str, head: str, token: str) -> str:
    """What a failed commit left behind: the Hub applies a commit whole or not at all; check which."""
    try:
        now = {ref.name: ref.target_commit for ref in api.list_repo_refs(repo_id).branches}.get(branch)
    except Exception as error:
        return redact(f"Could not check the state of {repo_id}@{branch} afterwards: {describe(error)}", token)
    if now == head:
        return f"Nothing was committed: {repo_id}@{branch} is still at {head}."
    return f"{repo_id}@{branch} moved from {head} to {now} meanwhile (another push?)."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="folder written by save_pretrained / scripts/train.py")
    parser.add_argument("--repo_id", required=True, help="NAMESPACE/NAME on the Hub; created if it does not exist")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--revision", default=None, help="branch to commit to (created from main); default main")
    parser.add_argument("--commit_message", default=None, help="default: 'Upload <architecture> from <folder>'")
    args = parser.parse_args(argv)
    try:
        url = push_to_hub(args.model_dir, args.repo_id, private=args.private, revision=args.revision,
                          commit_message=args.commit_message)
    except PushError as error:
        print(f"push_to_hub.py: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # an unforeseen failure: still say what it was, still without the token
        print(redact(f"push_to_hub.py: error: {type(error).__name__}: {describe(error)}", get_token()), file=sys.stderr)
        return 1
    print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
