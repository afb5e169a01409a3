"""Share a trained model on the Hugging Face Hub, in one commit, so that it loads anywhere.

Uploads the weights, config, code and tokenizer of a folder written by `save_pretrained` (or `vaswani-train`), its
records and plots, and a README.md model card rendered from them (`vaswani.hub.push`). An unchanged folder makes
no new commit. The token is the client's (HF_TOKEN, or `hf auth login`) and is never printed; the Hub is HF_ENDPOINT.

Usage:
  python scripts/push_to_hub.py --model_dir OUT --repo_id alice/vaswani-en-es [--private] [--revision BRANCH]
      [--commit_message "..."]                                       (or: vaswani-push-to-hub ...)
"""

from dataclasses import dataclass, field

from vaswani.cli import command, parse_arguments


@dataclass
class PushArguments:
    model_dir: str = field(metadata={"help": "folder written by save_pretrained / vaswani-train"})
    repo_id: str = field(metadata={"help": "NAMESPACE/NAME on the Hub; created if it does not exist"})
    private: bool = field(default=False, metadata={"help": "create the repo private"})
    revision: str | None = field(
        default=None, metadata={"help": "branch to commit to, created from main if needed; none: main"}
    )
    commit_message: str | None = field(
        default=None, metadata={"help": "default: 'Upload <architecture> from <folder>'"}
    )


@command(extra="hub", needs=("jinja2",))
def main(argv):
    (args,) = parse_arguments([PushArguments], argv, description=__doc__.split("\n\n")[0])
    from vaswani.hub.push import push_to_hub

    print(
        push_to_hub(
            args.model_dir,
            args.repo_id,
            private=args.private,
            revision=args.revision,
            commit_message=args.commit_message,
        )
    )


if __name__ == "__main__":
    main()
