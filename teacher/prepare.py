"""`python -m teacher.prepare MODEL [GGUF_FILE]`: the Hugging Face folder for a teacher model,
de-quantising and caching a GGUF file once (teacher/hf.py); prints the folder's path."""
import sys

from teacher.hf import prepare_model

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m teacher.prepare MODEL [GGUF_FILE]")
    print(prepare_model(*sys.argv[1:]))
