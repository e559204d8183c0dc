"""llama.cpp's source tree as the PyPI sdist of llama-cpp-python vendors it: the tests' references.

It holds `models/ggml-vocab-*.gguf` with llama.cpp's own tokenizations (`.inp` / `.out`), the
chat templates of real models under `models/templates/`, and `convert_hf_to_gguf.py` with
`gguf-py`. Fetched once with `pip download` (PyPI is reachable where the tests run) into the
same cache folder `../shared/tools/build-llama-cpp` uses; `make test` fetches it before the run.

    python -m benchmarks.llama_cpp_tree      # fetch it, print its path
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.36"
CACHE = Path.home() / ".cache" / "zeroserve-peer" / "src"
TREE = CACHE / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def llama_cpp_tree() -> Path:
    """The vendored llama.cpp tree, fetched and unpacked on first use (raises if it cannot be)."""
    if (TREE / "models").is_dir():
        return TREE
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        # NOTE: the suite's workers may ask at once; one fetches, the others wait for it.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (TREE / "models").is_dir():
            archive = CACHE / f"llama_cpp_python-{VERSION}.tar.gz"
            if not archive.is_file():
                command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps"]
                subprocess.run([*command, "-d", str(CACHE), f"llama-cpp-python=={VERSION}"], check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(CACHE, filter="data")
    return TREE


if __name__ == "__main__":
    print(llama_cpp_tree())
