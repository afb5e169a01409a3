"""Sharing through the Hub: the push_to_hub command (vaswani.hub.push) uploads a saved model to a local stand-in
of the Hub (tests/hub_server.py), and the real `huggingface_hub` and `transformers` clients load it back from there, in
fresh processes, with and without this package installed.

The pushes of this module build one repo, `alice/vaswani-tiny`:
    main      the model v1 (seed 0) with its tokenizer, records and a plot; tag v1.0 points at that commit
    v2        a branch holding the model v2 (seed 1), pushed without the plot and the evaluation record
and a few others on the side (private, pushed after `hf auth login`, re-shared with transformers' push_to_hub).
All client work runs in subprocesses or through `HfApi(endpoint=hub.url)`: the clients read HF_ENDPOINT at import.
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from http.client import HTTPConnection
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch
from helpers import VOCAB_SIZE, run_command, script_command, tiny_model_config, word_tokenizer
from hub_server import HubServer
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from huggingface_hub.utils.sha import git_hash
from transformers import PreTrainedTokenizerFast

from vaswani import VaswaniForConditionalGeneration
from vaswani.checks import UsageError
from vaswani.hub.model_card import render_model_card
from vaswani.hub.push import PushError, check_model_dir, push_to_hub, step


ALICE_TOKEN = "hf_aliceSecretToken0123456789"
BOB_TOKEN = "hf_bobSecretToken9876543210"
REPO = "alice/vaswani-tiny"
TEXTS = ["w5 w17 w33 w60 w7", "w8 w9"]
DECODER_INPUT_IDS = torch.tensor([[1, 5, 6, 7], [1, 9, 10, 11]])
TRAINING_SUMMARY = {
    "preset": "tiny",
    "steps": 120,
    "final_val_loss": 3.2109,
    "final_val_bleu": None,
    "args": {"lr": 0.0007, "warmup_steps": 4000},
}
EVAL_RESULTS = {"eval_loss": 3.25, "eval_bleu": 12.3456, "epoch": 2.0}
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))  # binary: the Hub stores it with LFS


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the model's 100 ids: <pad>=0, <s>=1, </s>=2, <unk>=3, then "w4" ... "w99";
    like the project's BPE tokenizer, it appends </s> to every sequence (that one cannot be used here: its 256 byte
    tokens alone do not fit the tiny model's vocabulary)."""
    words = [f"w{i}" for i in range(4, VOCAB_SIZE)]
    return word_tokenizer(words=words, decoder=False, pair=True, model_input_names=["input_ids", "attention_mask"])


def seeded_model(seed: int) -> VaswaniForConditionalGeneration:
    """The conftest's tiny model (module-scoped fixtures cannot use its function-scoped fixture), seeded."""
    config = tiny_model_config()
    torch.manual_seed(seed)
    return VaswaniForConditionalGeneration(config).eval()


def save_model_folder(folder: Path, model, records: bool = True) -> Path:
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    (folder / "training_summary.json").write_text(json.dumps(TRAINING_SUMMARY))
    if records:
        (folder / "eval_results.json").write_text(json.dumps(EVAL_RESULTS))
        (folder / "training_curves.png").write_bytes(PNG)
    (folder / "optimizer.pt").write_bytes(b"\0" * 64)  # training leftovers that must stay local
    (folder / "checkpoint-100").mkdir()
    return folder


def run_push(hub, home, folder, repo=REPO, *options, token=ALICE_TOKEN) -> subprocess.CompletedProcess:
    command = script_command("push_to_hub", "--model_dir", folder, "--repo_id", repo, *options)
    return run_command(command, env=hub.client_env(home, token))


def pushed_by_script(command, hub, api, home, repo) -> tuple[str, set[str]]:
    """Run a script that pushes `repo` to the Hub as alice: its output (which must not show her token) and the files
    of the repo."""
    done = run_command(
        command, env={**hub.client_env(home, ALICE_TOKEN), "OMP_NUM_THREADS": "1"}, timeout=600, check=True
    )
    assert ALICE_TOKEN not in done.stdout + done.stderr
    return done.stdout + done.stderr, {entry.path for entry in api.list_repo_tree(repo, recursive=True)}


@pytest.fixture(scope="module")
def hub():
    with HubServer(users={"alice": ALICE_TOKEN, "bob": BOB_TOKEN}) as server:
        yield server


@pytest.fixture(scope="module")
def api(hub) -> HfApi:
    return HfApi(endpoint=hub.url, token=ALICE_TOKEN)


def heads(api: HfApi, repo: str = REPO) -> dict[str, str]:
    """branch -> commit"""
    return {ref.name: ref.target_commit for ref in api.list_repo_refs(repo).branches}


@dataclass
class Published:
    v1: VaswaniForConditionalGeneration
    v2: VaswaniForConditionalGeneration
    v1_dir: Path
    v2_dir: Path
    v1_commit: str
    v2_commit: str
    pushes: list  # every push of the module: their output must never show the token


@pytest.fixture(scope="module")
def published(hub, api, tmp_path_factory) -> Published:
    base = tmp_path_factory.mktemp("published")
    v1, v2 = seeded_model(seed=0), seeded_model(seed=1)
    v1_dir = save_model_folder(base / "v1", v1)
    v2_dir = save_model_folder(base / "v2", v2, records=False)
    first = run_push(hub, base / "home", v1_dir)
    assert first.returncode == 0, first.stderr
    second = run_push(hub, base / "home", v2_dir, REPO, "--revision", "v2", "--commit_message", "Model v2")
    assert second.returncode == 0, second.stderr
    commits = heads(api)
    api.create_tag(REPO, tag="v1.0", revision=commits["main"])
    return Published(v1, v2, v1_dir, v2_dir, commits["main"], commits["v2"], [first, second])


# --- What the push puts on the Hub ---------------------------------------------------------------------------------


def test_push_makes_one_commit_with_weights_code_tokenizer_records_and_card(hub, api, published):
    commits = api.list_repo_commits(REPO)
    assert [commit.title for commit in commits] == ["Upload VaswaniForConditionalGeneration from v1", "initial commit"]
    assert commits[0].commit_id == published.v1_commit
    assert published.pushes[0].stdout.strip().splitlines()[-1] == f"{hub.url}/{REPO}/commit/{published.v1_commit}"

    files = {entry.path: entry for entry in api.list_repo_tree(REPO, recursive=True)}
    assert set(files) == {
        ".gitattributes",
        "README.md",
        "config.json",
        "generation_config.json",
        "configuration_vaswani.py",
        "generation_vaswani.py",
        "decoding_kernels.py",
        "modeling_vaswani.py",
        "pipeline_vaswani.py",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "training_summary.json",
        "eval_results.json",
        "training_curves.png",
    }  # not optimizer.pt, not the checkpoint folder
    assert files["model.safetensors"].lfs is not None and files["training_curves.png"].lfs is not None
    assert files["config.json"].lfs is None and files["modeling_vaswani.py"].lfs is None
    weights = (published.v1_dir / "model.safetensors").read_bytes()
    assert files["model.safetensors"].lfs.sha256 == hashlib.sha256(weights).hexdigest()
    assert files["config.json"].blob_id == git_hash((published.v1_dir / "config.json").read_bytes())


def test_a_changed_folder_commits_its_changes_only_and_deletes_what_it_no_longer_has(api, published):
    v1 = {entry.path: entry.blob_id for entry in api.list_repo_tree(REPO, revision="v1.0", recursive=True)}
    v2 = {entry.path: entry.blob_id for entry in api.list_repo_tree(REPO, revision="v2", recursive=True)}
    assert api.list_repo_commits(REPO, revision="v2")[0].title == "Model v2"
    assert set(v1) - set(v2) == {"eval_results.json", "training_curves.png"}  # no longer in the v2 folder
    changed = {path for path in v2 if v2[path] != v1.get(path)}
    assert changed - {"README.md"} == {"model.safetensors"}
    cards = [render_model_card(folder, REPO) for folder in (published.v1_dir, published.v2_dir)]
    assert ("README.md" in changed) == (cards[0] != cards[1])  # e.g. the evaluation is now "not measured"


def test_pushing_the_same_folder_again_makes_no_commit(hub, api, published, tmp_path):
    before = heads(api)
    again = run_push(hub, tmp_path / "home", published.v1_dir)
    published.pushes.append(again)
    assert again.returncode == 0, again.stderr
    assert "no new commit" in again.stdout
    assert again.stdout.strip().splitlines()[-1] == f"{hub.url}/{REPO}/commit/{published.v1_commit}"
    assert heads(api) == before
    assert len(api.list_repo_commits(REPO)) == 2


def test_model_card_is_rendered_from_the_records_without_invented_numbers(tmp_path):
    folder = save_model_folder(tmp_path / "model", seeded_model(seed=0))
    (folder / "eval_results.json").unlink()
    template = tmp_path / "model_card.md"
    template.write_text(
        "---\n{{ card_data }}\n---\n# {{ model_name }} ({{repo_id}})\n"
        "d_model={{ config.d_model }} params={{ parameters }}\n"
        "loss={{ training.final_val_loss }} bleu={{ training.final_val_bleu }} "
        "lr={{ training.args.lr }} eval={{ eval.eval_bleu }} other={{ training.missing_key }}\n"
        "{{ eval_table }}\n{{ training_table }}\n{{ plots }}\n"
    )
    card = ModelCard(render_model_card(folder, "alice/x", template_path=template))
    params = sum(p.numel() for p in seeded_model(seed=0).parameters())
    assert card.text.startswith(f"# x (alice/x)\nd_model=64 params={params:,}\n")
    # measured values as recorded; a null, a missing key and a missing file all read "not measured"
    assert "loss=3.211 bleu=not measured lr=0.0007 eval=not measured other=not measured\n" in card.text
    assert "Not measured: the model folder has no eval_results.json." in card.text
    assert "| args.warmup_steps | 4000 |" in card.text and "| final_val_bleu | not measured |" in card.text
    assert "![training_curves](training_curves.png)" in card.text
    # no languages in the records, no BLEU score measured: no languages, metrics or model-index in the metadata
    assert card.data.to_dict() == {
        "library_name": "transformers",
        "license": "apache-2.0",
        "pipeline_tag": "translation",
        "tags": ["vaswani", "transformer", "translation", "attention-is-all-you-need"],
    }

    # A config field an older save did not record reads as not measured; an unknown placeholder is an error.
    template.write_text("{{ config.no_such_field }}")
    assert ModelCard(render_model_card(folder, "alice/x", template_path=template)).text == "not measured"
    template.write_text("{{ eval.eval_bleu }} {{ no_such_value }}")
    with pytest.raises(UsageError, match="unknown placeholder {{ no_such_value }}"):
        render_model_card(folder, "alice/x", template_path=template)


def run_records(**changes) -> dict:
    """training_summary.json of a run of the training command, with `changes` to its arguments."""
    args = {
        "dataset_dir": "/data/wmt14-de-en",
        "source_lang": "de",
        "target_lang": "en",
        "lr_schedule": "paper",
        "warmup_steps": 4000,
        "lr_scale": 1.0,
        "peak_lr": 0.001,
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "adam_epsilon": 1e-9,
        "label_smoothing_factor": 0.1,
        "generation_num_beams": 1,
        "eval_length_penalty": 0.6,
    }
    return {
        "steps": 100000,
        "epochs": 19.3,
        "tokens_seen": 1189190000,
        "tokens_per_step": 11891.9,
        "train_seconds": 43210.5,
        "train_pairs": 4500966,
        "final_val_loss": 1.91,
        "final_val_bleu": 25.41,
        "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1",
        "bleu_samples": 500,
        "averaged_checkpoints": ["step_0099000", "step_0100000"],
        "args": {**args, **changes},
    }


def card_for(folder: Path, training: dict, evaluation: dict | None = None) -> ModelCard:
    (folder / "training_summary.json").write_text(json.dumps(training))
    if evaluation is not None:
        (folder / "eval_results.json").write_text(json.dumps(evaluation))
    return ModelCard(render_model_card(folder, "alice/x"))


def prose(card: ModelCard) -> str:
    """The card's text with its lines joined, as Markdown reads it."""
    return " ".join(card.text.split())


def test_model_card_describes_the_schedule_the_run_used(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    paper = prose(card_for(tmp_path, run_records()))
    assert "a short run" not in paper and "--lr_schedule short" not in paper
    assert (
        "the paper's learning rate (equation 3), d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) with "
        "d_model = 64 and warmup_steps = 4000: a linear rise to 0.001976 at step 4000"
    ) in paper
    scaled = prose(card_for(tmp_path, run_records(lr_scale=2.0)))
    assert "warmup_steps = 4000, times 2 (`--lr_scale`): a linear rise to 0.003953 at step 4000" in scaled
    short = prose(card_for(tmp_path, run_records(lr_schedule="short", warmup_steps=150)))
    assert (
        "the shape of the paper's learning rate scaled to peak at 0.001 (`--lr_schedule short`, meant for runs "
        "of a few hundred steps): a linear rise over the first 150 steps"
    ) in short
    assert "equation 3" not in short
    unrecorded = prose(card_for(tmp_path, run_records(lr_schedule=None)))
    assert "a learning-rate schedule that was not measured" in unrecorded


def test_model_card_prints_counts_as_whole_numbers(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    card = prose(card_for(tmp_path, run_records()))
    assert "11,891.9" not in card
    assert "Batches of about 11,892 source + target tokens per step; 100,000 steps" in card
    assert "training took 43,210 s" in card


def test_model_card_says_only_what_the_records_hold(tiny_model, tmp_path):
    """A big German-English run with a test score: the card names its languages, its dataset folder and its scores,
    and claims nothing of the default corpus or of a small, short run."""
    tiny_model.save_pretrained(tmp_path)
    evaluation = {
        "test": {
            "bleu": 27.3,
            "tokenized_bleu": 28.4,
            "chrf": 55.1,
            "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.5.1",
            "sentences": 3003,
            "num_beams": 4,
            "length_penalty": 0.6,
            "paper_decoding": True,
            "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1",
        }
    }
    card = card_for(tmp_path, run_records(), evaluation)
    assert card.data.language == ["de", "en"] and card.data.metrics == ["bleu", "chrf"] and card.data.datasets is None
    assert [
        (result.task_type, result.dataset_type, result.dataset_split, result.metric_type, result.metric_value)
        for result in card.data.eval_results
    ] == [("translation", "wmt14-de-en", "test", "bleu", 27.3), ("translation", "wmt14-de-en", "test", "chrf", 55.1)]
    assert [result.metric_name for result in card.data.eval_results] == [
        "BLEU (sacreBLEU, beam 4)",
        "chrF (sacreBLEU, beam 4)",
    ]
    assert "trained from scratch with the `vaswani` package to translate from `de` into `en`" in prose(card)
    assert "4,500,966 sentence pairs of the dataset folder `wmt14-de-en`, from `de` into `en`" in prose(card)
    assert (
        "| test | 27.3 | 28.4 | 55.1 | 3003 | beam 4, GNMT length penalty 0.6 | "
        "nrefs:1\\|case:mixed\\|eff:no\\|tok:13a\\|smooth:exp\\|version:2.5.1 |"
    ) in card.text
    assert (
        "| validation, at the end of training | 25.41 | not measured | not measured | 500 | beam 1, length penalty 0.6 |"
        in card.text
    )
    for claim in ("English into Spanish", "minutes", "small model", "biblical English", "sword-text-web"):
        assert claim not in prose(card), claim
    # An evaluation recorded before chrF was: its BLEU alone, chrF not measured.
    del evaluation["test"]["chrf"]
    card = card_for(tmp_path, run_records(), evaluation)
    assert card.data.metrics == ["bleu"] and [result.metric_type for result in card.data.eval_results] == ["bleu"]
    assert "| test | 27.3 | 28.4 | not measured | 3003 |" in card.text

    # A fine-tuned folder (the Trainer's flat eval_results.json, no training_summary.json) has no training to tell.
    (tmp_path / "training_summary.json").unlink()
    (tmp_path / "eval_results.json").write_text(json.dumps({"eval_loss": 2.5, "eval_bleu": 30.1}))
    card = ModelCard(render_model_card(tmp_path, "alice/x"))
    assert "its training is not recorded here" in prose(card) and "trained from scratch" not in prose(card)
    assert "| eval_bleu | 30.1 |" in card.text and card.data.eval_results is None


def test_the_model_card_template_ships_with_the_package():
    template = resources.files("vaswani") / "model_card.md"
    assert template.is_file() and "{{ card_data }}" in template.read_text()


def test_model_card_on_the_hub_shows_the_pushed_records(api, published, tmp_path):
    readme = Path(api.hf_hub_download(REPO, "README.md", cache_dir=tmp_path)).read_text()
    assert readme == render_model_card(published.v1_dir, REPO)
    assert "| eval_bleu | 12.35 |" in readme and "| final_val_bleu | not measured |" in readme


# --- Loading from the Hub --------------------------------------------------------------------------------------------

LOAD_FROM_THE_HUB = textwrap.dedent(
    """
    import json, os, sys
    sys.modules["vaswani"] = None  # first, this process must not find the package
    import torch
    from transformers import AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    repo, revisions, texts, out = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    decoder_input_ids = torch.tensor(json.loads(sys.argv[5]))
    result = {}
    tokenizer = AutoTokenizer.from_pretrained(repo)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    result["input_ids"], result["attention_mask"] = batch["input_ids"], batch["attention_mask"]
    model = AutoModelForSeq2SeqLM.from_pretrained(repo, trust_remote_code=True).eval()
    result["class"] = f"{type(model).__module__}.{type(model).__name__}"
    with torch.no_grad():
        result["logits"] = model(**batch, decoder_input_ids=decoder_input_ids).logits
        result["generated"] = model.generate(**batch, max_new_tokens=8)
        bare = AutoModel.from_pretrained(repo, trust_remote_code=True).eval()
        result["bare_class"] = f"{type(bare).__module__}.{type(bare).__name__}"
        result["bare_states"] = bare(**batch, decoder_input_ids=decoder_input_ids).last_hidden_state
        result["logits_at"] = {}
        for revision in revisions:
            at = AutoModelForSeq2SeqLM.from_pretrained(repo, revision=revision, trust_remote_code=True).eval()
            result["logits_at"][revision] = at(**batch, decoder_input_ids=decoder_input_ids).logits
    # transformers 5 has no built-in translation pipeline: the repo's config declares the one in pipeline_vaswani.py.
    translator = pipeline("translation", model=repo, trust_remote_code=True)
    result["pipeline"] = [translator(text, max_new_tokens=8)[0]["translation_text"] for text in texts]
    result["pipeline_batch"] = [out["translation_text"] for out in translator(list(texts), max_new_tokens=8)]

    # transformers' own push_to_hub shares the remotely loaded model again, code included, and it loads back.
    copy = repo + "-reshared"
    model.push_to_hub(copy, token=os.environ["TEST_PUSH_TOKEN"])
    tokenizer.push_to_hub(copy, token=os.environ["TEST_PUSH_TOKEN"])
    reshared = AutoModelForSeq2SeqLM.from_pretrained(copy, trust_remote_code=True).eval()
    with torch.no_grad():
        result["reshared_logits"] = reshared(**batch, decoder_input_ids=decoder_input_ids).logits
    result["reshared_input_ids"] = AutoTokenizer.from_pretrained(copy)(texts, padding=True)["input_ids"]

    # Then with the package installed: its registered classes load the repo, no trust_remote_code needed.
    del sys.modules["vaswani"]
    import vaswani
    installed = AutoModelForSeq2SeqLM.from_pretrained(repo).eval()
    result["installed_class"] = f"{type(installed).__module__}.{type(installed).__name__}"
    result["installed_is_the_package_class"] = type(installed) is vaswani.VaswaniForConditionalGeneration
    with torch.no_grad():
        result["installed_logits"] = installed(**batch, decoder_input_ids=decoder_input_ids).logits
    torch.save(result, out)
    """
)


@pytest.fixture(scope="module")
def loaded_remotely(hub, published, tmp_path_factory) -> dict:
    """What a fresh process gets from the Hub, first without the vaswani package, then with it (one process for all
    the loading checks: starting one costs seconds)."""
    work = tmp_path_factory.mktemp("remote")
    revisions = ["main", "v2", "v1.0", published.v1_commit, published.v2_commit]
    command = [
        sys.executable,
        "-c",
        LOAD_FROM_THE_HUB,
        REPO,
        json.dumps(revisions),
        json.dumps(TEXTS),
        str(work / "out.pt"),
        json.dumps(DECODER_INPUT_IDS.tolist()),
    ]
    env = {**hub.client_env(work / "home"), "TEST_PUSH_TOKEN": ALICE_TOKEN}  # loads are anonymous
    loaded = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    return torch.load(work / "out.pt")


def local_logits(model, loaded) -> torch.Tensor:
    with torch.no_grad():
        return model(
            input_ids=loaded["input_ids"], attention_mask=loaded["attention_mask"], decoder_input_ids=DECODER_INPUT_IDS
        ).logits


def test_fresh_process_without_the_package_loads_tokenizer_and_model_from_the_hub(published, loaded_remotely):
    local = tiny_tokenizer()(TEXTS, return_tensors="pt", padding=True)
    assert torch.equal(loaded_remotely["input_ids"], local["input_ids"])
    assert loaded_remotely["input_ids"][0, -1] == 2  # </s> appended
    assert loaded_remotely["class"].startswith("transformers_modules.")
    assert loaded_remotely["class"].endswith(".VaswaniForConditionalGeneration")
    assert torch.equal(loaded_remotely["logits"], local_logits(published.v1, loaded_remotely))
    with torch.no_grad():
        generated = published.v1.generate(**local, max_new_tokens=8)
        bare_states = published.v1.model(**local, decoder_input_ids=DECODER_INPUT_IDS).last_hidden_state
    assert torch.equal(loaded_remotely["generated"], generated)
    assert loaded_remotely["bare_class"].endswith(".VaswaniModel")
    assert torch.equal(loaded_remotely["bare_states"], bare_states)


def test_each_revision_loads_its_own_weights(published, loaded_remotely):
    v1, v2 = local_logits(published.v1, loaded_remotely), local_logits(published.v2, loaded_remotely)
    assert not torch.equal(v1, v2)
    logits_at = loaded_remotely["logits_at"]
    for revision in ("main", "v1.0", published.v1_commit):
        assert torch.equal(logits_at[revision], v1), revision
    for revision in ("v2", published.v2_commit):
        assert torch.equal(logits_at[revision], v2), revision


def test_transformers_push_to_hub_reshares_the_remotely_loaded_model(published, loaded_remotely):
    assert torch.equal(loaded_remotely["reshared_logits"], local_logits(published.v1, loaded_remotely))
    assert loaded_remotely["reshared_input_ids"] == loaded_remotely["input_ids"].tolist()


def test_translation_pipeline_gives_the_local_models_translations(published, loaded_remotely):
    tokenizer = tiny_tokenizer()
    with torch.no_grad():
        expected = [
            tokenizer.decode(
                published.v1.generate(**tokenizer([text], return_tensors="pt"), max_new_tokens=8)[0],
                skip_special_tokens=True,
            )
            for text in TEXTS
        ]
    assert loaded_remotely["pipeline"] == expected
    assert loaded_remotely["pipeline_batch"] == expected


def test_installed_package_loads_without_trust_remote_code(published, loaded_remotely):
    assert loaded_remotely["installed_is_the_package_class"], loaded_remotely["installed_class"]
    assert torch.equal(loaded_remotely["installed_logits"], local_logits(published.v1, loaded_remotely))


# --- Tokens and failures ---------------------------------------------------------------------------------------------


def test_wrong_token_fails_clearly_without_printing_it(hub, api, published, tmp_path):
    before = heads(api)
    wrong = "hf_wrongSecretToken5555555555"
    push = run_push(hub, tmp_path / "home", published.v2_dir, token=wrong)
    assert push.returncode == 1
    assert "Checking your token" in push.stderr and "Invalid user token" in push.stderr, push.stderr
    assert "Check your token: HF_TOKEN, or the one stored by `hf auth login`" in push.stderr
    assert "Traceback" not in push.stderr
    assert wrong not in push.stdout + push.stderr
    assert heads(api) == before


def test_another_users_token_cannot_push(hub, api, published, tmp_path):
    before = heads(api)
    push = run_push(hub, tmp_path / "home", published.v1_dir, token=BOB_TOKEN)  # even the unchanged folder
    assert push.returncode == 1
    assert "Your token is bob's, who cannot write to the namespace 'alice'" in push.stderr, push.stderr
    assert BOB_TOKEN not in push.stdout + push.stderr
    assert heads(api) == before


def test_failed_upload_leaves_no_commit_and_says_what_failed(hub, api, published, tmp_path):
    folder = save_model_folder(tmp_path / "v3", seeded_model(seed=3))
    before = heads(api)
    hub.hub.reject_uploads = True  # the storage refuses the weights
    try:
        push = run_push(hub, tmp_path / "home", folder)
    finally:
        hub.hub.reject_uploads = False
    published.pushes.append(push)
    assert push.returncode == 1
    assert "Error while uploading 'model.safetensors'" in push.stderr and "403" in push.stderr, push.stderr
    assert f"Nothing was committed: {REPO}@main is still at {published.v1_commit}." in push.stderr
    assert heads(api) == before


def test_a_folder_holding_the_token_is_refused(hub, api, published, tmp_path):
    folder = save_model_folder(tmp_path / "leaky", seeded_model(seed=0))
    summary = json.loads((folder / "training_summary.json").read_text())
    (folder / "training_summary.json").write_text(json.dumps({**summary, "hub_token": ALICE_TOKEN}))
    push = run_push(hub, tmp_path / "home", folder)
    assert push.returncode == 1
    assert "your Hub token appears in training_summary.json" in push.stderr
    assert ALICE_TOKEN not in push.stdout + push.stderr


def test_errors_are_redacted():
    token = "hf_redactMe000"
    with pytest.raises(PushError) as raised, step("Talking to the Hub", token):
        try:
            raise ConnectionError(f"proxy refused Authorization: Bearer {token}")
        except ConnectionError as error:
            raise RuntimeError("Error while uploading 'model.safetensors' to the Hub.") from error
    message = str(raised.value)
    assert token not in message
    assert message == (
        "Talking to the Hub failed: RuntimeError: Error while uploading 'model.safetensors' to the Hub."
        "\n  caused by: ConnectionError: proxy refused Authorization: Bearer <token>"
    )


def test_the_token_is_in_no_output_and_no_file_on_the_hub(hub, api, published, tmp_path):
    for push in published.pushes:
        assert ALICE_TOKEN not in push.stdout + push.stderr
    for revision in ("main", "v2"):
        snapshot = Path(api.snapshot_download(REPO, revision=revision, cache_dir=tmp_path))
        files = [path for path in snapshot.rglob("*") if path.is_file()]
        assert len(files) >= 10
        for path in files:
            assert ALICE_TOKEN.encode() not in path.read_bytes(), path


@pytest.mark.slow  # a push and three client processes
def test_private_repo_is_hidden_from_others(hub, published, tmp_path):
    push = run_push(hub, tmp_path / "home", published.v1_dir, "alice/private-tiny", "--private")
    assert push.returncode == 0, push.stderr
    assert HfApi(endpoint=hub.url, token=ALICE_TOKEN).model_info("alice/private-tiny").private is True
    for token in (False, BOB_TOKEN):  # anonymous, then another user
        with pytest.raises(RepositoryNotFoundError):
            HfApi(endpoint=hub.url, token=token).hf_hub_download(
                "alice/private-tiny", "config.json", cache_dir=tmp_path / "cache"
            )
    # --private on an existing public repo is refused rather than silently ignored
    push = run_push(hub, tmp_path / "home", published.v1_dir, REPO, "--private")
    assert push.returncode == 1 and "already exists and is public" in push.stderr


def test_token_stored_by_hf_auth_login_is_used(hub, published, tmp_path):
    home = tmp_path / "home"
    login = subprocess.run(
        [sys.executable, "-m", "huggingface_hub.cli.hf", "auth", "login", "--token", ALICE_TOKEN],
        env=hub.client_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert login.returncode == 0, login.stderr
    push = run_push(hub, home, published.v1_dir, "alice/login-tiny", token=None)
    assert push.returncode == 0, push.stderr
    assert ALICE_TOKEN not in push.stdout + push.stderr
    assert len(HfApi(endpoint=hub.url, token=ALICE_TOKEN).list_repo_commits("alice/login-tiny")) == 2


def test_refuses_a_folder_that_is_not_a_vaswani_model(tiny_model, tmp_path):
    def refused(folder, match):
        with pytest.raises(UsageError, match=match):  # PushError, or the shared checks' UsageError
            check_model_dir(folder)

    assert issubclass(PushError, UsageError)  # one exception type for what the user must fix
    refused(tmp_path / "nowhere", "does not exist")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", "has no model.safetensors")
    folder = tmp_path / "model"
    tiny_model.save_pretrained(folder)
    check_model_dir(folder)  # the real thing passes
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    refused(folder, "model.safetensors is not a safetensors file")
    (folder / "model.safetensors").unlink()
    refused(folder, "has no model.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    refused(folder, "missing weight shards listed in model.safetensors.index.json: model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").unlink()
    (folder / "model.safetensors").write_bytes(weights)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 200}))
    refused(folder, r"do not fit its config.json: expected shared embeddings of shape \[200, 64\]")
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bart"}))
    refused(folder, "holds a 'bart' model, not a vaswani model")
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_vaswani.py").unlink()
    refused(folder, "saved without its code")
    (folder / "config.json").unlink()
    refused(folder, "it has no config.json")

    command = script_command("push_to_hub", "--model_dir", folder, "--repo_id", REPO)
    push = run_command(command, env={**os.environ, "HF_TOKEN": ALICE_TOKEN}, timeout=120)
    assert push.returncode == 1 and "Traceback" not in push.stderr
    assert push.stderr.startswith("push_to_hub.py: error: ") and "it has no config.json" in push.stderr


def test_revision_must_be_a_branch(hub, api, published, tmp_path):
    with pytest.raises(PushError, match="--revision must be a branch name"):
        push_to_hub(published.v1_dir, REPO, revision=published.v1_commit)
    before = heads(api)
    push = run_push(hub, tmp_path / "home", published.v1_dir, REPO, "--revision", "v1.0")
    assert push.returncode == 1 and "--revision 'v1.0' is a tag of alice/vaswani-tiny" in push.stderr, push.stderr
    assert heads(api) == before


# --- The server speaks like the Hub ----------------------------------------------------------------------------------


def request(url: str, method: str = "HEAD", headers: dict | None = None):
    parts = urlsplit(url)
    connection = HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request(method, f"{parts.path}?{parts.query}" if parts.query else parts.path, headers=headers or {})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response, body


def test_lfs_files_resolve_to_signed_storage_urls_that_refuse_credentials(hub, published):
    weights = published.v1_dir / "model.safetensors"
    sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()
    response, _ = request(f"{hub.url}/{REPO}/resolve/v1.0/model.safetensors")
    assert response.status == 302
    assert response.getheader("X-Repo-Commit") == published.v1_commit
    assert response.getheader("X-Linked-Etag") == f'"{sha256}"'
    assert response.getheader("X-Linked-Size") == str(weights.stat().st_size)
    location = response.getheader("Location")
    assert location.startswith(hub.storage_url)
    response, body = request(location, "GET")
    assert response.status == 200 and body == weights.read_bytes()
    response, _ = request(location, "GET", {"Authorization": f"Bearer {ALICE_TOKEN}"})
    assert response.status == 400
    response, _ = request(location.replace("signature=", "signature=0"), "GET")
    assert response.status == 403

    config = (published.v1_dir / "config.json").read_bytes()
    response, body = request(f"{hub.url}/{REPO}/resolve/{published.v1_commit}/config.json", "GET")
    assert response.status == 200 and body == config
    assert response.getheader("ETag") == f'"{git_hash(config)}"'
    assert response.getheader("X-Repo-Commit") == published.v1_commit
    response, _ = request(f"{hub.url}/{REPO}/resolve/main/config.json", headers={"Authorization": "Bearer hf_nope"})
    assert response.status == 401
    response, _ = request(f"{hub.url}/{REPO}/resolve/main/nothing.txt")
    assert response.status == 404 and response.getheader("X-Error-Code") == "EntryNotFound"
    response, _ = request(f"{hub.url}/{REPO}/resolve/no-such-branch/config.json")
    assert response.status == 404 and response.getheader("X-Error-Code") == "RevisionNotFound"


def test_a_commit_whose_parent_is_no_longer_the_head_is_refused(api, published):
    before = heads(api)
    with pytest.raises(HfHubHTTPError) as refused:  # v2 is at the v2 commit, not at v1's
        api.upload_file(
            path_or_fileobj=b"late",
            path_in_repo="notes.txt",
            repo_id=REPO,
            revision="v2",
            parent_commit=published.v1_commit,
        )
    assert refused.value.response.status_code == 412
    assert heads(api) == before


def test_files_that_gitignore_lists_are_left_out_of_commits(api):
    """The preupload endpoint answers `shouldIgnore` from the repo's .gitignore, or from the one the commit adds."""
    repo = "alice/ignoring"
    api.create_repo(repo)
    api.upload_file(path_or_fileobj=b"*.log\n!keep.log\nlogs/\n/top.txt\n", path_in_repo=".gitignore", repo_id=repo)
    names = ("a.txt", "run.log", "sub/run.log", "keep.log", "logs/b.txt", "top.txt", "sub/top.txt")
    api.create_commit(
        repo, operations=[CommitOperationAdd(name, name.encode()) for name in names], commit_message="files"
    )
    assert set(api.list_repo_files(repo)) == {".gitattributes", ".gitignore", "a.txt", "keep.log", "sub/top.txt"}
    api.create_commit(
        repo,
        operations=[
            CommitOperationAdd(".gitignore", b"*.md\n"),
            CommitOperationAdd("c.md", b"c"),
            CommitOperationAdd("d.log", b"d"),
        ],
        commit_message="new rules",
    )
    assert set(api.list_repo_files(repo)) == {
        ".gitattributes",
        ".gitignore",
        "a.txt",
        "keep.log",
        "sub/top.txt",
        "d.log",
    }


def save_tiny_corpus(folder: Path) -> Path:
    """60 made-up pairs in the words of `tiny_tokenizer`, as scripts/prepare_data.py lays them out."""
    from datasets import Dataset, DatasetDict

    words = [f"w{i}" for i in range(4, VOCAB_SIZE)]
    pairs = [
        {
            "en": " ".join(words[(7 * i + j) % len(words)] for j in range(5)),
            "es": " ".join(words[(7 * i + j + 1) % len(words)] for j in range(5)),
        }
        for i in range(60)
    ]
    DatasetDict(
        {
            split: Dataset.from_dict({"id": [f"{split}.{i}" for i in range(len(rows))], "translation": rows})
            for split, rows in (("train", pairs[:50]), ("validation", pairs[50:55]), ("test", pairs[55:]))
        }
    ).save_to_disk(str(folder))
    return folder


# What a model pushed by a script holds at least: weights, config, the remote code and the tokenizer.
MODEL_FILES = {
    "model.safetensors",
    "config.json",
    "generation_vaswani.py",
    "modeling_vaswani.py",
    "pipeline_vaswani.py",
    "tokenizer.json",
}


@pytest.mark.slow  # a training run
def test_train_script_pushes_its_final_model(hub, api, tmp_path):
    """`scripts/train.py --push_to_hub --hub_model_id ...` shares the averaged model, its records and plots."""
    tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    save_tiny_corpus(tmp_path / "data")
    command = script_command(
        "train",
        "--dataset_dir",
        tmp_path / "data",
        "--tokenizer",
        tmp_path / "tokenizer",
        "--output_dir",
        tmp_path / "out",
        "--preset",
        "tiny",
        "--max_steps",
        "4",
        "--save_steps",
        "2",
        "--average_last",
        "2",
        "--batch_tokens",
        "200",
        "--eval_steps",
        "0",
        "--eval_bleu_samples",
        "2",
        "--report_to",
        "none",
        "--push_to_hub",
        "--hub_model_id",
        "alice/trained-by-script",
    )
    output, files = pushed_by_script(command, hub, api, tmp_path / "home", "alice/trained-by-script")
    assert "pushed to the Hub" in output
    assert {*MODEL_FILES, "training_summary.json", "training_curves.png", "README.md"} <= files


@pytest.mark.slow  # a fine-tuning run
def test_finetune_script_pushes_through_the_trainer(hub, api, tmp_path):
    """`scripts/finetune.py --push_to_hub` uses Seq2SeqTrainer's own push; the result loads from the Hub."""
    folder = save_model_folder(tmp_path / "model", seeded_model(0), records=False)
    save_tiny_corpus(tmp_path / "data")
    command = script_command(
        "finetune",
        "--model",
        folder,
        "--dataset_dir",
        tmp_path / "data",
        "--output_dir",
        tmp_path / "ft",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        "--eval_strategy",
        "no",
        "--save_strategy",
        "no",
        "--use_cpu",
        "--report_to",
        "none",
        "--push_to_hub",
        "--hub_model_id",
        "alice/finetuned",
    )
    _, files = pushed_by_script(command, hub, api, tmp_path / "home", "alice/finetuned")
    assert MODEL_FILES <= files
