"""The attention explorer as a Hub Space beside a model repository: `push_space(space_id, model_repo)`.

The Space is a Gradio app that runs without the vaswani package: its `app.py` serves `model_repo` with the explorer's
own folder (`vaswani.inspection`'s `app.py`, `maps.py`, `figures.py`, which import nothing of the package, uploaded as
`explorer/`), and the model runs the code saved with it (`trust_remote_code`). `requirements.txt` pins the versions
of torch, transformers and matplotlib installed here, and the README's front matter the Gradio version (`sdk_version`),
so that the Space runs what was tested here. Everything goes up in one commit, as `push_to_hub` pushes a model.
"""

import importlib.metadata
import importlib.resources
import json
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, get_token

from .push import PushError, step


EXPLORER_FILES = ("__init__.py", "maps.py", "figures.py", "app.py")
"""The files of vaswani.inspection the Space runs, as its `explorer/` folder."""

PINNED = ("torch", "transformers", "tokenizers", "safetensors", "matplotlib", "sacremoses")
"""What the Space installs besides Gradio, at the versions installed here; sacremoses tokenizes converted fairseq
models."""

APP = '''"""The attention explorer of {model_repo}, a vaswani model ("Attention Is All You Need")."""

from explorer.app import Explorer, build_app


build_app(Explorer("{model_repo}")).launch()
'''

README = """---
title: {title}
emoji: 🔍
colorFrom: indigo
colorTo: gray
sdk: gradio
sdk_version: {gradio}
app_file: app.py
pinned: false
models:
- {model_repo}
---

# The attention explorer of [{model_repo}](https://huggingface.co/{model_repo})

Translate a sentence with the paper's decoding, and look inside: the n-best list with its scores, every layer and head
of the encoder self-attention, the decoder self-attention and the encoder-decoder attention, the alignment, the
positional encoding, and the beam search step by step.
"""


def release(name: str) -> str:
    """The installed version of `name`, without a local build tag (torch's "+cpu"): what PyPI serves."""
    return importlib.metadata.version(name).split("+")[0]


def space_files(model_repo: str) -> dict[str, bytes]:
    """The files of the Space that serves `model_repo`: path in the Space -> content."""
    explorer = importlib.resources.files("vaswani.inspection")
    files = {f"explorer/{name}": explorer.joinpath(name).read_bytes() for name in EXPLORER_FILES}
    files["app.py"] = APP.format(model_repo=model_repo).encode()
    files["requirements.txt"] = "".join(f"{name}=={release(name)}\n" for name in PINNED).encode()
    title = f"{model_repo.split('/')[-1]} attention explorer"
    files["README.md"] = README.format(title=title, gradio=release("gradio"), model_repo=model_repo).encode()
    return files


def push_space(space_id: str, model_repo: str, private: bool = False) -> str:
    """Create or update the Space `space_id` serving the vaswani model repository `model_repo`, in one commit;
    return the commit URL. Raises PushError, token-free, where the model is not a vaswani model on the Hub or the
    push fails."""
    token = get_token()
    if not token:
        raise PushError("No Hugging Face token: set HF_TOKEN, or log in once with `hf auth login`.")
    api = HfApi()  # endpoint from HF_ENDPOINT, token found by the client
    with step(f"Reading the config of the model {model_repo} on {api.endpoint}", token):
        config = json.loads(Path(api.hf_hub_download(model_repo, "config.json")).read_text(encoding="utf-8"))
    if config.get("model_type") != "vaswani":
        raise PushError(f"{model_repo} holds a model of type {config.get('model_type')!r}, not a vaswani model.")
    with step(f"Creating or finding the Space {space_id} on {api.endpoint}", token):
        api.create_repo(space_id, repo_type="space", space_sdk="gradio", private=private or None, exist_ok=True)
    operations = [
        CommitOperationAdd(path_in_repo=path, path_or_fileobj=data) for path, data in space_files(model_repo).items()
    ]
    with step(f"Uploading the Space {space_id}", token):
        commit = api.create_commit(
            space_id,
            repo_type="space",
            operations=operations,
            commit_message=f"The attention explorer of {model_repo}",
        )
    return commit.commit_url
