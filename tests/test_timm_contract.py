"""timm's generic model contracts for every model diffzoo registers with timm.

The checks follow the generic tests timm runs on its own ``vit_*`` models (forward with gradient
checkpointing, backward, default config, ``forward_intermediates``, ``features_only``, FX feature
extraction forward/backward, TorchScript, FX + TorchScript), at small input sizes. Where a contract does
not apply to a family, the test asserts the documented reason instead of skipping silently.
"""

from __future__ import annotations

import math

import pytest
import timm
import torch
from timm.models import get_notrace_functions, get_notrace_modules

import diffzoo.models  # noqa: F401  (registers the models)

fx = pytest.importorskip("torchvision.models.feature_extraction")

VITS = sorted(timm.list_models("diffvit_*") + timm.list_models("softvit_*"))
SPEECH = sorted(timm.list_models(["diffkwt_*", "softkwt_*", "diffast_*", "softast_*"]))
BIG = ("_224", "tiny_patch4_32")  # 12-block models: slow on 2 CPU cores


def _mark(names: list[str]) -> list:
    return [pytest.param(n, marks=pytest.mark.slow) if n.endswith(BIG) else n for n in names]


def _small(name: str) -> dict:
    """Architecture unchanged, small images: the 224 models get 32x32 inputs."""
    return {"img_size": 32} if name.endswith("_224") else {}


def _input(model: torch.nn.Module, batch: int) -> torch.Tensor:
    c = model.pretrained_cfg["input_size"][0]
    return torch.randn(batch, c, *model.patch_embed.img_size)


def _fx_model(model: torch.nn.Module, train: bool = False) -> torch.nn.Module:
    """The feature extractor timm's tests build: torchvision's FX tracer with timm's leaf modules."""
    tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                         param_shapes_constant=True)
    train_nodes, eval_nodes = fx.get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    train_return = [train_nodes[-1]]
    if train:
        graph = fx.NodePathTracer(**tracer_kwargs).trace(model)
        nodes = list(reversed(graph.nodes))
        outputs = [n.name for n in nodes[0]._input_nodes.keys()]
        names = [n.name for n in nodes]
        train_return = [train_nodes[-names.index(o)] for o in outputs]
    return fx.create_feature_extractor(model, train_return_nodes=train_return, eval_return_nodes=[eval_nodes[-1]],
                                       tracer_kwargs=tracer_kwargs)


# -- ViT family -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", _mark(VITS))
def test_vit_forward_and_grad_checkpointing(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, **_small(name)).eval()
    x = _input(model, 2)
    out = model(x)
    assert out.shape == (2, model.num_classes) and torch.isfinite(out).all()
    model.set_grad_checkpointing()
    torch.testing.assert_close(model(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", _mark(VITS))
def test_vit_backward_reaches_every_parameter(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=42, **_small(name)).train()
    out = model(_input(model, 2))
    assert out.shape == (2, 42)
    out.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("name", _mark(VITS))
def test_vit_default_cfg_and_classifier_reset(name: str) -> None:
    model = timm.create_model(name, **_small(name)).eval()
    cfg, sd = model.pretrained_cfg, model.state_dict()
    assert model.num_classes == cfg["num_classes"] and model.num_features > 0 and model.head_hidden_size > 0
    assert f"{cfg['classifier']}.weight" in sd and f"{cfg['first_conv']}.weight" in sd
    data = timm.data.resolve_data_config({}, model=model)
    assert data["input_size"][0] == model.patch_embed.proj.in_channels == len(data["mean"]) == len(data["std"])
    x = _input(model, 1)
    grid = model.patch_embed.grid_size
    feats = model.forward_features(x)
    assert feats.shape == (1, model.num_prefix_tokens + grid[0] * grid[1], model.num_features)
    pre = model.forward_head(feats, pre_logits=True)
    assert pre.shape == (1, model.head_hidden_size)
    model.reset_classifier(0)
    assert model.num_classes == 0 and model(x).shape == pre.shape
    model = timm.create_model(name, num_classes=0, global_pool="", **_small(name)).eval()
    assert model(x).shape == feats.shape
    model = timm.create_model(name, global_pool="map", **_small(name)).eval()
    assert model(x).shape == (1, cfg["num_classes"])


@pytest.mark.parametrize("name", _mark(VITS))
def test_vit_forward_intermediates_and_pruning(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, **_small(name)).eval()
    x = _input(model, 1)
    info = timm.models.FeatureInfo(model.feature_info, len(model.feature_info))
    final, inter = model.forward_intermediates(x, output_fmt="NCHW")
    assert len(inter) == len(info.channels()) == len(model.blocks)
    for c, r, y in zip(info.channels(), info.reduction(), inter):
        assert y.shape[:2] == (1, c) and y.shape[-1] <= math.ceil(x.shape[-1] / r) + 1
    torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
    model.set_grad_checkpointing()
    torch.testing.assert_close(model.forward_intermediates(x)[0], final, rtol=1e-4, atol=1e-5)
    kept = model.prune_intermediate_layers(indices=[1])
    assert kept == [1] and len(model.blocks) == 2


@pytest.mark.parametrize("name", _mark(VITS))
@pytest.mark.parametrize("feature_cls", [None, "getter", "fx"])
def test_vit_features_only(name: str, feature_cls: str | None) -> None:
    torch.manual_seed(0)
    kw = {} if feature_cls is None else {"feature_cls": feature_cls}
    model = timm.create_model(name, features_only=True, out_indices=(-2, -1), **kw, **_small(name)).eval()
    c, h, w = timm.get_pretrained_cfg_value(name, "input_size")
    x = torch.randn(1, c, *((32, 32) if name.endswith("_224") else (h, w)))
    outs = model(x)
    assert len(outs) == 2
    for c, y in zip(model.feature_info.channels(), outs):
        if feature_cls == "fx":  # block outputs as traced: tokens (B, prefix + N, C), as for timm's vit_*
            assert y.dim() == 3 and y.shape[0] == 1 and y.shape[-1] == c
        else:  # forward_intermediates: patch grid (B, C, H, W)
            assert y.dim() == 4 and y.shape[:2] == (1, c)
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", _mark(VITS))
def test_vit_fx_forward_is_exact_and_backward_reaches_every_parameter(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, **_small(name)).eval()
    x = _input(model, 1)
    with torch.inference_mode():
        expected = model(x)
        got = torch.cat(tuple(_fx_model(model)(x).values()))
    assert torch.equal(got, expected)
    model = timm.create_model(name, num_classes=42, **_small(name)).train()
    traced = _fx_model(model, train=True)
    out = torch.cat(tuple(traced(_input(model, 2)).values()))
    out.mean().backward()
    assert out.shape[-1] == 42
    missing = [n for n, p in traced.named_parameters() if p.grad is None]
    assert not missing and sum(p.numel() for p in traced.parameters()) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", _mark(VITS))
def test_vit_torchscript_and_plain_fx_trace(name: str) -> None:
    torch.manual_seed(0)
    with timm.layers.set_layer_config(scriptable=True):
        model = timm.create_model(name, **_small(name)).eval()
    x = _input(model, 1)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(torch.jit.script(model)(x), expected, rtol=1e-4, atol=1e-5)
        # plain torch.fx (no leaf modules) traces through the attention as well
        torch.testing.assert_close(torch.fx.symbolic_trace(model)(x), expected, rtol=1e-4, atol=1e-5)
        scripted_fx = torch.jit.script(_fx_model(model))
        torch.testing.assert_close(torch.cat(tuple(scripted_fx(x).values())), expected, rtol=1e-4, atol=1e-5)


# -- speech family ----------------------------------------------------------------------------------
def _wave(model: torch.nn.Module, batch: int, seconds: float = 0.25) -> torch.Tensor:
    """timm's batch for the config ``input_size=(1, 1, T)``, shortened to ``seconds``."""
    c, h, t = model.pretrained_cfg["input_size"]
    return 0.1 * torch.randn(batch, c, h, int(t * seconds))


@pytest.mark.parametrize("name", _mark(SPEECH))
def test_speech_cfg_describes_the_waveform_input(name: str) -> None:
    model = timm.create_model(name).eval()
    c, h, t = model.pretrained_cfg["input_size"]
    assert (c, h) == (1, 1) and t == model.cfg.sample_rate  # one second of mono audio
    data = timm.data.resolve_data_config({}, model=model)
    assert data["mean"] == (0.0,) and data["std"] == (1.0,)  # the model normalises its log-mel itself
    x = _wave(model, 2)
    out = model(x)
    assert out.shape == (2, model.num_classes) and torch.isfinite(out).all()
    torch.testing.assert_close(model(x[:, 0, 0]), out)  # the same clip as a (B, T) waveform
    model.set_grad_checkpointing()
    torch.testing.assert_close(model(x), out, rtol=1e-4, atol=1e-5)
    feats = model.forward_features(x)
    assert model.forward_head(feats, pre_logits=True).shape == (2, model.head_hidden_size)
    model.reset_classifier(0)
    assert model(x).shape == (2, model.num_features)
    assert f"{model.pretrained_cfg['first_conv']}.weight" in model.state_dict()


@pytest.mark.parametrize("name", _mark(SPEECH))
def test_speech_backward_reaches_every_parameter(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=42).train()
    out = model(_wave(model, 2))
    assert out.shape == (2, 42)
    out.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"


def test_speech_contracts_that_do_not_apply() -> None:
    """Speech encoders take waveforms, not images: no spatial features, and no FX or TorchScript (the
    log-mel front end and the key-padding masks are Python control flow on shapes and keyword
    arguments). These are the documented limits; the assertions keep them in sync with the code."""
    name = "diffkwt_nano"
    model = timm.create_model(name).eval()
    assert not hasattr(model, "forward_intermediates") and not hasattr(model, "feature_info")
    with pytest.raises(AttributeError):
        timm.create_model(name, features_only=True)
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(model)
    with pytest.raises(RuntimeError):
        torch.jit.script(model)
