"""TEST ONLY: train.py under torchrun with NaN/inf injected into rank 1 (tests/test_nonfinite.py).

``NONFINITE_TEST_PLAN="2:nan,4:loss,6:inf"`` poisons, on rank 1 only, the gradients (after DDP's
averaging, so the other rank's stay finite) or the loss of those steps. After every step each
rank writes a digest of its weights to ``<out_dir>/rank<r>.json``. Nothing here is imported by
the project: it patches the Trainer in this process only.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import train  # noqa: E402
import trainer.trainer as trainer_mod  # noqa: E402

PLAN = dict(item.split(":") for item in os.environ["NONFINITE_TEST_PLAN"].split(","))
RANK = int(os.environ.get("RANK", "0"))
current = {"step": 0}
real_clip, real_step = trainer_mod.Trainer.clip_grads, trainer_mod.Trainer.train_step
real_fb = trainer_mod.forward_backward


def clip(self):
    kind = PLAN.get(str(self.state.step + 1))
    if RANK == 1 and kind in ("nan", "inf"):
        p = next(p for p in self.raw_model.parameters() if p.grad is not None)
        p.grad.view(-1)[0] = float(kind)
    return real_clip(self)


def forward_backward(*args):
    loss = real_fb(*args)
    return loss * float("nan") if RANK == 1 and PLAN.get(str(current["step"])) == "loss" else loss


def train_step(self):
    current["step"] = self.state.step + 1
    out = real_step(self)
    path = self.out_dir / f"rank{RANK}.json"
    digests = json.loads(path.read_text()) if path.exists() else {}
    weights = b"".join(v.numpy().tobytes() for v in self.raw_model.state_dict().values())
    digests[str(self.state.step)] = hashlib.sha256(weights).hexdigest()
    path.write_text(json.dumps(digests))
    return out


trainer_mod.Trainer.clip_grads, trainer_mod.Trainer.train_step = clip, train_step
trainer_mod.forward_backward = forward_backward

if __name__ == "__main__":
    from trainer.command_line import cli

    cli(train.train)
