"""The corpus's tokenizer: tiktoken's encodings, a byte tokenizer, and Hugging Face tokenizers
(the `tokenizers` library, `--tokenizer hf:DIR`) behind tiktoken's interface.

    python data.py --input a.txt --data_dir data/mine --tokenizer hf:path/to/model
    enc = tokenizer.get_tokenizer("bytes")       # or "gpt2", "hf:DIR"; encode, decode, n_vocab
    enc = tokenizer.get_tokenizer("hf", "data/mine", manifest["tokenizer"]["files"])  # a corpus's copy
    tokenizer.streaming_safe(enc)                # may preparation cut the text (prepare.py)?

"bytes" is built offline: its tokens are the text's UTF-8 bytes (vocab 256); export.py writes it
in Hugging Face form (bytes_in_hf_form). A named tiktoken
encoding needs tiktoken's files (downloaded once, then cached). Every failure is a
TokenizerError with a one-line message (the commands report it as bad input, exit 2).

A Hugging Face DIR holds tokenizer.json (and, copied along when present, tokenizer_config.json
and special_tokens_map.json, which transformers' AutoTokenizer reads). A corpus prepared with it
keeps a copy of these files in its tokenizer/ folder, and its manifest records
{"name": "hf", "vocab_size", "files": {file: SHA-256}}; anyone who decodes the corpus's tokens
(train.py's sample, sample.py, export.py) loads that copy after checking its SHA-256s.

Encoding is `Tokenizer.encode(text, add_special_tokens=False)`: the post-processor's BOS/EOS are
not added (the corpus is one text); added tokens that the text spells are matched, as
transformers does. vocab_size counts added tokens.

The cut rule (prepare.py prepares in blocks): a tokenizer with no normalizer, a ByteLevel
pre-tokenizer with its regex (GPT-2's pattern) and no prefix space, and no added token whose
text holds a space, is cut only before a space between two ASCII letters, as tiktoken's
patterns are: the regex ends a piece at the letter and starts the next at the space, matching
restarts there as at the start of a text (the pattern looks ahead, never behind), and BPE works
inside pieces; added tokens cannot span the cut. Any other tokenizer (Metaspace/SentencePiece,
which prepends to the first piece; a normalizer; a Split of unknown pattern) is encoded in one
piece, the whole text at once: exact, with memory for the whole text.
"""
import hashlib
import json
import os

import numpy as np
import tiktoken

import hashchain

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class TokenizerError(Exception):
    """A tokenizer that cannot be had: an unknown name, files missing offline, a bad folder."""


# The largest tokenizer file read (tokenizer.json, its config, its special-tokens map): the
# largest published tokenizer.json is a few tens of MB (Gemma's, 33 MB; Llama 3's, 9 MB), so a
# file larger than this is refused by its size before a byte of it is read (docs/limits.md).
MAX_TOKENIZER_FILE = 256 << 20


def read_files(folder):
    """{file: bytes} of the tokenizer files present in `folder` (tokenizer.json required), each a
    regular file of at most MAX_TOKENIZER_FILE bytes: what is hashed is what is loaded (and
    copied into a corpus)."""
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise TokenizerError(f"hf:{folder}: no tokenizer.json there")
    return {name: hashchain.read_bytes(os.path.join(folder, name), f"hf:{folder}: {name}",
                                       MAX_TOKENIZER_FILE, TokenizerError)
            for name in FILES if os.path.isfile(os.path.join(folder, name))}


class HFTokenizer:
    """A `tokenizers.Tokenizer` with the part of tiktoken's Encoding interface we use."""

    def __init__(self, folder, expected=None):
        from tokenizers import Tokenizer
        self.folder, self.contents = folder, read_files(folder)
        self.files = {name: hashlib.sha256(raw).hexdigest() for name, raw in self.contents.items()}
        if expected is not None and self.files != expected:
            raise TokenizerError(f"the tokenizer files in {folder} are not the ones the manifest "
                                 "records (SHA-256 differs or a file is missing)")
        try:
            self.tok = Tokenizer.from_str(self.contents["tokenizer.json"].decode("utf-8"))
        except Exception as e:   # the Rust library raises plain Exception for a bad file
            raise TokenizerError(f"hf:{folder}: cannot load tokenizer.json ({e})") from None
        self.n_vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.name = "hf"

    def encode(self, text, disallowed_special=()):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_to_numpy(self, text, disallowed_special=()):
        return np.array(self.encode(text), dtype=np.uint32)

    def decode(self, ids):
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def record(self):
        """The manifest's tokenizer record."""
        return {"name": "hf", "vocab_size": self.n_vocab, "files": self.files}


def bytes_in_hf_form():
    """{file: bytes} of the byte tokenizer ("bytes") as a Hugging Face folder holds it, for an
    export: tokenizer.json a byte-level BPE with no merges (token b = byte b, spelled as GPT-2's
    byte-to-character map spells it, which its ByteLevel pre-tokenizer and decoder use), and
    tokenizer_config.json naming the fast tokenizer class, so that transformers' AutoTokenizer
    loads it and encodes and decodes exactly as "bytes" does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    others = [b for b in range(256) if b not in printable]
    char = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    tok = Tokenizer(models.BPE(vocab={char[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tok.to_str().encode("utf-8"),
            "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode("utf-8")}


def streaming_safe(enc):
    """True when the text may be cut before a space between two ASCII letters (module doc)."""
    spec = json.loads(enc.tok.to_str())
    pre = spec.get("pre_tokenizer") or {}
    byte_level = (pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
                  and not pre.get("add_prefix_space", False))
    spaced = any(" " in t.get("content", "") for t in spec.get("added_tokens") or [])
    return byte_level and spec.get("normalizer") is None and not spaced


def get_tokenizer(name, data_dir=None, files=None):
    """A tiktoken Encoding: "bytes" (built offline, vocab 256) or any named tiktoken encoding;
    or a Hugging Face tokenizer (HFTokenizer): "hf:DIR", or "hf", a corpus's copy in
    data_dir/tokenizer whose files must have the SHA-256s `files` (its manifest's).
    TokenizerError (one line) when it cannot be had."""
    if name == "hf" or name.startswith("hf:"):
        folder = name[3:] if name.startswith("hf:") else os.path.join(data_dir or ".", "tokenizer")
        return HFTokenizer(folder, files if name == "hf" else None)
    if name == "bytes":
        # tiktoken needs a split pattern; this one partitions any text (every character is
        # whitespace, a word character or neither), so no byte is dropped, and it keeps the
        # pieces short. With only single-byte ranks there are no merges: token = byte value.
        return tiktoken.Encoding(
            name="bytes",
            pat_str=r"\s+|\w+|[^\s\w]+",
            mergeable_ranks={bytes([i]): i for i in range(256)},
            special_tokens={},
        )
    if name not in tiktoken.list_encoding_names():
        raise TokenizerError(f"unknown tokenizer {name!r}; use 'bytes', hf:DIR or one of "
                        f"{', '.join(tiktoken.list_encoding_names())}")
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # tiktoken raises whatever its HTTP client raises
        raise TokenizerError(f"tokenizer {name!r} is not available offline: tiktoken must download "
                        f"its files first ({type(e).__name__})") from None
