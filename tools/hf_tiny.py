"""A small random Hugging Face Llama and a BPE tokenizer trained here: a model folder to
fine-tune without the network (docs/finetune-hf.md, tests/test_hf.py).

    python -m tools.hf_tiny --out models/tiny                 # BPE on data/shakespeare's text
    python -m tools.hf_tiny --out models/tiny --vocab 1024 --layers 4 --width 128 --heads 4 --kv_heads 2 --tied

The folder gets tokenizer.json (a byte-level BPE, GPT-2's pre-tokenizer, trained with the
`tokenizers` library on the text of a corpus prepared with the byte tokenizer) and
config.json + model.safetensors (LlamaForCausalLM with transformers' random init, seeded).
"""
import os

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.hf_tiny", "Write a small random Hugging Face Llama and a BPE tokenizer "
                     "trained here into a model folder, to fine-tune without the network.")
    ap.add_argument("--out", metavar="DIR", required=True, help="the model folder to write (required)")
    ap.add_argument("--data_dir", metavar="DIR", default="data/shakespeare",
                    help="a corpus prepared with the byte tokenizer, whose text trains the BPE (default %(default)s)")
    ap.add_argument("--vocab", type=int, default=1024, help="the BPE's vocabulary size (default %(default)s)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default %(default)s)")
    ap.add_argument("--width", type=int, default=128, help="hidden size (default %(default)s)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default %(default)s)")
    ap.add_argument("--kv_heads", type=int, default=2, help="key/value heads (default %(default)s)")
    ap.add_argument("--hidden", type=int, default=384, help="the MLP's intermediate size (default %(default)s)")
    ap.add_argument("--tied", action="store_true", help="tie the input and output embeddings")
    ap.add_argument("--seed", type=int, default=0, help="the seed of transformers' random init (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import numpy as np  # noqa: E402  (below the command line's first answer, above)


def corpus_text(data_dir):
    """The text of a corpus prepared with the byte tokenizer (its tokens are the UTF-8 bytes)."""
    parts = [np.fromfile(os.path.join(data_dir, f), "<u2").astype(np.uint8).tobytes()
             for f in ("train.bin", "val.bin")]
    return b"".join(parts).decode("utf-8", errors="replace")


def train_tokenizer(text, folder, vocab_size=320, pre="bytelevel"):
    """A BPE trained on `text`, saved as folder/tokenizer.json: ByteLevel (GPT-2's regex, no
    prefix space) or Metaspace (SentencePiece style)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    if pre == "bytelevel":
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        alphabet = sorted(set(text.replace(" ", "\u2581")))
    tok.train_from_iterator(text.splitlines(), trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"],
        show_progress=False))
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    return tok.get_vocab_size(with_added_tokens=True)


def save_random_llama(folder, vocab, tied=False, seed=0, layers=2, width=32, heads=4, kv_heads=2,
                      hidden=64, context=32):
    """A seeded random LlamaForCausalLM saved to folder (config.json, model.safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, tie_word_embeddings=tied, hidden_size=width, intermediate_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=context))
    model.save_pretrained(folder)
    return model.eval()


def main(argv=None):
    args = parser().parse_args(argv)
    vocab = train_tokenizer(corpus_text(args.data_dir), args.out, args.vocab)
    save_random_llama(args.out, vocab, args.tied, args.seed, args.layers, args.width, args.heads,
                      args.kv_heads, args.hidden, context=1024)
    print(f"{args.out}: LlamaForCausalLM {args.layers} layers x {args.width}, vocab {vocab}, "
          f"tied {args.tied}; tokenizer.json trained on {args.data_dir}")


if __name__ == "__main__":
    main()
