"""Loading, exporting, converting and evaluating a model need neither Lightning nor torchmetrics.

Run in a fresh interpreter where importing ``lightning``, ``pytorch_lightning`` or ``torchmetrics`` fails
(``sys.modules[name] = None``), as on a machine that installed diffzoo to score a checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("lightning", "pytorch_lightning", "torchmetrics")

PRELUDE = f"""
import sys
for name in {BLOCKED!r}:
    sys.modules[name] = None  # any import of it raises ImportError
"""

SCRIPT = """
import json
from pathlib import Path

import numpy as np
import timm
import torch

from diffzoo.evaluation import encode_pairs, pair_retrieval, zero_shot_accuracy, zero_shot_classifier
from diffzoo.models.lm import CausalLM
from types import SimpleNamespace

from diffzoo.weights import export_lm, load_clip, load_converted, load_exported, load_lm, save_safetensors
from diffzoo.weights.convert import convert_lm, save_converted

out = Path(sys.argv[1])
torch.manual_seed(0)
checks = {}

# a ViT export reloads through timm with the same logits
vit = timm.create_model("diffvit_nano_patch7_28").eval()
save_safetensors(vit.state_dict(), out / "vit.safetensors", "diffvit_nano_patch7_28", {"num_classes": 10})
x = torch.randn(2, 1, 28, 28)
with torch.no_grad():
    checks["vit"] = torch.equal(load_exported(out / "vit.safetensors").eval()(x), vit(x))

# an LM export and a converted LM folder reload with the same logits
lm = CausalLM.from_preset("lm_tiny", attn="softmax").eval()
hparams = {"model": "lm_tiny", "attn": "softmax", "vocab_size": lm.config.vocab_size, "model_kwargs": {}}
export_lm(SimpleNamespace(model=lm, config=lm.config, hparams=hparams), out / "lm.safetensors")
tokens = torch.randint(0, lm.config.vocab_size, (1, 12))
converted = convert_lm(lm, "diff_v2").eval()
save_converted(converted, out / "conv", {"family": "lm", "attn": "diff_v2", "build": {"config": vars(converted.config)}})
with torch.no_grad():
    checks["lm"] = torch.equal(load_lm(out / "lm.safetensors").eval()(tokens), lm(tokens))
    checks["converted"] = torch.equal(load_converted(out / "conv")(tokens), converted(tokens))

# a tiny CLIP scores zero-shot classification and retrieval
model, _, tokenizer = load_clip("DiffCLIP-nano")
classifier = zero_shot_classifier(model, tokenizer, ["red", "green", "blue"], ["a {} square."])
images, labels = torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 2, 0, 1, 2])
scores = zero_shot_accuracy(model, classifier, [(images, labels)], ks=(1, 2))
recall = pair_retrieval(*encode_pairs(model, [(images, tokenizer(["a red square."] * 3 + ["a blue square."] * 3))]))
checks["zero_shot"] = scores["n"] == 6 and 0.0 <= scores["top1"] <= scores["top2"] <= 1.0
checks["retrieval"] = 0.0 <= recall["mean_recall"] <= 1.0

# needle retrieval of the LM (byte tokens, as the LM recipes use)
class Bytes:
    def encode(self, text):
        return list(text.encode("utf-8"))

from diffzoo.evaluation import evaluate_retrieval
distractor = np.frombuffer(("the quick brown fox jumps over the lazy dog. " * 40).encode(), dtype=np.uint8)
lm_bytes = CausalLM.from_preset("lm_tiny", attn="softmax", vocab_size=256).eval()
cells = evaluate_retrieval(lm_bytes, distractor, Bytes(), lengths=(96,), needle_counts=(1,), depths=(0.5,), samples=2)
checks["needle_retrieval"] = len(cells) == 1 and 0.0 <= cells[0]["accuracy"] <= 1.0

checks["training_libraries_loaded"] = sorted(
    name for name, module in sys.modules.items() if module is not None and name.split(".")[0] in BLOCKED
)
print(json.dumps(checks))
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_load_export_convert_and_zero_shot_without_lightning(tmp_path: Path) -> None:
    script = PRELUDE + f"BLOCKED = {BLOCKED!r}\n" + textwrap.dedent(SCRIPT)
    done = _run(script, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    checks = json.loads(done.stdout.strip().splitlines()[-1])
    assert checks == {"vit": True, "lm": True, "converted": True, "zero_shot": True, "retrieval": True,
                      "needle_retrieval": True, "training_libraries_loaded": []}


def test_the_block_is_real() -> None:
    """The prelude does make Lightning unimportable: the training package fails to import under it."""
    done = _run(PRELUDE + "import diffzoo.tasks\n")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith(("ImportError", "ModuleNotFoundError")) and "lightning" in last
