"""Explore a trained model in the browser: the attention explorer (needs the `demo` extra).

    python scripts/demo.py --model M [--port 7860] [--host 127.0.0.1]        (or: vaswani-demo ...)
    python scripts/demo.py --model USER/MODEL --space USER/NAME [--private]   (the same page as a Hub Space)

M is a vaswani model folder (written by save_pretrained, `vaswani-train` or `vaswani-convert-fairseq`) or a model on
the Hub. The page translates a sentence with the paper's decoding and shows its n-best list, every layer and head of
its attention, its alignment, the positional encoding and the beam search step by step (vaswani.inspection.app).
With --space, nothing is served here: the page is pushed as a Space that serves the model repository M
(vaswani.hub.space), with the token the Hub client finds (HF_TOKEN, or `hf auth login`'s).
"""

from dataclasses import dataclass, field

from vaswani.checks import UsageError, check_model_folder
from vaswani.cli import command, parse_arguments


@dataclass
class DemoArguments:
    model: str = field(metadata={"help": "a vaswani model folder, or a model on the Hub"})
    tokenizer: str | None = field(default=None, metadata={"help": "default: the tokenizer saved with the model"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to serve on (0.0.0.0: every interface)"})
    port: int = field(default=7860, metadata={"help": "port to serve on"})
    space: str | None = field(default=None, metadata={"help": "push the page as this Space (USER/NAME) instead"})
    private: bool = field(default=False, metadata={"help": "with --space: create the Space private"})


@command(extra="demo", needs=("gradio", "matplotlib"))
def main(argv, block=True):
    """Serve the page; with `block=False` (from Python), return the running app (`.close()` stops it)."""
    (args,) = parse_arguments([DemoArguments], argv, description=__doc__.split("\n\n")[0])
    if args.private and args.space is None:
        raise UsageError("--private makes a Space private: give --space.")
    if args.space is not None:
        from vaswani.hub.space import push_space

        url = push_space(args.space, args.model, private=args.private)
        print(f"pushed the attention explorer of {args.model} to the Space {args.space}: {url}")
        return url
    check_model_folder(args.model, model_types={"vaswani"}, hub=True)
    from vaswani.inspection.app import Explorer, ModelError, build_app

    try:
        explorer = Explorer(args.model, args.tokenizer)
    except ModelError as error:
        raise UsageError(f"--model {error}") from None
    app = build_app(explorer)
    app.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=not block, show_error=True)
    return app


if __name__ == "__main__":
    main()
