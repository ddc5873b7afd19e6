"""The shared transformer stack (:class:`diffzoo.layers.Transformer`) and the families built on it.

Reference outputs: ``tests/data/trunk_reference.pt`` holds weights and outputs of small LM, speech and
CLIP text-tower models written by ``tests/data/make_trunk_reference.py`` with the code that ran its
own block loops; today's models must load those weights under the same names and reproduce the outputs.
On the same machine the old block loops (copied below) and the stack give bit-identical results.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from diffzoo.layers import Block, KVCache, Transformer, drop_path_rates, take_indices
from diffzoo.models.clip import DiffTextTower
from diffzoo.models.lm import CausalLM, LMConfig, generate, positions_from_padding
from diffzoo.models.speech import SpeechTransformer

REFERENCE = Path(__file__).parent / "data" / "trunk_reference.pt"
LM_CFG = dict(vocab_size=64, dim=32, depth=3, num_heads=4, num_kv_heads=2, intermediate_size=48)
SPEECH_CFG = dict(num_classes=3, embed_dim=16, depth=3, num_heads=2, n_mels=16, patch_freq=8, patch_time=2,
                  max_seconds=0.5, n_fft=400, win_length=400)
TEXT_CFG = dict(embed_dim=16, context_length=12, vocab_size=50, width=16, heads=4, layers=3)


@pytest.fixture(scope="module")
def ref() -> dict:
    return torch.load(REFERENCE, weights_only=True)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    # The reference was computed on another machine's CPU: allow float rounding of a different SIMD path.
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# -- saved weights reload under the same names and give the saved outputs ----------------------------
def test_lm_reference_weights_and_outputs(ref) -> None:
    r = ref["lm"]
    model = CausalLM(LMConfig(**LM_CFG)).eval()
    model.load_state_dict(r["state_dict"], strict=True)
    assert set(model.state_dict()) == set(r["state_dict"])
    with torch.no_grad():
        _close(model(r["tokens"]), r["logits"])
        _close(model(r["tokens"], key_padding_mask=r["padding"]), r["padded_logits"])
        new, scores = generate(model, r["tokens"], 4, prompt_padding=r["padding"], return_logits=True)
    assert torch.equal(new, r["new"])
    _close(scores, r["scores"])


def test_speech_reference_weights_and_outputs(ref) -> None:
    r = ref["speech"]
    model = SpeechTransformer(**SPEECH_CFG).eval()
    model.load_state_dict(r["state_dict"], strict=True)
    with torch.no_grad():
        _close(model(r["wave"], r["lengths"]), r["logits"])
        feats = model.forward_features(r["wave"], r["lengths"])
    _close(feats.frames, r["frames"])
    _close(feats.cls_token, r["cls_token"])


def test_text_tower_reference_weights_and_outputs(ref) -> None:
    r = ref["text"]
    model = DiffTextTower(**TEXT_CFG, diffzoo={"lambda_init": 0.8}).eval()
    model.load_state_dict(r["state_dict"], strict=True)
    with torch.no_grad():
        _close(model(r["ids"]), r["features"])
        inter = model.forward_intermediates(r["ids"], indices=[0, 2], normalize_intermediates=True)
    assert len(inter["text_intermediates"]) == 2
    for a, b in zip(inter["text_intermediates"], r["intermediates"]):
        _close(a, b)
    _close(inter["text_features"], r["inter_features"])


# -- bit-identical to the block loops the models ran before ------------------------------------------
def _old_lm_forward(model: CausalLM, tokens, key_padding_mask=None, kv_caches=None):
    positions = None if key_padding_mask is None else positions_from_padding(key_padding_mask, tokens.shape[1])
    x = model.tok_embeddings(tokens)
    for i, block in enumerate(model.blocks):
        x = block(x, key_padding_mask=key_padding_mask, positions=positions,
                  kv_cache=None if kv_caches is None else kv_caches[i])
    return model.output(model.norm(x))


def test_lm_bit_identical_to_block_loop(ref) -> None:
    r = ref["lm"]
    model = CausalLM(LMConfig(**LM_CFG)).eval()
    model.load_state_dict(r["state_dict"])
    tokens, padding = r["tokens"], r["padding"]
    with torch.no_grad():
        assert torch.equal(model(tokens, key_padding_mask=padding), _old_lm_forward(model, tokens, padding))
        new_caches, old_caches = model.make_kv_caches(2, 12), model.make_kv_caches(2, 12)
        assert torch.equal(model(tokens[:, :6], key_padding_mask=padding[:, :6], kv_caches=new_caches),
                           _old_lm_forward(model, tokens[:, :6], padding[:, :6], old_caches))
        assert torch.equal(model(tokens[:, 6:], key_padding_mask=padding, kv_caches=new_caches),
                           _old_lm_forward(model, tokens[:, 6:], padding, old_caches))


def test_speech_bit_identical_with_drop_path_in_training(ref) -> None:
    r = ref["speech"]
    model = SpeechTransformer(**SPEECH_CFG, drop_path_rate=0.3)
    model.load_state_dict(r["state_dict"])
    model.train()
    model.frontend.eval()  # no SpecAugment: the random draws below are the drop-path ones only
    torch.manual_seed(3)
    new = model(r["wave"], r["lengths"])
    torch.manual_seed(3)
    x, padded = model.tokenize(r["wave"], r["lengths"])
    x = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
    mask = nn.functional.pad(padded, (1, 0), value=False)
    for blk in model.blocks:
        x = blk(x, key_padding_mask=mask)
    old = model.head(model.norm(x)[:, 0])
    assert torch.equal(new, old)
    assert [b.drop_path1.p for b in model.blocks] == pytest.approx([0.0, 0.15, 0.3])


def test_text_tower_bit_identical_to_block_loop(ref) -> None:
    r = ref["text"]
    model = DiffTextTower(**TEXT_CFG, diffzoo={"lambda_init": 0.8}).eval()
    model.load_state_dict(r["state_dict"])
    with torch.no_grad():
        x, eot, pad = model._embed(r["ids"])
        for blk in model.blocks:
            x = blk(x, key_padding_mask=pad)
        assert torch.equal(model(r["ids"]), model._pool(model.ln_final(x), eot))


# -- the stack itself ---------------------------------------------------------------------------------
def test_stack_is_a_list_of_blocks_with_plain_names() -> None:
    stack = Transformer(32, 3, 4, attn="diff", drop_path_rate=0.2)
    assert len(stack) == 3 and all(isinstance(b, Block) for b in stack)
    assert [b.depth for b in stack] == [0, 1, 2]
    assert [b.drop_path1.p for b in stack] == drop_path_rates(0.2, 3)
    assert drop_path_rates(0.2, 3) == pytest.approx([0.0, 0.1, 0.2])
    assert next(iter(stack.state_dict())).startswith("0.")
    assert isinstance(stack[:2], nn.ModuleList) and not isinstance(stack[:2], Transformer) and len(stack[:2]) == 2
    with pytest.raises(TypeError, match="drop_path_rate"):
        Transformer(32, 2, 4, drop_path=0.1)
    with pytest.raises(ValueError, match="drop_path_rate=1.5"):
        Transformer(32, 2, 4, drop_path_rate=1.5)


def test_take_indices() -> None:
    assert take_indices(4, None) == ([0, 1, 2, 3], 3)
    assert take_indices(4, 2) == ([2, 3], 3)
    assert take_indices(4, [0, -1]) == ([0, 3], 3)
    with pytest.raises(ValueError, match="block index 4"):
        take_indices(4, [4])
    with pytest.raises(ValueError, match="indices=5"):
        take_indices(4, 5)


def test_forward_intermediates_match_forward_and_stop_early() -> None:
    torch.manual_seed(0)
    stack = Transformer(32, 4, 4, attn="diff", causal=True).eval()
    x = torch.randn(2, 6, 32)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    with torch.no_grad():
        full = stack(x, key_padding_mask=pad)
        final, inter = stack.forward_intermediates(x, [1, 3], key_padding_mask=pad)
        head = stack[:2]
        y = x
        for blk in head:
            y = blk(y, key_padding_mask=pad)
        early, inter_early = stack.forward_intermediates(x, [1], stop_early=True, key_padding_mask=pad)
    assert torch.equal(final, full) and torch.equal(inter[1], full)
    assert torch.equal(inter[0], y) and torch.equal(early, y) and len(inter_early) == 1


def test_masks_reach_every_block() -> None:
    torch.manual_seed(0)
    stack = Transformer(32, 2, 4, attn="softmax").eval()
    x = torch.randn(1, 5, 32)
    changed = x.clone()
    changed[:, 4] = torch.randn(32)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        for kw in (dict(causal=True), dict(attn_mask=causal), dict(attn_mask=torch.zeros(5, 5).masked_fill(~causal, -torch.inf))):
            a, b = stack(x, **kw), stack(changed, **kw)
            assert torch.equal(a[:, :4], b[:, :4]), kw  # the last token reaches no earlier one in either block
        assert not torch.allclose(stack(x)[:, :4], stack(changed)[:, :4])


def test_kv_caches_and_rope_reach_every_block() -> None:
    from diffzoo.layers import RotaryEmbedding

    torch.manual_seed(0)
    rope = RotaryEmbedding(8)
    stack = Transformer(32, 3, 4, attn="diff", num_kv_heads=2, causal=True, rope=rope).eval()
    assert all(b.attn.rope is rope for b in stack)
    x = torch.randn(2, 7, 32)
    caches = stack.make_kv_caches(2, 7)
    assert len(caches) == 3 and all(isinstance(c, KVCache) for c in caches)
    with torch.no_grad():
        full = stack(x)
        steps = [stack(x[:, :4], kv_caches=caches)] + [stack(x[:, i:i + 1], kv_caches=caches) for i in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert all(c.seq_len == 7 for c in caches)
    with pytest.raises(ValueError, match="got 2 kv-caches for 3 blocks"):
        stack(x, kv_caches=caches[:2])


def _count_forward_calls(module: nn.Module) -> list[int]:
    """Record each call of ``module.forward`` (forward hooks do not fire in a checkpoint's recomputation)."""
    calls: list[int] = []
    inner = module.forward

    def forward(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)

    module.forward = forward
    return calls


def test_grad_checkpointing_recomputes_and_keeps_gradients() -> None:
    torch.manual_seed(0)
    stack = Transformer(32, 2, 4, attn="diff", drop_path_rate=0.2)
    x = torch.randn(2, 5, 32, requires_grad=True)
    torch.manual_seed(1)
    ref = stack(x)
    g_ref = torch.autograd.grad(ref.square().sum(), [x, *stack.parameters()])
    stack.set_grad_checkpointing(True)
    calls = _count_forward_calls(stack[0])
    torch.manual_seed(1)
    out = stack(x)
    g = torch.autograd.grad(out.square().sum(), [x, *stack.parameters()])
    assert torch.equal(out, ref)
    assert len(calls) == 2  # forward, then the recomputation in the backward pass
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)


def test_lm_gains_grad_checkpointing() -> None:
    torch.manual_seed(0)
    model = CausalLM(LMConfig(**LM_CFG))
    tokens = torch.randint(0, 64, (2, 8))
    ref = model(tokens)
    g_ref = torch.autograd.grad(ref.logsumexp(-1).sum(), list(model.parameters()))
    model.set_grad_checkpointing(True)
    assert model.grad_checkpointing
    calls = _count_forward_calls(model.blocks[1])
    out = model(tokens)
    g = torch.autograd.grad(out.logsumexp(-1).sum(), list(model.parameters()))
    assert torch.equal(out, ref) and len(calls) == 2
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)
    with torch.no_grad():  # generation with caches never recomputes
        generate(model.eval(), [[1, 2, 3]], 3)


def test_lm_forward_intermediates() -> None:
    torch.manual_seed(0)
    model = CausalLM(LMConfig(**LM_CFG)).eval()
    tokens = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        last = model.forward_intermediates(tokens, 1, norm=True)
        assert torch.equal(model.output(last[0]), model(tokens))
        assert len(model.forward_intermediates(tokens)) == 3


# -- one name for the baseline's head count -----------------------------------------------------------
def test_configs_name_the_baseline_heads_once_and_accept_the_former_name() -> None:
    import dataclasses

    from diffzoo.models.lm import LM_PRESETS
    from diffzoo.models.speech import SPEECH_CONFIGS, SpeechEncoderConfig

    new = LMConfig(dim=64, baseline_heads=8, baseline_kv_heads=2)
    old = LMConfig(dim=64, num_heads=8, num_kv_heads=2)
    assert new == old and (old.baseline_heads, old.baseline_kv_heads) == (8, 2)
    assert (old.num_heads, old.num_kv_heads) == (8, 2)  # the former names read the fields back
    names = {f.name for f in dataclasses.fields(LMConfig)} | {f.name for f in dataclasses.fields(SpeechEncoderConfig)}
    assert "num_heads" not in names and "num_kv_heads" not in names
    assert "num_heads" not in dataclasses.asdict(new)
    assert new.replace(num_heads=4).baseline_heads == 4 == dataclasses.replace(new, baseline_heads=4).baseline_heads
    assert all("num_heads" not in p for p in LM_PRESETS.values()) and all("num_heads" not in c for c in SPEECH_CONFIGS.values())
    assert CausalLM.from_preset("lm_tiny", num_heads=2).config.baseline_heads == 2
    with pytest.raises(ValueError, match="baseline_heads=8 and num_heads=4"):
        LMConfig(dim=64, baseline_heads=8, num_heads=4)
    model = SpeechTransformer(embed_dim=32, depth=1, num_heads=4, attn="softmax")
    assert model.cfg.baseline_heads == 4 == model.cfg.num_heads and model.blocks[0].attn.num_heads == 4
    diff = SpeechTransformer(embed_dim=32, depth=1, baseline_heads=4)
    assert diff.blocks[0].attn.num_heads == 2  # the layer's own count: two differential heads
    with pytest.raises(TypeError, match="heads_count"):
        SpeechTransformer(heads_count=2)


def test_checkpointing_never_recomputes_a_cached_step() -> None:
    torch.manual_seed(0)
    stack = Transformer(32, 2, 4, attn="diff", causal=True)
    stack.set_grad_checkpointing(True)
    x = torch.randn(1, 5, 32, requires_grad=True)
    caches = stack.make_kv_caches(1, 8)
    stack(x, kv_caches=caches).sum().backward()  # a recomputation would append the 5 tokens again
    assert [c.seq_len for c in caches] == [5, 5]
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_lm_attention_maps_and_outliers_recorded_together() -> None:
    import inspect

    from diffzoo.analysis import record_attention, record_outliers

    assert "return_attn" not in inspect.signature(CausalLM.forward).parameters
    torch.manual_seed(0)
    model = CausalLM(LMConfig(**LM_CFG)).eval()
    tokens = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = model(tokens)
        with record_attention(model) as maps, record_outliers(model) as out:
            logits = model(tokens)
    assert torch.equal(logits, expected)
    assert maps.names == [f"blocks.{i}.attn" for i in range(3)]
    assert sorted(out.names("hidden")) == [f"blocks.{i}" for i in range(3)]  # every block's output is seen
    assert all(m.attn1.shape == (2, 2, 8, 8) for m in maps)


def test_lm_exports_with_the_former_head_names_reload(tmp_path, ref) -> None:
    from diffzoo.weights.export import load_lm, save_safetensors

    r = ref["lm"]
    sd = {k: v for k, v in r["state_dict"].items() if k != "output.weight"}  # tied: exports store it once
    args = {**LM_CFG, "attn": "diff"}  # the metadata of exports written before the rename: num_heads, num_kv_heads
    assert "num_heads" in args and "num_kv_heads" in args
    model = load_lm(save_safetensors(sd, tmp_path / "model.safetensors", "lm_tiny", args)).eval()
    assert (model.config.baseline_heads, model.config.baseline_kv_heads) == (4, 2)
    with torch.no_grad():
        _close(model(r["tokens"]), r["logits"])
