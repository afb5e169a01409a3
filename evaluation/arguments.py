"""How to decode a test set: the flags of the commands that translate (vaswani-evaluate, vaswani-translate), which
`translations` takes as its options. It imports what `import vaswani` brings and no more, so that --help and a mistake
in the flags answer without the training extras."""

from dataclasses import asdict, dataclass, field
from typing import Literal

from ..checks import UsageError


@dataclass
class DecodingArguments:
    """How the commands that translate (vaswani-evaluate, vaswani-translate) decode: `translations`' options."""

    _argument_group_name = "decoding"
    num_beams: int = field(default=4, metadata={"help": "beam size; 1 is greedy decoding (paper: 4)"})
    length_penalty: float = field(default=0.6, metadata={"help": "alpha of the length penalty (paper: 0.6)"})
    paper_decoding: bool = field(
        default=True,
        metadata={"help": "section 6.1's beam search: GNMT length penalty, each sentence's own length limit"},
    )
    batch_size: int = field(default=32, metadata={"help": "sentences per generate() call (without --max_tokens)"})
    max_tokens: int | None = field(
        default=None,
        metadata={"help": "instead of --batch_size: source tokens per generate() call, padding included (fairseq's)"},
    )
    max_source_length: int | None = field(default=None, metadata={"help": "cut longer sources (tokens), and say so"})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, ...; default: cuda if available"})
    dtype: Literal["float32", "bfloat16", "float16"] = field(
        default="float32",
        metadata={"help": "the weights' type while decoding (docs/decoding.md: bfloat16's speed and BLEU)"},
    )
    int8: bool = field(
        default=False,
        metadata={
            "help": "on the CPU, int8 linear layers (torch's dynamic quantization); with --ctranslate2, its int8"
        },
    )

    def __post_init__(self):
        for flag, value in (("--batch_size", self.batch_size), ("--max_tokens", self.max_tokens)):
            if value is not None and value < 1:
                raise UsageError(f"{flag} must be at least 1, got {value}.")

    def options(self) -> dict:
        """The keyword arguments of `translations` (the device and the weights' type are the model's)."""
        return {name: value for name, value in asdict(self).items() if name not in ("device", "dtype", "int8")}
