"""The WMT path of docs/training.md ("WMT-sized corpora"), as it is written: `--dataset wmt/wmt14 --dataset_config de-en`
by Hub name online (a local stand-in for the Hub, tests/hub_server.py), and on a local copy in the Hub's layout
offline, with or without the repo's README; a path that does not exist refused at once, never looked up on the Hub;
a Hub that cannot be reached said so first, with the next step."""

import sys

import datasets
import pytest
from helpers import REPO_ROOT, run_command, script_env, write_wmt14_folder
from hub_server import HubServer

from vaswani.scripts import finetune, prepare_data
from vaswani.training import data


# docs/training.md's command, with the output folder and the folder of the dataset left to each test.
DOCS_FLAGS = "--dataset_config de-en --source_lang en --target_lang de --num_proc 1".split()


def test_the_training_docs_write_the_command_the_tests_run():
    page = (REPO_ROOT / "docs" / "training.md").read_text()
    assert "--dataset wmt/wmt14 --dataset_config de-en --source_lang en --target_lang de" in page


def write_hub_layout(folder, pairs_per_split, configs=("de-en", "fr-en")):
    """The Hub's wmt14 files without its README: a subfolder of Parquet files per configuration."""
    for config in configs:
        language = config.split("-")[0]
        (folder / config).mkdir(parents=True)
        for split, count in pairs_per_split.items():
            rows = [
                {"translation": {language: f"{language} {split} {i}.", "en": f"en {split} {i}."}} for i in range(count)
            ]
            datasets.Dataset.from_list(rows).to_parquet(str(folder / config / f"{split}-00000-of-00001.parquet"))
    return folder


def test_a_local_copy_in_the_hubs_layout_takes_the_configuration_name(tmp_path, capsys):
    folder = write_hub_layout(tmp_path / "wmt14", {"train": 300, "validation": 7, "test": 9})
    out = tmp_path / "data"
    prepare_data.main(["--dataset", folder, *DOCS_FLAGS, "--output_dir", out])
    assert "kept 316 pairs, dropped 0" in capsys.readouterr().out
    prepared = datasets.load_from_disk(str(out))
    assert prepared["train"].features["translation"] == datasets.Translation(languages=["en", "de"])
    # fine-tuning takes the same two flags
    _, data_args, _, args = finetune.parse_args(
        [
            "--model",
            "m",
            "--dataset",
            str(folder),
            "--dataset_config",
            "fr-en",
            "--source_lang",
            "en",
            "--target_lang",
            "fr",
            "--output_dir",
            str(tmp_path / "out"),
        ]  # fmt: skip
    )
    train, evaluation = finetune.load_splits(data_args, args.seed)
    assert (len(train), len(evaluation)) == (300, 7)
    assert train[0]["translation"] == {"fr": "fr train 0.", "en": "en train 0."}


def test_a_datasets_own_test_and_validation_splits_are_kept_whole_as_published(tmp_path, capsys):
    """newstest's layout: a pair of extreme length ratio, and one with a run of spaces and a decomposed accent, in
    every split. The training pairs are cleaned and the extreme one dropped; the test and validation splits keep
    every pair, word for word, so that their scores compare with others' on the same sets."""
    extreme = {"de": "Ja.", "en": "Yes, and that is what the committee said in its report on the matter last year."}
    untidy = {"de": "Cafe\u0301  am   Markt.", "en": "A  cafe\u0301 on the market."}
    (tmp_path / "wmt" / "de-en").mkdir(parents=True)
    published = {}
    for split, count in (("train", 300), ("validation", 5), ("test", 7)):
        rows = [{"translation": {"de": f"Satz {split} {i}.", "en": f"Sentence {split} {i}."}} for i in range(count)]
        published[split] = [*rows, {"translation": extreme}, {"translation": untidy}]
        path = tmp_path / "wmt" / "de-en" / f"{split}-00000-of-00001.parquet"
        datasets.Dataset.from_list(published[split]).to_parquet(str(path))

    prepare_data.main(["--dataset", tmp_path / "wmt", *DOCS_FLAGS, "--output_dir", tmp_path / "data"])

    log = capsys.readouterr().out
    assert log.splitlines()[:2] == ["kept 317 pairs, dropped 1", "  dropped length_ratio                   1"]
    prepared = datasets.load_from_disk(str(tmp_path / "data"))
    for split in ("validation", "test"):
        assert prepared[split]["translation"] == [row["translation"] for row in published[split]]
    assert extreme not in prepared["train"]["translation"]
    assert {"de": "Caf\u00e9 am Markt.", "en": "A caf\u00e9 on the market."} in prepared["train"]["translation"]


def test_the_configuration_of_a_folder_is_named_or_asked_for(tmp_path):
    folder = write_hub_layout(tmp_path / "wmt14", {"train": 2})
    with pytest.raises(SystemExit, match=r"holds one configuration per subfolder \(de-en, fr-en\).*--dataset_config"):
        prepare_data.main(["--dataset", folder, "--output_dir", tmp_path / "out"])
    with pytest.raises(SystemExit, match=r"has no configuration 'ru-en' \(it has de-en, fr-en\)"):
        prepare_data.main(["--dataset", folder, "--dataset_config", "ru-en", "--output_dir", tmp_path / "out"])
    # With the repo's README, its `configs:` name the configurations, as on the Hub.
    write_wmt14_folder(tmp_path / "with_card", {"train": 2, "validation": 1, "test": 1})
    assert data.local_dataset_options(tmp_path / "with_card", "de-en", "--dataset x") == {"name": "de-en"}
    assert data.local_dataset_options(folder, "de-en", "--dataset x") == {"data_dir": "de-en"}


def test_a_path_that_does_not_exist_is_refused_without_asking_the_hub(tmp_path, monkeypatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("looked up on the Hub")

    monkeypatch.setattr(data, "load_dataset", no_hub)
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/vaswani-prepare-data"])
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    for path in ("./wmt14", str(tmp_path / "wmt14"), "~/no/such/wmt14", "data/wmt14", "a/b/c"):
        with pytest.raises(SystemExit) as raised:
            prepare_data.main(["--dataset", path, *DOCS_FLAGS, "--output_dir", tmp_path / "out"])
        assert str(raised.value) == (
            f"vaswani-prepare-data: error: --dataset {path} does not exist (a path: it is not looked up on the Hub)."
        )


def test_an_unreachable_hub_says_so_first_with_the_next_step(tmp_path):
    env = script_env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_DATASETS_CACHE=str(tmp_path / "cache"))
    result = run_command(
        ["vaswani-prepare-data", "--dataset", "wmt/wmt14", *DOCS_FLAGS, "--output_dir", tmp_path / "out"], env=env
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "error" in line]
    assert line.startswith(
        "vaswani-prepare-data: error: --dataset wmt/wmt14: the Hugging Face Hub cannot be reached (HF_HUB_OFFLINE is "
        "set), and datasets' cache holds no copy of this dataset configuration: download it where there is a network "
        "(hf download wmt/wmt14 --repo-type dataset --local-dir DIR) and pass the folder (--dataset DIR "
        "--dataset_config de-en), or retry online ("
    )


@pytest.mark.slow  # the Hub client retries for about 23 s before it gives up
def test_an_endpoint_that_does_not_answer_says_the_hub_cannot_be_reached(tmp_path):
    env = script_env(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    result = run_command(["vaswani-prepare-data", "--dataset", "wmt/wmt14", "--output_dir", tmp_path / "out"], env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "error: --dataset wmt/wmt14: the Hugging Face Hub cannot be reached (offline?)" in result.stderr


def test_a_hub_name_loads_online_with_the_hubs_configuration_name(tmp_path):
    """docs/training.md's command against a Hub that holds wmt/wmt14 in its own layout: README.md naming the configs,
    a subfolder of Parquet files per configuration."""
    write_wmt14_folder(tmp_path / "repo", {"train": 300, "validation": 7, "test": 9})
    with HubServer(users={"wmt": "hf_wmt_token"}) as hub:
        env = script_env(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_TOKEN="hf_wmt_token",
                         HF_HOME=str(tmp_path / "hf"), HF_DATASETS_CACHE=str(tmp_path / "cache"))  # fmt: skip
        upload = (
            "import sys; from huggingface_hub import HfApi; api = HfApi();"
            "api.create_repo('wmt/wmt14', repo_type='dataset');"
            "api.upload_folder(repo_id='wmt/wmt14', repo_type='dataset', folder_path=sys.argv[1])"
        )
        run_command([sys.executable, "-c", upload, tmp_path / "repo"], env=env, check=True)
        command = ["vaswani-prepare-data", "--dataset", "wmt/wmt14", *DOCS_FLAGS, "--output_dir", tmp_path / "data"]
        result = run_command(command, env=env, check=True)
    assert "kept 316 pairs, dropped 0" in result.stdout
    prepared = datasets.load_from_disk(str(tmp_path / "data"))
    assert sum(len(split) for split in prepared.values()) == 316
