#!/usr/bin/env python3
"""tok_parity.py -- tokenizer goldens from llama.cpp (llama-cpp-python), cross-checked with HF transformers.

Writes one golden file per model for tests/unit/test_tok.c:

    # comment lines
    <hex of the UTF-8 text> TAB <flags> TAB <space-separated ids>

flags: bit 0 = parse_special (llama_tokenize(..., add_special=False, parse_special=bit0)).

The ids are llama.cpp's (the reference tokenmill must match exactly). The same texts are also encoded with
HF transformers' GGUF tokenizer (AutoTokenizer.from_pretrained(dir, gguf_file=...)); every case where HF
disagrees with llama.cpp is written as a '# hf-diff' comment line with both id lists, so that the
differences are visible and reviewed (see KNOWN_HF_DIFFS for the reasons found so far).

Usage:
    tok_parity.py --smollm2 PATH --gemma PATH --out tests/data/tok [--no-hf]
    tok_parity.py --model PATH --golden FILE --fuzz N --seed S   (random texts only, for test_tok_parity.py)
"""
import argparse
import os
import random
import sys

# Why HF's GGUF tokenizer differs from llama.cpp where it does (checked by hand on the diffs this script
# prints; kept here so the reasons travel with the goldens).
KNOWN_HF_DIFFS = """
SmolLM2 (gpt2 BPE, pre 'smollm'): transformers' GGUF converter gives it the plain GPT-2 ByteLevel
pre-tokenizer; llama.cpp's 'smollm' type first isolates every \\p{N} character (as SmolLM2's own
tokenizer.json does with Digits(individual_digits)). SmolLM2's merges never join two digits, so ASCII
numbers still agree; they differ where a space and a non-ASCII number character have a merge
(' \u00bd', ' \u0663'): HF keeps the space on the number, llama.cpp splits it off.
Gemma 3 (SPM, byte fallback): transformers converts it to a tokenizers BPE model whose pre-tokenizer splits
on ' ' (MergedWithPrevious) after replacing ' ' with U+2581; llama.cpp merges over the whole fragment by
token score. They differ on long runs of spaces (HF cannot use the whitespace-run tokens across its
splits) and on a literal U+2581 in the text (HF merges it with the following space).
With parse_special off, llama.cpp still matches USER_DEFINED tokens (Gemma's newline runs, tags).
"""

CORPUS = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n\n",
    " \n \n",
    "\r\n",
    "Hello world",
    " Hello",
    "Hello  world",
    "Hello\tworld\n",
    "hello, World! How are you?",
    "I'm don't you'll they've she'd we're it's",
    "IT'S DON'T I'M YOU'LL",
    "'s 's 'S '",
    "rock'n'roll o'clock",
    "1",
    "12",
    "123",
    "1234",
    "1234567890",
    "3.14159265358979",
    "100,000,000 and 42",
    "2024-11-29T08:40:00Z",
    "\u0967\u0968\u0969 \u0663\u0664\u0665",
    "\u216b \u00bd \u00b2",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "\u00dcn\u00efc\u00f6d\u00e9",
    "e\u0301",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
    "\u05e2\u05d1\u05e8\u05d9\u05ea",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\u0939\u093f\u0928\u094d\u0926\u0940",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\U0001F600\U0001F603\U0001F604",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
    "\U0001F1FA\U0001F1F8",
    "\U0001F600a\U0001F600b",
    "\U00013000 \U0001D11E",
    "def foo(x):\n    return x * 2\n",
    "int main(void) { return 0; }",
    "if (a && b || !c) {\n\tx += 1;\n}",
    "<html><body>Hi</body></html>",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "a    b",
    "    leading",
    "trailing    ",
    "\t\t\tindent",
    "mixed \t \n whitespace",
    "\u00a0nbsp\u00a0",
    "\u3000ideographic\u3000space",
    "\u2003em\u2003space",
    "\u0085nel",
    "\u180emongolian",
    "\u200bzero width",
    "\ufeffBOM",
    "\x01\x1f\x7f controls",
    "a\x00b",
    "\u017f long s 'S",
    "!!!???...",
    "--->",
    "a.b.c",
    "$100 +5 <=> ^~|",
    "@user #tag",
    "C++ and C#",
    "e.g. i.e.",
    "\U00011F04\U00011F05 \U0001FA75 \U0002EBF0",
    "\u2581 literal lower one eighth block",
    "<0x41> is not a byte token in text",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more",
    "<|im_start|><|im_start|>",
    "<|im_start",
    "<repo_name>x<filename>y",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk>",
    "[multimodal] <unused0>",
    "a" * 500,
    "supercalifragilisticexpialidocious" * 10,
    "x" * 2000 + "9" * 300,
    " " * 300 + "end",
    "\n" * 40 + "x",
    "The quick brown fox jumps over the lazy dog. " * 8,
]


def _load_llama(path):
    from llama_cpp import Llama

    return Llama(model_path=path, vocab_only=True, verbose=False)


def llama_ids(llm, text, special):
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))


def _load_hf(path):
    from transformers import AutoTokenizer

    d, f = os.path.split(os.path.abspath(path))
    return AutoTokenizer.from_pretrained(d, gguf_file=f)


def hf_ids(tok, text, special):
    enc = tok(text, add_special_tokens=False, split_special_tokens=not special)
    return list(enc["input_ids"])


def fuzz_corpus(n, seed):
    """Random texts drawn from pieces that stress the pre-tokenizer and the merges."""
    rng = random.Random(seed)
    atoms = [
        " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "a", "Z", "the", " the", "'s", "'LL", "0", "42",
        "12345", ".", ",", "!", "?", "(", ")", "{", "}", "<", ">", "|", "$", "+", "=", "_", "-", "/", "\\",
        "\u00e9", "\u00fc", "\u00df", "\u4e2d", "\u6587", "\u3042", "\ud55c", "\u0416", "\u03a9", "\u05d0",
        "\u0627", "\u0939", "\u0e01", "\U0001F600", "\U0001F44D", "\u200d", "\u0301", "\u2581", "\u00bd",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<eos>",
        "<0x0A>", "[multimodal]",
    ]
    out = []
    for _ in range(n):
        k = rng.randint(1, 24)
        out.append("".join(rng.choice(atoms) for _ in range(k)))
    return out


def write_golden(path, model_path, texts, llm, hf=None, header=""):
    import llama_cpp

    lines = [
        "# tokenmill tokenizer golden for %s" % os.path.basename(model_path),
        "# ids from llama.cpp via llama-cpp-python %s (vocab_only, add_bos=False)" % llama_cpp.__version__,
        "# format: hex(utf-8 text) TAB flags(bit0 = parse_special) TAB ids",
    ]
    if header:
        lines += ["# " + h for h in header.strip().splitlines()]
    n_diff = 0
    body = []
    for text in texts:
        for special in (True, False):
            ids = llama_ids(llm, text, special)
            body.append("%s\t%d\t%s" % (text.encode("utf-8").hex(), 1 if special else 0, " ".join(map(str, ids))))
            if hf is not None:
                try:
                    h = hf_ids(hf, text, special)
                except Exception as e:  # noqa: BLE001 -- record, do not stop
                    h = "error: %s" % e
                if h != ids:
                    n_diff += 1
                    lines.append("# hf-diff %s special=%d llama=%s hf=%s" % (
                        text.encode("utf-8").hex(), 1 if special else 0, ids, h))
    if hf is not None:
        lines.append("# hf-diff total: %d of %d cases" % (n_diff, 2 * len(texts)))
    with open(path, "w") as f:
        f.write("\n".join(lines + body) + "\n")
    return n_diff


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", help="SmolLM2 GGUF (gpt2 BPE)")
    ap.add_argument("--gemma", help="Gemma 3 GGUF (SPM)")
    ap.add_argument("--out", default="tests/data/tok", help="directory for smollm2.golden / gemma3.golden")
    ap.add_argument("--no-hf", action="store_true", help="skip the HF transformers cross-check")
    ap.add_argument("--model", help="fuzz mode: model path")
    ap.add_argument("--golden", help="fuzz mode: output golden path")
    ap.add_argument("--fuzz", type=int, default=0, help="fuzz mode: number of random texts")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()

    if a.model:
        if not a.golden or a.fuzz <= 0:
            ap.error("--model needs --golden and --fuzz N")
        llm = _load_llama(a.model)
        write_golden(a.golden, a.model, fuzz_corpus(a.fuzz, a.seed), llm, None, "fuzz seed %d" % a.seed)
        return 0

    if not a.smollm2 and not a.gemma:
        ap.error("give --smollm2 and/or --gemma")
    os.makedirs(a.out, exist_ok=True)
    for name, path in (("smollm2", a.smollm2), ("gemma3", a.gemma)):
        if not path:
            continue
        llm = _load_llama(path)
        hf = None if a.no_hf else _load_hf(path)
        out = os.path.join(a.out, name + ".golden")
        n = write_golden(out, path, CORPUS, llm, hf, KNOWN_HF_DIFFS if hf is not None else "")
        print("%s: %d cases, %s" % (out, 2 * len(CORPUS), "%d differ from HF" % n if hf is not None else "no HF"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
