"""Count the graphs torch.compile builds for the model during a training run (CPU, cheap).

``count_compiles(out_dir, data_dir, *overrides)`` runs ``train.train`` in this process with
``torch.compile`` of the model sent to a backend that records each graph it is given (its input
shapes) and runs it eagerly: no Inductor, so a ``compile=true`` run costs seconds. As a script
under torchrun (``python -m torch.distributed.run --nproc_per_node=2 tests/count_compiles.py
OUT DATA overrides...``) every rank writes its graphs to ``OUT/compiles_<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def count_compiles(out_dir: Path, data_dir: Path, *overrides: str) -> list[list]:
    """The graphs compiled for the model, each as the list of its inputs' shapes."""
    import train
    from helpers import fast_config

    graphs: list[list] = []

    def counting(gm, example_inputs):  # noqa: ANN001, ANN202
        graphs.append([list(getattr(t, "shape", ())) for t in example_inputs])
        return gm.forward

    original = torch.compile

    def compile_model(target, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        # the model's regions (modules and their bound methods); the optimizer's stay as they are
        if isinstance(getattr(target, "__self__", target), torch.nn.Module):
            kwargs["backend"] = counting
        return original(target, *args, **kwargs)

    torch.compile = compile_model
    try:
        torch._dynamo.reset()
        typed, plain = fast_config(out_dir, data_dir, "compile=true", *overrides)
        train.train(typed, plain)
    finally:
        torch.compile = original
    return graphs


if __name__ == "__main__":
    out, data, *rest = sys.argv[1:]
    found = count_compiles(Path(out), Path(data), *rest)
    rank = int(os.environ.get("RANK", "0"))
    (Path(out) / f"compiles_{rank}.json").write_text(json.dumps(found))
