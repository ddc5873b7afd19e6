"""torch.compile, torch.export, torch.fx and TorchScript contracts of diffzoo's layers and models.

Graph breaks are counted with ``torch._dynamo.explain``. Compiled training steps use the
``aot_eager`` backend (dynamo's graph capture plus AOTAutograd's joint forward/backward graph, without
Inductor's C++ code generation, which takes minutes on a small CPU); the Inductor runs are marked slow.
"""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import open_clip
import pytest
import timm
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import Tensor, nn

import diffzoo  # noqa: F401  (registers the timm and open_clip models)
from diffzoo.kernels import diff_attention, select_backend, use_backend
from diffzoo.kernels.registry import Call
from diffzoo.layers import Attention, Block, DiffAttention, DiffAttentionV2, RotaryEmbedding
from diffzoo.models.lm import CausalLM


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def graph_breaks(fn, *args, **kwargs) -> list[str]:
    """The reasons of every graph break dynamo hits while tracing ``fn(*args, **kwargs)``."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args, **kwargs)
    reasons = [b.reason.splitlines()[0] for b in explanation.break_reasons]
    assert explanation.graph_break_count == len(reasons)
    assert explanation.graph_count >= 1
    return reasons


def max_rel_diff(a: Tensor, b: Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def assert_grads_match(eager: nn.Module, compiled: nn.Module, tol: float = 1e-4) -> None:
    """Every parameter gradient agrees, relative to the largest gradient of the model (a gradient that is
    zero in exact arithmetic, such as a key bias under softmax, differs only by rounding noise)."""
    pairs = [(n, a.grad, b.grad) for (n, a), b in zip(eager.named_parameters(), compiled.parameters())]
    assert all(ga is not None and gb is not None for _, ga, gb in pairs)
    scale = max(ga.abs().max().item() for _, ga, _ in pairs)
    for name, ga, gb in pairs:
        assert (ga - gb).abs().max().item() <= tol * scale, name


# -- the default backend ---------------------------------------------------------------------------
def test_auto_resolves_to_the_blockwise_operator_on_cpu() -> None:
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 16)
    call = Call(q, k, v, None, None, False, 0.0, True)
    assert select_backend("diff", call).name == "blockwise"
    assert select_backend("softmax", call).name == "sdpa"
    gm, _ = torch._dynamo.export(lambda q, k, v: diff_attention(q, k, v, torch.tensor(0.3)))(q, k, v)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.diffzoo.blockwise_diff_attention.default in targets


# -- zero graph breaks -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: DiffAttention(32, 2),
        lambda: DiffAttention(32, 2, 1, causal=True, rope=True),
        lambda: DiffAttentionV2(32, 2, rope=True),
        lambda: Attention(32, 4, causal=True),
        lambda: DiffAttention(32, 2, attn_drop=0.2).train(),  # dropout seed drawn as a tensor
    ],
    ids=["diff", "diff-gqa-causal-rope", "diff_v2-rope", "softmax-causal", "diff-dropout"],
)
def test_attention_layers_have_no_graph_breaks(make) -> None:
    torch.manual_seed(0)
    assert graph_breaks(make(), torch.randn(2, 5, 32)) == []


def test_attention_with_masks_and_positions_has_no_graph_breaks() -> None:
    layer = DiffAttention(32, 2, rope=True)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[0, :2] = True
    positions = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    assert graph_breaks(layer, torch.randn(2, 6, 32), key_padding_mask=padding, positions=positions) == []


@pytest.mark.parametrize("name", ["diffvit_nano_patch7_28", "softvit_nano_patch7_28"])
def test_vit_has_no_graph_breaks(name: str) -> None:
    model = timm.create_model(name)
    assert graph_breaks(model, torch.randn(2, 1, 28, 28)) == []


def test_speech_model_has_no_graph_breaks() -> None:
    model = timm.create_model("diffkwt_nano")  # training mode: SpecAugment masks are traced too
    assert graph_breaks(model, torch.randn(2, 16000)) == []


def test_clip_towers_have_no_graph_breaks() -> None:
    model = open_clip.create_model("DiffCLIP-nano")
    size = model.visual.image_size
    size = size if isinstance(size, tuple) else (size, size)
    assert graph_breaks(model.encode_image, torch.randn(2, 3, *size)) == []
    tokens = open_clip.get_tokenizer("DiffCLIP-nano")(["a photo of a digit", "seven"])
    assert graph_breaks(model.encode_text, tokens) == []


def test_lm_has_no_graph_breaks_with_and_without_padding() -> None:
    lm = CausalLM.from_preset("lm_tiny")
    tokens = torch.randint(0, 256, (2, 9))
    assert graph_breaks(lm, tokens) == []
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, :3] = True
    assert graph_breaks(lm, tokens, key_padding_mask=padding) == []


# -- compiled training step ------------------------------------------------------------------------
def _train_step_matches(make, x: Tensor, y: Tensor, backend: str) -> None:
    torch.manual_seed(0)
    eager = make()
    compiled = copy.deepcopy(eager)

    def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        out = model(x)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    loss_e = loss_fn(eager, x, y)
    loss_e.backward()
    loss_c = torch.compile(loss_fn, fullgraph=True, backend=backend)(compiled, x, y)
    loss_c.backward()
    assert abs(loss_e.item() - loss_c.item()) <= 1e-5 * abs(loss_e.item())
    assert_grads_match(eager, compiled)


def _family(family: str) -> tuple:
    """A model factory and one batch ``(x, y)`` of the ViT or the LM."""
    torch.manual_seed(1)
    if family == "vit":
        x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
        return lambda: timm.create_model("diffvit_nano_patch7_28", num_classes=10), x, y
    x, y = torch.randint(0, 256, (2, 12)), torch.randint(0, 256, (2, 12))
    return lambda: CausalLM.from_preset("lm_tiny"), x, y


@pytest.mark.parametrize("family", ["vit", "lm"])
def test_fullgraph_training_step_matches_eager(family: str) -> None:
    _train_step_matches(*_family(family), backend="aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["vit", "lm"])
def test_fullgraph_training_step_matches_eager_with_inductor(family: str) -> None:
    _train_step_matches(*_family(family), backend="inductor")


def test_compiled_blockwise_gradients_include_lambda() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 7, 8, requires_grad=True)
    k = torch.randn(2, 4, 7, 8, requires_grad=True)
    v = torch.randn(2, 2, 7, 16, requires_grad=True)
    lam = torch.tensor(0.4, requires_grad=True)
    w = torch.randn(2, 2, 7, 16)

    def f(q, k, v, lam):
        return (diff_attention(q, k, v, lam, causal=True) * w).sum()

    eager = torch.autograd.grad(f(q, k, v, lam), (q, k, v, lam))
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, lam), (q, k, v, lam))
    for a, b in zip(compiled, eager):
        assert max_rel_diff(a, b) < 1e-6


# -- backend selection under compile ---------------------------------------------------------------
def test_use_backend_retraces_a_compiled_layer() -> None:
    torch.manual_seed(0)
    layer = DiffAttention(32, 2).eval()
    x = torch.randn(2, 5, 32)
    seen: list[list] = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        seen.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    compiled = torch.compile(layer, backend=record, fullgraph=True)
    with torch.no_grad():
        out_default = compiled(x)
        with use_backend("reference"):
            out_reference = compiled(x)
        assert torch.allclose(out_default, layer(x), atol=1e-6)
        with use_backend("reference"):
            assert torch.allclose(out_reference, layer(x), atol=1e-6)
    assert len(seen) == 2  # the second call did not reuse the graph of the first backend
    blockwise = torch.ops.diffzoo.blockwise_diff_attention.default
    assert blockwise in seen[0] and blockwise not in seen[1]


def test_use_backend_is_local_to_its_thread() -> None:
    from diffzoo.kernels import requested_backend

    seen: list[str] = []
    with use_backend("reference"):
        thread = threading.Thread(target=lambda: seen.append(requested_backend()))
        thread.start()
        thread.join()
        assert requested_backend() == "reference"
    assert seen == ["auto"]
    assert requested_backend() == "auto"


# -- torch.export ----------------------------------------------------------------------------------
def test_export_vit_matches_eager() -> None:
    torch.manual_seed(0)
    model = timm.create_model("diffvit_nano_patch7_28").eval()
    x = torch.randn(2, 1, 28, 28)
    program = torch.export.export(model, (x,))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.diffzoo.blockwise_diff_attention.default) == len(model.blocks)
    with torch.no_grad():
        assert torch.equal(program.module()(x), model(x))
        x2 = torch.randn(2, 1, 28, 28)
        assert torch.equal(program.module()(x2), model(x2))


def test_export_lm_matches_eager_with_a_dynamic_length() -> None:
    torch.manual_seed(0)
    lm = CausalLM.from_preset("lm_tiny").eval()
    tokens = torch.randint(0, 256, (2, 8))
    length = torch.export.Dim("length", min=2, max=64)
    program = torch.export.export(lm, (tokens,), dynamic_shapes=({1: length},))
    with torch.no_grad():
        assert torch.equal(program.module()(tokens), lm(tokens))
        longer = torch.randint(0, 256, (2, 21))
        assert torch.equal(program.module()(longer), lm(longer))


def test_compiled_and_exported_lm_match_eager_on_left_padded_input() -> None:
    """Padding takes the masked path (row fix-up, RoPE positions from the padding) in every mode."""
    torch.manual_seed(0)
    lm = CausalLM.from_preset("lm_tiny").eval()
    tokens = torch.randint(0, 256, (2, 9))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, :3] = True
    with torch.no_grad():
        eager = lm(tokens, key_padding_mask=padding)
        compiled = torch.compile(lm, fullgraph=True, backend="aot_eager")(tokens, key_padding_mask=padding)
        program = torch.export.export(lm, (tokens,), {"key_padding_mask": padding})
        exported = program.module()(tokens, key_padding_mask=padding)
    assert torch.equal(compiled, eager)
    assert torch.equal(exported, eager)


# -- torch.fx --------------------------------------------------------------------------------------
NO_ATTN_ARGS = dict(key_padding_mask=None, attn_mask=None, causal=None, positions=None, kv_cache=None, backend=None)


@pytest.mark.parametrize(
    "kwargs",
    [dict(attn="diff"), dict(attn="diff_v2"), dict(attn="softmax"), dict(attn="diff", rope=True, causal=True)],
    ids=["diff", "diff_v2", "softmax", "diff-rope-causal"],
)
def test_fx_symbolic_trace_of_a_block_matches_eager(kwargs: dict) -> None:
    torch.manual_seed(0)
    block = Block(32, 4, **kwargs).eval()
    traced = torch.fx.symbolic_trace(block, concrete_args=NO_ATTN_ARGS)
    kernels = [n.target.__name__ for n in traced.graph.nodes if n.op == "call_function" and hasattr(n.target, "__name__")]
    assert ("diff_attention" if kwargs["attn"] == "diff" else "attention") in kernels  # one node per kernel
    for shape in ((2, 5, 32), (3, 9, 32)):  # the graph is not specialised to the traced shape
        x = torch.randn(shape)
        assert torch.equal(traced(x), block(x))


@pytest.mark.parametrize("name", ["diffvit_nano_patch7_28", "softvit_nano_patch7_28"])
def test_fx_symbolic_trace_of_a_vit_matches_eager(name: str) -> None:
    model = timm.create_model(name).eval()
    traced = torch.fx.symbolic_trace(model)
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(traced(x), model(x))


# -- TorchScript -----------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: DiffAttention(32, 2), lambda: Block(32, 4, attn="softmax")])
def test_torchscript_refuses_with_the_reason(make) -> None:
    with pytest.raises(RuntimeError, match=r"cannot be compiled with torch.jit.script.*torch.compile"):
        torch.jit.script(make())


def test_open_clip_jit_reports_why_it_returns_an_unscripted_model(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        model = open_clip.create_model("DiffCLIP-nano", jit=True)
    assert not isinstance(model, torch.jit.ScriptModule)
    assert "DiffAttention cannot be compiled with torch.jit.script" in caplog.text


# -- RoPE without a table --------------------------------------------------------------------------
def test_rope_rotates_by_fp32_angles_at_any_position() -> None:
    rope = RotaryEmbedding(8, base=100.0)
    x = torch.randn(1, 2, 3, 8)
    positions = torch.tensor([0, 7, 100_000])  # far beyond any default table length
    angles = (positions[:, None].float() * (100.0 ** (-torch.arange(0, 8, 2).float() / 8))).double()
    x1, x2 = x.double().chunk(2, dim=-1)
    expected = torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), dim=-1)
    assert torch.allclose(rope(x, positions).double(), expected, atol=1e-5)
    batched = rope(x, positions.expand(1, 3))  # (B, N) positions give the same rotation
    assert torch.equal(batched, rope(x, positions))


# -- the Triton backend (the default on CUDA) ------------------------------------------------------
_TRITON_PROBE = """
import torch, torch._dynamo
from diffzoo.layers import DiffAttention
layer = DiffAttention(32, 2, backend="triton")
explanation = torch._dynamo.explain(layer)(torch.randn(2, 5, 32))
print("BREAKS", explanation.graph_break_count)
"""


def test_triton_backend_has_no_graph_breaks() -> None:
    """Traced in Triton's CPU interpreter (it must be switched on before triton's first import)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", _TRITON_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "BREAKS 0" in result.stdout, result.stdout + result.stderr[-2000:]
