"""Share a trained model on the Hugging Face Hub, in one commit, with a model card that says what its records say.

`push_to_hub(model_dir, repo_id)` uploads what the model needs to load without this package: the safetensors
weights, `config.json` with its `auto_map`, the code, the generation config and the tokenizer files; with them the
run's records if present (`training_summary.json`, `eval_results.json`, the Trainer's `*_results.json` and
`trainer_state.json`, `train_log.jsonl`, the `*.png` plots), and a README.md rendered by `vaswani.hub.model_card`
from the package's `model_card.md`. Checkpoints, optimizer states and everything else in the folder stay local.

* Everything goes up in ONE `create_commit` (the Hub applies a commit all or nothing), on the branch `revision`,
  created from main if needed. `upload_folder` is not used: with `hf_xet` installed it splits a large folder into
  several commits, and it cannot add the rendered README.
* Files this tool uploads that the folder no longer has are deleted in the same commit; other files of the repo stay.
  The client leaves out the files the branch already holds unchanged, so an unchanged folder makes no commit.
* The token is the one the client finds (`HF_TOKEN`, else the one `hf auth login` stored), the Hub `HF_ENDPOINT`
  (default https://huggingface.co). The token is never printed (messages are redacted), and a folder in which a file
  holds it is refused.
"""

import re
import sys
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import filter_repo_objects

from ..checks import UsageError
from ..configuration import remote_code_files
from .model_card import read_json, render_model_card, tensor_shapes


CODE_FILES = tuple(remote_code_files())
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "vocab-src.json",  # the Moses + BPE tokenizer of converted fairseq models, and its code (auto_map)
    "vocab-tgt.json",
    "tokenization_*.py",
)
RECORD_FILES = (
    "training_summary.json",
    "eval_results.json",
    "train_results.json",
    "all_results.json",
    "trainer_state.json",
    "train_log.jsonl",
    "*.png",
)
# The files of a model folder that go to the Hub (names or glob patterns, at the top of the folder).
UPLOADED = (
    "config.json",
    "generation_config.json",
    *CODE_FILES,
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    *TOKENIZER_FILES,
    *RECORD_FILES,
)
AUTO_MAP_KEYS = ("AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM")


class PushError(UsageError):
    """A push that cannot go on; the message says why and never holds the token."""


# --- The model folder ------------------------------------------------------------------------------------------------


def check_model_dir(model_dir) -> dict:
    """Refuse a folder that is not a vaswani model loadable from the Hub; return its config."""
    model_dir = Path(model_dir)
    shapes = tensor_shapes(model_dir)
    config = read_json(model_dir / "config.json")
    if config is None:
        raise PushError(
            f"{model_dir} is not a saved model: it has no config.json. Save the model with save_pretrained(folder)."
        )
    if config.get("model_type") != "vaswani":
        raise PushError(f"{model_dir} holds a {config.get('model_type')!r} model, not a vaswani model.")
    missing_code = [name for name in CODE_FILES if not (model_dir / name).is_file()]
    auto_map = config.get("auto_map") or {}
    if missing_code or any(key not in auto_map for key in AUTO_MAP_KEYS):
        raise PushError(
            f"{model_dir} was saved without its code (missing: "
            f"{', '.join(missing_code) or 'auto_map in config.json'}), so it would not load without the "
            "vaswani package. Save it again with save_pretrained() of this package."
        )
    embeddings = {name: shape for name, shape in shapes.items() if name.endswith("shared.weight")}
    expected = [config.get("vocab_size"), config.get("d_model")]
    if not embeddings or any(shape != expected for shape in embeddings.values()):
        raise PushError(
            f"The weights in {model_dir} do not fit its config.json: expected shared embeddings of shape "
            f"{expected}, found {embeddings or 'none'}."
        )
    return config


def files_to_upload(model_dir: Path) -> dict[str, Path]:
    """path in the repo -> local file, for the files of the folder this tool shares."""
    names = [path.name for path in sorted(model_dir.iterdir()) if path.is_file()]
    return {name: model_dir / name for name in filter_repo_objects(names, allow_patterns=list(UPLOADED))}


def file_contains(path: Path, needle: bytes, chunk_size: int = 1 << 24) -> bool:
    """Whether `needle` occurs in the file, read in chunks (weights can be large)."""
    with open(path, "rb") as file:
        tail = b""
        while chunk := file.read(chunk_size):
            if needle in tail + chunk:
                return True
            tail = chunk[-(len(needle) - 1) :] if len(needle) > 1 else b""
    return False


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


def push_to_hub(
    model_dir, repo_id: str, private: bool = False, revision: str | None = None, commit_message: str | None = None
) -> str:
    """Upload the model folder to `repo_id` in one commit on branch `revision` (default main); return the commit URL.

    Makes no commit when the branch already holds exactly these files. Raises PushError, token-free, on failure.
    """
    model_dir = Path(model_dir)
    branch = revision or "main"
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", repo_id):
        raise PushError(
            f"--repo_id must be NAMESPACE/NAME (your user or organization, then the model name), got {repo_id!r}."
        )
    if re.fullmatch(r"[0-9a-f]{40}", branch) or branch.startswith("refs/"):
        raise PushError(f"--revision must be a branch name, got {branch!r}.")
    config = check_model_dir(model_dir)
    files = files_to_upload(model_dir)
    readme = render_model_card(model_dir, repo_id).encode("utf-8")
    if not any(name in files for name in ("tokenizer.json", "tokenizer_config.json")):
        print(
            f"Warning: {model_dir} has no tokenizer files; AutoTokenizer and pipeline() will not work from the Hub.",
            file=sys.stderr,
        )

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
        raise PushError(
            f"Your token is {me['name']}'s, who cannot write to the namespace {namespace!r} "
            f"(only to: {', '.join(writable)})."
        )
    with step(f"Creating or finding the repo {repo_id} on {api.endpoint}", token):
        api.create_repo(repo_id, private=True if private else None, exist_ok=True)
        if private and not api.repo_info(repo_id).private:
            raise PushError(
                f"{repo_id} already exists and is public; --private cannot make it private. "
                "Change its visibility in the repo settings first, or push without --private."
            )
        refs = api.list_repo_refs(repo_id)
        if branch in {tag.name for tag in refs.tags}:
            raise PushError(f"--revision {branch!r} is a tag of {repo_id}; commits go to branches.")
        heads = {ref.name: ref.target_commit for ref in refs.branches}
        if branch not in heads:
            api.create_branch(repo_id, branch=branch, revision=heads.get("main"))
            heads[branch] = heads.get("main") or api.repo_info(repo_id, revision=branch).sha
        head = heads[branch]
    with step(f"Listing the files of {repo_id}@{branch}", token):
        remote = api.list_repo_files(repo_id, revision=head)

    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=path) for name, path in files.items()]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=readme))
    stale = [name for name in filter_repo_objects(remote, allow_patterns=list(UPLOADED)) if name not in files]
    operations += [CommitOperationDelete(path_in_repo=name) for name in stale]
    deleting = f"; deleting {', '.join(stale)}" if stale else ""
    print(f"Pushing to {repo_id}@{branch} ({api.endpoint}): {', '.join([*files, 'README.md'])}{deleting}")
    message = commit_message or f"Upload {config.get('architectures', ['model'])[0]} from {model_dir.name}"
    try:
        with step(f"Uploading to {repo_id}@{branch}", token):
            commit = api.create_commit(
                repo_id, operations=operations, commit_message=message, revision=branch, parent_commit=head
            )
    except PushError as error:
        raise PushError(f"{error}\n{after_failure(api, repo_id, branch, head, token)}") from None
    if commit.oid == head:
        print(f"{repo_id}@{branch} already holds these {len(files) + 1} files: no new commit.")
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


def push_after_training(model_dir, repo_id, private=False):
    """push_to_hub at the end of a run: a failure leaves the model safe on disk and says how to push it again."""
    try:
        print(f"pushed to the Hub: {push_to_hub(model_dir, repo_id, private=private)}")
    except PushError as error:
        raise UsageError(
            f"{error}\nThe model is saved in {model_dir}; push it later with: "
            f"vaswani-push-to-hub --model_dir {model_dir} --repo_id {repo_id}"
        ) from error
