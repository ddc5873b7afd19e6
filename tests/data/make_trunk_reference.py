"""Write ``trunk_reference.pt``: small LM, speech and CLIP text-tower weights with their outputs.

The file pins the state-dict names and the outputs of these families for fixed weights, so a change to
how the models run their blocks can be checked against it (``tests/test_trunk.py``). Regenerate only
when a change of outputs or parameter names is intended::

    PYTHONPATH=$PWD python tests/data/make_trunk_reference.py
"""

from __future__ import annotations

from pathlib import Path

import torch

from diffzoo.models.clip import DiffTextTower
from diffzoo.models.lm import CausalLM, LMConfig, generate
from diffzoo.models.speech import SpeechTransformer

LM_CFG = dict(vocab_size=64, dim=32, depth=3, num_heads=4, num_kv_heads=2, intermediate_size=48)
SPEECH_CFG = dict(num_classes=3, embed_dim=16, depth=3, num_heads=2, n_mels=16, patch_freq=8, patch_time=2,
                  max_seconds=0.5, n_fft=400, win_length=400)
TEXT_CFG = dict(embed_dim=16, context_length=12, vocab_size=50, width=16, heads=4, layers=3)


def build() -> dict:
    torch.manual_seed(0)
    out: dict = {}
    lm = CausalLM(LMConfig(**LM_CFG)).eval()
    tokens = torch.randint(1, 64, (2, 9))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, :3] = True
    with torch.no_grad():
        new, scores = generate(lm, tokens, 4, prompt_padding=padding, return_logits=True)
        out["lm"] = dict(
            state_dict=lm.state_dict(), tokens=tokens, padding=padding, logits=lm(tokens),
            padded_logits=lm(tokens, key_padding_mask=padding), new=new, scores=scores,
        )
    speech = SpeechTransformer(**SPEECH_CFG).eval()
    wave = torch.randn(2, 6000)
    lengths = torch.tensor([6000, 4100])
    with torch.no_grad():
        feats = speech.forward_features(wave, lengths)
        out["speech"] = dict(
            state_dict=speech.state_dict(), wave=wave, lengths=lengths, logits=speech(wave, lengths),
            frames=feats.frames.clone(), cls_token=feats.cls_token.clone(),
        )
    text = DiffTextTower(**TEXT_CFG, diffzoo={"lambda_init": 0.8}).eval()
    ids = torch.randint(1, 40, (2, 12))
    ids[0, 7], ids[1, 11] = 49, 49  # EOT: the largest id
    with torch.no_grad():
        inter = text.forward_intermediates(ids, indices=[0, 2], normalize_intermediates=True)
        out["text"] = dict(
            state_dict=text.state_dict(), ids=ids, features=text(ids),
            intermediates=inter["text_intermediates"], inter_features=inter["text_features"],
        )
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("trunk_reference.pt")
    torch.save(build(), path)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
