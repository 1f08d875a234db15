"""The tokenizer a converted reward checkpoint carries (checkpoints ship without one).

CLIP-family: either any CLIP tokenizer directory (openai/laion CLIP repos all hold
the same 49,408-token BPE) or open_clip's own ``bpe_simple_vocab_16e6.txt.gz``,
turned into the same vocabulary open_clip builds from it. ImageReward: a
bert-base-uncased tokenizer directory, given BLIP's two extra tokens.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from ...common.errors import UsageError
from ...common.families.loaders import resolve_local_dir

# open_clip's SimpleTokenizer keeps the first 49,152 − 256 − 2 merges of the file
_OPENCLIP_MERGES = 49152 - 256 - 2


def clip_tokenizer_from_bpe(path: str | Path, context_length: int = 77):
    """A transformers CLIPTokenizer with open_clip's vocabulary: the 256 byte symbols,
    the same with ``</w>``, one token per merge, then start/end of text."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    with gzip.open(Path(path).expanduser()) as f:
        lines = f.read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : _OPENCLIP_MERGES + 1] if line.strip()]
    symbols = list(bytes_to_unicode().values())
    words = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    words += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {w: i for i, w in enumerate(words)}
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=context_length)


def clip_tokenizer(source: str | Path, context_length: int, vocab_size: int, what: str):
    source = Path(source).expanduser()
    if source.is_file():
        tok = clip_tokenizer_from_bpe(source, context_length)
    else:
        from transformers import AutoTokenizer

        local = resolve_local_dir(source, f"{what} tokenizer")
        tok = AutoTokenizer.from_pretrained(local, local_files_only=True)
        tok.model_max_length = context_length
    if len(tok) != vocab_size:
        raise UsageError(
            f"{what}: the tokenizer at {source} has {len(tok)} tokens but the checkpoint's "
            f"token embedding has {vocab_size} rows — give the tokenizer the model was trained with"
        )
    return tok


def blip_bert_tokenizer(source: str | Path, max_length: int, vocab_size: int, what: str):
    """bert-base-uncased plus BLIP's ``[DEC]`` (bos) and ``[ENC]`` tokens, as BLIP's
    ``init_tokenizer`` adds them (30,524 tokens)."""
    from transformers import AutoTokenizer

    local = resolve_local_dir(source, f"{what} tokenizer")
    tok = AutoTokenizer.from_pretrained(local, local_files_only=True)
    if "[DEC]" not in tok.get_vocab():
        tok.add_special_tokens({"bos_token": "[DEC]"})
    if "[ENC]" not in tok.get_vocab():
        tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    tok.model_max_length = max_length
    if len(tok) != vocab_size:
        raise UsageError(
            f"{what}: the tokenizer at {source} has {len(tok)} tokens (with [DEC], [ENC]) but "
            f"the checkpoint's word embedding has {vocab_size} rows — give bert-base-uncased"
        )
    return tok
