"""Every command, every mistake, one sentence: each console script of pyproject.toml walked through the mistakes a user
makes (a missing install extra, a model folder that is missing or of another kind, an input longer than the model
takes, an output file without its folder), each ending with `NAME: error: ...` on one line, with no traceback and no
empty output folder left behind; and `--help` answered without importing the extras (datasets, evaluate, ...;
`import vaswani` imports none either)."""

import importlib.metadata
import importlib.util
import json
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, finish, save_pairs, script_env, start


try:  # pyproject.toml's [project.scripts], as the checkout has them
    import tomllib

    COMMANDS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
except ModuleNotFoundError:  # Python 3.10: as they were installed
    COMMANDS = {point.name: point.value for point in importlib.metadata.entry_points(group="console_scripts")
                if point.value.startswith("vaswani.scripts.")}  # fmt: skip
# What no command may import to answer --help: the extras. torch and transformers come with `import vaswani`, which
# registers the model with transformers' Auto classes, and transformers imports accelerate itself where it is installed
# (vaswani-finetune parses its Seq2SeqTrainingArguments flags only after its own).
HEAVY = ("datasets", "pyarrow", "evaluate", "sacrebleu", "ctranslate2", "matplotlib", "gradio")
# The install extra each command needs, and one module of it.
EXTRAS = {
    "vaswani-prepare-data": ("data", "datasets"),
    "vaswani-train-tokenizer": ("data", "datasets"),
    "vaswani-train": ("train", "accelerate"),
    "vaswani-evaluate": ("train", "sacrebleu"),
    "vaswani-finetune": ("train", "datasets"),
    "vaswani-push-to-hub": ("hub", "jinja2"),
    "vaswani-export-ctranslate2": ("export", "ctranslate2"),
    "vaswani-convert-fairseq": ("fairseq", "sacremoses"),
    "vaswani-translate": ("train", "datasets"),
    "vaswani-visualize": ("train", "matplotlib"),
    "vaswani-demo": ("demo", "gradio"),
}


def main_of(name):
    module, function = COMMANDS[name].split(":")
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not in this checkout")
    return getattr(importlib.import_module(module), function)


def run_python(code, *, env=None):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=script_env(**(env or {}))
    )


def one_error_line(stderr, name):
    """The command's stderr is one line, `NAME: error: ...`, and no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{name}: error: "), stderr
    return lines[0]


def error_of(name, arguments, monkeypatch):
    """The message `name`'s main exits with on `arguments`, run in this process as the console script runs it."""
    monkeypatch.setattr("sys.argv", [f"/usr/local/bin/{name}"])
    with pytest.raises(SystemExit) as raised:
        main_of(name)([str(argument) for argument in arguments])
    return one_error_line(str(raised.value), name)


def test_the_extras_table_covers_every_command():
    assert set(EXTRAS) == set(COMMANDS)


def test_import_vaswani_imports_no_extra():
    result = run_python(f"import sys, vaswani; print([m for m in {HEAVY!r} if m in sys.modules])")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]"]


@pytest.fixture(scope="module")
def help_runs():
    """Each command's --help in a fresh process, all started at once (each takes seconds, most of them imports): the
    exit status, stdout and stderr by command."""
    processes = {}
    for name, entry_point in COMMANDS.items():
        module, function = entry_point.split(":")
        code = f"""
import json, sys
sys.argv = [{name!r}, "--help"]
from {module} import {function} as main
try:
    main()
except SystemExit as done:
    code = done.code
print(json.dumps({{"code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""
        processes[name] = start([sys.executable, "-c", code])
    outputs = finish(*processes.values(), timeout=300)
    return {name: (process.returncode, *output) for (name, process), output in zip(processes.items(), outputs)}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_answers_without_importing_heavy_libraries(help_runs, name):
    returncode, stdout, stderr = help_runs[name]
    assert returncode == 0, stderr
    *help_text, last = stdout.splitlines()
    answer = json.loads(last)
    assert answer["code"] in (0, None) and "--help" in "\n".join(help_text)
    assert answer["heavy"] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_missing_extra_is_named_with_its_install_even_for_help(name, monkeypatch):
    extra, module = EXTRAS[name]
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: find_spec finds nothing, import fails
    message = error_of(name, ["--help"], monkeypatch)
    assert message == (
        f"{name}: error: {name} needs the `{extra}` extra ({module} is not installed): pip install 'vaswani[{extra}]'"
    )


def test_a_missing_extra_as_the_user_meets_it():
    """The console script in a process of its own, where ctranslate2 cannot be imported."""
    name = "vaswani-export-ctranslate2"
    result = run_python(
        f"import sys; sys.modules['ctranslate2'] = None; sys.argv = [{name!r}, '--help'];"
        "from vaswani.scripts.export_ctranslate2 import main; main()"
    )
    assert result.returncode == 1
    assert one_error_line(result.stderr, name) == (
        f"{name}: error: {name} needs the `export` extra (ctranslate2 is not installed): pip install 'vaswani[export]'"
    )


def test_a_module_found_missing_later_is_named_with_the_extra(monkeypatch):
    from vaswani.cli import command

    @command(extra="train", needs=())
    def main(argv):
        import vaswani_tests_no_such_module  # noqa: F401

    monkeypatch.setattr("sys.argv", ["/usr/local/bin/vaswani-x"])
    with pytest.raises(SystemExit) as raised:
        main([])
    assert str(raised.value) == (
        "vaswani-x: error: vaswani-x needs vaswani_tests_no_such_module, which is not installed: "
        "pip install 'vaswani[train]'"
    )


# --- Model folders: missing, not a model, another kind of model. ---


@pytest.fixture
def model_folders(tmp_path):
    """A folder that does not exist, one without config.json, and one holding a BERT model's config."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    return {"missing": tmp_path / "nowhere" / "model", "empty": tmp_path / "empty", "bert": tmp_path / "bert"}


def model_arguments(name, model, tmp_path):
    """`name`'s arguments with `model` as its model, everything else in order."""
    (tmp_path / "in.txt").write_text("the cat\n")
    (tmp_path / "data").mkdir(exist_ok=True)
    return {
        "vaswani-translate": ["--model", model, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt"],
        "vaswani-evaluate": ["--model", model, "--dataset_dir", tmp_path / "data"],
        "vaswani-finetune": ["--model", model, "--dataset_dir", tmp_path / "data", "--output_dir", tmp_path / "out"],
        "vaswani-export-ctranslate2": ["--model", model, "--output_dir", tmp_path / "ct2"],
        "vaswani-visualize": ["--model", model, "--text", "the cat", "--output_dir", tmp_path / "figures"],
        "vaswani-push-to-hub": ["--model_dir", model, "--repo_id", "alice/model"],
        "vaswani-demo": ["--model", model, "--port", 0],
    }[name]


MODEL_COMMANDS = ["vaswani-translate", "vaswani-evaluate", "vaswani-finetune", "vaswani-export-ctranslate2",
                  "vaswani-visualize", "vaswani-push-to-hub", "vaswani-demo"]  # fmt: skip


@pytest.mark.parametrize("name", MODEL_COMMANDS)
def test_a_wrong_model_folder_is_one_sentence_naming_it(name, model_folders, tmp_path, monkeypatch):
    expected = {"missing": "does not exist", "empty": "no config.json", "bert": "'bert'"}
    if name == "vaswani-push-to-hub":  # which checks the weights first, as it uploads them
        expected.update(empty="has no model.safetensors", bert="has no model.safetensors")
    for mistake, folder in model_folders.items():
        message = error_of(name, model_arguments(name, folder, tmp_path), monkeypatch)
        assert str(folder) in message and expected[mistake] in message, message
    assert not (tmp_path / "nowhere").exists()


def failing_arguments(name, output_dir, tmp_path):
    """`name`'s arguments with `output_dir` and an input it fails on once that folder has been checked."""
    (tmp_path / "data").mkdir(exist_ok=True)  # a folder, but no dataset
    (tmp_path / "config_only").mkdir(exist_ok=True)  # a vaswani config, without weights or tokenizer
    (tmp_path / "config_only" / "config.json").write_text(json.dumps({"model_type": "vaswani"}))
    (tmp_path / "tokenizer").mkdir(exist_ok=True)
    return {
        "vaswani-convert-fairseq": ["--checkpoint", tmp_path / "missing.pt", "--data_dir", tmp_path / "data"],
        "vaswani-export-ctranslate2": ["--model", tmp_path / "config_only"],
        "vaswani-finetune": ["--model", tmp_path / "tokenizer", "--dataset_dir", tmp_path / "data"],
        "vaswani-train": ["--dataset_dir", tmp_path / "data", "--tokenizer", tmp_path / "tokenizer"],
    }[name] + ["--output_dir", output_dir]


@pytest.mark.parametrize(
    "name", ["vaswani-convert-fairseq", "vaswani-export-ctranslate2", "vaswani-finetune", "vaswani-train"]
)
def test_a_command_that_fails_on_its_input_leaves_no_empty_output_dir_behind(name, tmp_path, monkeypatch):
    error_of(name, failing_arguments(name, tmp_path / "new" / "out", tmp_path), monkeypatch)
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there before the command stays
    error_of(name, failing_arguments(name, tmp_path / "kept", tmp_path), monkeypatch)
    assert (tmp_path / "kept").is_dir()


@pytest.mark.slow  # loads transformers and torch in a process of its own
def test_a_hub_id_that_cannot_be_fetched_offline_is_one_sentence(tmp_path):
    name = "vaswani-export-ctranslate2"
    result = run_python(
        f"import sys; sys.argv = [{name!r}, '--model', 'alice/no-such-model', '--output_dir', {str(tmp_path)!r}];"
        "from vaswani.scripts.export_ctranslate2 import main; main()",
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert result.returncode == 1
    assert one_error_line(result.stderr, name).startswith(f"{name}: error: cannot load --model alice/no-such-model: ")


# --- Inputs longer than the model takes, and output files. ---


def test_a_source_longer_than_the_model_takes_names_the_limit_and_the_flag(trained_text_model, tmp_path, monkeypatch):
    model, tokenizer, folder = trained_text_model
    limit, long = model.config.max_position_embeddings, " ".join(["cat"] * 2000)
    tokens = len(tokenizer(long).input_ids)
    (tmp_path / "in.txt").write_text(f"the cat\n{long}\n")
    arguments = ["--model", folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt"]
    message = error_of("vaswani-translate", arguments, monkeypatch)
    assert message == (
        f"vaswani-translate: error: line 2 of --input is {tokens} tokens long, more than the model's {limit} source "
        f"positions: pass --max_source_length {limit} (or less) to cut longer sources."
    )
    message = error_of("vaswani-translate", [*arguments, "--max_source_length", limit + 1], monkeypatch)
    assert f"--max_source_length {limit + 1} is more than the model's {limit} source positions" in message
    assert not (tmp_path / "out.txt").exists()
    # vaswani-evaluate's sources are a dataset split's.
    data = save_pairs(tmp_path / "data", [{"en": long, "es": "gato"}])
    arguments = ["--model", folder, "--dataset_dir", data, "--split", "validation", "--output", tmp_path / "h.txt"]
    message = error_of("vaswani-evaluate", arguments, monkeypatch)
    assert (
        f"line 1 of the validation split's sources is {tokens} tokens long, more than the model's {limit}" in message
    )


def test_an_output_file_needs_its_folder(trained_text_model, tmp_path, monkeypatch):
    _, _, folder = trained_text_model
    (tmp_path / "in.txt").write_text("the cat\n")
    (tmp_path / "a_file").write_text("")
    data = save_pairs(tmp_path / "data", [{"en": "the cat", "es": "el gato"}])
    for output, problem in (
        (tmp_path / "nowhere" / "out.txt", f"its folder {tmp_path / 'nowhere'} does not exist"),
        (tmp_path / "a_file" / "out.txt", f"its folder {tmp_path / 'a_file'} is a file"),
        (tmp_path, "it is a folder"),
    ):
        for name, arguments in (
            ("vaswani-translate", ["--model", folder, "--input", tmp_path / "in.txt"]),
            ("vaswani-evaluate", ["--model", folder, "--dataset_dir", data, "--split", "validation"]),
        ):
            message = error_of(name, [*arguments, "--output", output], monkeypatch)
            assert message == f"{name}: error: cannot write --output {output}: {problem}."
    assert not (tmp_path / "nowhere").exists()


# --- Devices. ---


@pytest.fixture
def without_cuda(monkeypatch):
    """The machine as one without CUDA: this one, or a GPU machine whose GPUs torch and CTranslate2 do not see. The
    reason the refusal gives: what torch says of CUDA here."""
    import ctranslate2
    import torch

    if torch.cuda.is_available():
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    if torch.backends.cuda.is_built():
        return f"torch {torch.__version__} sees no cuda device here"
    return f"this torch has no CUDA (torch {torch.__version__})"


def device_arguments(name, folder, tmp_path):
    (tmp_path / "in.txt").write_text("Jesus wept.\n")
    data = save_pairs(tmp_path / "data", [{"en": "Jesus wept.", "es": "Y lloró Jesús."}])
    return {
        "vaswani-translate": ["--model", folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt"],
        "vaswani-evaluate": ["--model", folder, "--dataset_dir", data, "--split", "validation"],
    }[name]


@pytest.mark.parametrize("name", ["vaswani-translate", "vaswani-evaluate"])
def test_a_device_that_cannot_run_is_one_sentence_naming_what_can(
    name, trained_text_model, without_cuda, tmp_path, monkeypatch
):
    _, _, folder = trained_text_model
    arguments = device_arguments(name, folder, tmp_path)
    for device in ("cuda", "cuda:1"):
        message = error_of(name, [*arguments, "--device", device], monkeypatch)
        assert message == f"{name}: error: --device {device}: {without_cuda}; available: cpu."
    message = error_of(name, [*arguments, "--device", "gpu"], monkeypatch)
    assert message == f"{name}: error: --device gpu is not a device name (cpu, cuda, cuda:1, mps, ...)."
    assert not (tmp_path / "out.txt").exists()


def test_a_device_ctranslate2_cannot_run_on_is_one_sentence(trained_text_model, without_cuda, tmp_path, monkeypatch):
    import ctranslate2

    _, _, folder = trained_text_model
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "model.bin").write_bytes(b"")  # never read: the device is refused first
    arguments = [*device_arguments("vaswani-translate", folder, tmp_path), "--ctranslate2", tmp_path / "ct2"]
    for device, reason in (("cuda", "sees no CUDA device"), ("mps", "runs on cpu or cuda")):
        message = error_of("vaswani-translate", [*arguments, "--device", device], monkeypatch)
        assert message == (
            f"vaswani-translate: error: --device {device}: CTranslate2 {ctranslate2.__version__} {reason}; "
            "available: cpu."
        )
