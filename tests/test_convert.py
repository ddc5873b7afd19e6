"""Converting softmax models to differential attention: V2 is exact, V1 is a calibrated start."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import diffzoo  # noqa: F401  (registers the ViTs with timm)
from diffzoo.layers import Attention, DiffAttention, DiffAttentionV2
from diffzoo.models.lm import CausalLM, LMConfig
from diffzoo.weights import convert as cv

TOL = 1e-5


def _vit(name: str = "vit_tiny_patch16_224", **kwargs):
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, **kwargs).eval()


def test_v2_layer_is_exact_with_gqa_and_biases() -> None:
    torch.manual_seed(0)
    src = Attention(48, 6, num_kv_heads=2, qkv_bias=True, causal=True, rope=True).eval()
    for p in src.parameters():
        torch.nn.init.normal_(p, std=0.3)
    dst = cv.load_v2(DiffAttentionV2(48, 6, 2, qkv_bias=True, causal=True, rope=True), cv.weights_from_diffzoo(src))
    x = torch.randn(2, 9, 48)
    assert (src(x) - dst.eval()(x)).abs().max() <= TOL
    assert torch.count_nonzero(dst.lambda_proj.weight) == 0


def test_timm_vit_v2_exact_and_v1_gap() -> None:
    model = _vit(img_size=32, num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    v2 = cv.convert_timm_vit(model, "diff_v2").eval()
    from diffzoo.models.vit import TimmDiffAttention, TimmDiffAttentionV2

    assert sum(isinstance(m, TimmDiffAttentionV2) for m in v2.modules()) == 12
    with torch.no_grad():
        ref = model(x)
        assert (ref - v2(x)).abs().max() <= TOL
        v1 = cv.convert_timm_vit(model, "diff", calibration=x).eval()
        assert sum(isinstance(m, TimmDiffAttention) for m in v1.modules()) == 12
        gap = (ref - v1(x)).abs().max()
    assert torch.isfinite(gap) and gap > TOL  # V1 cannot be exact; the gap is reported, not hidden


def test_softvit_converts_into_diffvit_with_same_keys() -> None:
    import timm

    src = _vit("softvit_nano_patch7_28")
    conv = cv.convert_timm_vit(src, "diff_v2")
    target = timm.create_model("diffvit_nano_patch7_28", attn="diff_v2").eval()
    target.load_state_dict(conv.state_dict(), strict=True)
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        assert (src(x) - target(x)).abs().max() <= TOL


def test_v1_calibration_shrinks_the_gap() -> None:
    src = _vit("softvit_nano_patch7_28")
    x = torch.randn(16, 1, 28, 28)
    with torch.no_grad():
        ref = src(x)
        raw = (cv.convert_timm_vit(src, "diff").eval()(x) - ref).pow(2).mean()
        cal = (cv.convert_timm_vit(src, "diff", calibration=x).eval()(x) - ref).pow(2).mean()
    assert cal < raw


def _tiny_open_clip():
    from open_clip.model import CLIP

    torch.manual_seed(0)
    return CLIP(
        embed_dim=32, vision_cfg=dict(image_size=32, patch_size=8, width=64, layers=2, head_width=16),
        text_cfg=dict(context_length=16, vocab_size=100, width=64, heads=4, layers=2),
    ).eval()


def _check_open_clip(model, img, txt) -> None:
    conv = cv.convert_open_clip(model, "diff_v2").eval()
    assert not any(isinstance(m, torch.nn.MultiheadAttention) for m in conv.modules())
    with torch.no_grad():
        assert (model.encode_image(img) - conv.encode_image(img)).abs().max() <= TOL
        assert (model.encode_text(txt) - conv.encode_text(txt)).abs().max() <= TOL


def test_open_clip_tiny_both_towers_exact() -> None:
    _check_open_clip(_tiny_open_clip(), torch.randn(2, 3, 32, 32), torch.randint(0, 100, (2, 16)))


def test_open_clip_v1_runs_with_a_gap() -> None:
    model = _tiny_open_clip()
    img, txt = torch.randn(2, 3, 32, 32), torch.randint(0, 100, (2, 16))
    conv = cv.convert_open_clip(model, "diff", calibration=lambda m: m(img, txt)).eval()
    assert sum(isinstance(m, DiffAttention) for m in conv.modules()) == 4
    with torch.no_grad():
        gap = (model.encode_text(txt) - conv.encode_text(txt)).abs().max()
    assert torch.isfinite(gap) and gap > TOL


@pytest.mark.slow
def test_open_clip_vit_b_32_both_towers_exact() -> None:
    import open_clip

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32", pretrained=None).eval()
    _check_open_clip(model, torch.randn(1, 3, 224, 224), torch.randint(0, 49408, (2, 77)))


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def test_hf_llama_gqa_v2_exact_v1_gap() -> None:
    hf = _tiny_llama()
    tokens = torch.randint(0, 64, (2, 10))
    base = cv.from_hf_llama(hf)
    with torch.no_grad():
        ref = hf(tokens).logits
        v2 = cv.convert_lm(base, "diff_v2")
        assert v2.config.num_kv_heads == 2 and v2.blocks[0].attn.k_proj.out_features == 2 * 16
        assert (ref - v2.eval()(tokens)).abs().max() <= TOL
        v1 = cv.convert_lm(base, "diff", calibration=tokens).eval()
        gap = (ref - v1(tokens)).abs().max()
    assert torch.isfinite(gap) and gap > TOL


def test_diffzoo_softmax_lm_v2_exact_with_kv_cache() -> None:
    torch.manual_seed(0)
    lm = CausalLM.from_preset("lm_tiny", attn="softmax", num_kv_heads=2).eval()
    tokens = torch.randint(0, 256, (2, 12))
    v2 = cv.convert_lm(lm, "diff_v2").eval()
    with torch.no_grad():
        assert (lm(tokens) - v2(tokens)).abs().max() <= TOL
        caches = v2.make_kv_caches(2, 16)
        step = torch.cat([v2(tokens[:, :8], kv_caches=caches), v2(tokens[:, 8:], kv_caches=caches)], 1)
        assert (lm(tokens) - step).abs().max() <= TOL


def test_v1_head_order_keeps_each_branch_on_its_key_head() -> None:
    """Branch b of V1 head i reads key head 2(i // G) + b; its source head must read the same one."""
    for H, Hkv in ((4, 4), (8, 4), (8, 2), (12, 2)):
        G = H // Hkv
        order = cv._v1_head_order(H, Hkv)
        assert sorted(order) == list(range(H))
        for pos, src in enumerate(order):
            i, b = divmod(pos, 2)
            assert src // G == 2 * (i // (G)) + b


def test_v1_first_branch_is_the_source_head_when_lambda_is_zero() -> None:
    """lambda_init=0 and no sub-norm: V1 head i returns A1 [v_2g; v_2g+1], so the first value half is exact."""
    torch.manual_seed(0)
    src = Attention(32, 4).eval()
    for p in src.parameters():
        torch.nn.init.normal_(p, std=0.5)
    w = cv.weights_from_diffzoo(src)
    v1 = cv.load_v1(DiffAttention(32, 2, 2, 8, lambda_init=0.0, sub_norm=False), w).eval()
    assert float(v1.lambda_full().detach()) == 0.0
    x = torch.randn(2, 5, 32)
    q = F.linear(x, w.q_weight).view(2, 5, 4, 8).transpose(1, 2)
    k = F.linear(x, w.k_weight).view(2, 5, 4, 8).transpose(1, 2)
    v = F.linear(x, w.v_weight).view(2, 5, 4, 8).transpose(1, 2)
    heads = F.scaled_dot_product_attention(q, k, v)  # (B, 4, N, 8): source head outputs
    captured = {}
    v1.out_proj.register_forward_pre_hook(lambda m, a: captured.setdefault("o", a[0]))
    v1(x)
    o = captured["o"].view(2, 5, 2, 16)
    assert (o[:, :, 0, :8] - heads[:, 0]).abs().max() <= TOL
    assert (o[:, :, 1, :8] - heads[:, 2]).abs().max() <= TOL


# -- published checkpoints in unilm's layout ----------------------------------------------------------
def _interleaved_rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE on interleaved pairs (2j, 2j+1) of x (B, heads, N, d), written from the rotation's definition."""
    d, N = x.shape[-1], x.shape[-2]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(N, dtype=torch.float64)[:, None] * theta[None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


def _upstream_diff_attention(sd: dict, x: torch.Tensor, H: int, d: int, lambda_init: float) -> torch.Tensor:
    """Differential attention V1 (causal) with interleaved RoPE and unilm's parameter names."""
    B, N, _ = x.shape
    q = F.linear(x, sd["q_proj.weight"]).view(B, N, 2 * H, d).transpose(1, 2)
    k = F.linear(x, sd["k_proj.weight"]).view(B, N, 2 * H, d).transpose(1, 2)
    v = F.linear(x, sd["v_proj.weight"]).view(B, N, H, 2 * d).transpose(1, 2)
    q, k = _interleaved_rope(q), _interleaved_rope(k)
    s = (q @ k.transpose(-1, -2)) * d**-0.5
    s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    a = s.softmax(-1).view(B, H, 2, N, N)
    lam = (torch.exp((sd["lambda_q1"] * sd["lambda_k1"]).sum()) - torch.exp((sd["lambda_q2"] * sd["lambda_k2"]).sum())
           + lambda_init)
    o = (a[:, :, 0] - lam * a[:, :, 1]) @ v
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * sd["subln.weight"] * (1 - lambda_init)
    return F.linear(o.transpose(1, 2).reshape(B, N, 2 * H * d), sd["out_proj.weight"])


def test_unilm_layout_matches_after_reordering() -> None:
    torch.manual_seed(0)
    D, H, d, lam0 = 64, 2, 16, 0.35
    sd = {name: torch.randn(D, D) * 0.2 for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight")}
    sd.update({n: torch.randn(d) * 0.3 for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")})
    sd["subln.weight"] = torch.rand(2 * d) + 0.5
    x = torch.randn(2, 11, D)
    layer = DiffAttention(D, H, head_dim=d, lambda_init=lam0, causal=True, rope=True, proj_bias=False).eval()
    with torch.no_grad():
        ref = _upstream_diff_attention(sd, x, H, d, lam0)
        layer.load_state_dict(cv.unilm_state_dict_to_diffzoo(sd, d), strict=True)
        assert (layer(x) - ref).abs().max() <= 1e-6
        layer.load_state_dict({k.replace("subln", "sub_norm"): v for k, v in sd.items()}, strict=True)
        assert (layer(x) - ref).abs().max() > 1e-3  # without the reordering the rotations differ


def test_interleaved_to_rotate_half_permutation() -> None:
    w = torch.arange(8.0)[:, None]
    assert cv.interleaved_to_rotate_half(w, 4).flatten().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    with pytest.raises(ValueError, match="head_dim=3"):
        cv.interleaved_to_rotate_half(w, 3)


# -- errors, import, command line, fine-tuning -------------------------------------------------------
def test_refused_sources_name_the_problem() -> None:
    with pytest.raises(ValueError, match="qk_norm"):
        cv.convert_timm_vit(_vit("vit_tiny_patch16_224", img_size=32, qk_norm=True), "diff_v2")
    with pytest.raises(ValueError, match="attn='softmax'"):
        cv.convert_lm(CausalLM.from_preset("lm_tiny", attn="diff"), "diff_v2")
    with pytest.raises(ValueError, match="attn='nope'"):
        cv.convert_lm(CausalLM.from_preset("lm_tiny", attn="softmax"), "nope")


def test_module_imports_only_torch_at_top_level() -> None:
    tree = ast.parse(Path(cv.__file__).read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0}
    third_party = top - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party == {"torch"}  # timm, open_clip, transformers are imported inside the functions


def test_cli_writes_a_rebuildable_exact_conversion(tmp_path: Path) -> None:
    from recipes.convert import main

    src = tmp_path / "soft.safetensors"
    from safetensors.torch import save_file

    soft = _vit("softvit_nano_patch7_28")
    save_file({k: v.contiguous() for k, v in soft.state_dict().items()}, str(src))
    meta = main(["--from", "diffzoo:softvit_nano_patch7_28", "--weights", str(src), "--out", str(tmp_path / "out")])
    assert meta["check"]["max_abs_diff"] <= TOL
    saved = json.loads((tmp_path / "out" / "convert.json").read_text())
    assert saved["attn"] == "diff_v2" and saved["family"] == "timm"
    rebuilt = cv.load_converted(tmp_path / "out")
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert (rebuilt(x) - soft(x)).abs().max() <= TOL


def test_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    from recipes.convert import main

    with pytest.raises(SystemExit, match="expected timm:NAME"):
        main(["--from", "nope:x", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="not a local folder"):
        main(["--from", "hf:" + str(tmp_path / "missing"), "--out", str(tmp_path)])


def test_lm_task_init_from_and_train_only(tmp_path: Path) -> None:
    from diffzoo.tasks.init_from import set_trainable
    from diffzoo.tasks.lm import LanguageModelTask
    from recipes.convert import main

    main(["--from", "diffzoo:lm_tiny", "--attn", "diff", "--lambda-init", "0.1", "--out", str(tmp_path / "c")])
    task = LanguageModelTask(model="lm_tiny", attn="diff", init_from=str(tmp_path / "c"), train_only="attention",
                             unfreeze_after=2)
    ref = cv.load_converted(tmp_path / "c")
    tokens = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        assert torch.equal(task.model.eval()(tokens), ref(tokens))
    assert all(m.lambda_init == 0.1 for m in task.model.modules() if isinstance(m, DiffAttention))
    set_trainable(task.model, "attention")
    trainable = {n for n, p in task.model.named_parameters() if p.requires_grad}
    assert trainable and all(".attn." in n for n in trainable)
    with pytest.raises(ValueError, match="init_from"):
        LanguageModelTask(model="lm_tiny", attn="softmax", init_from=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="train_only"):
        LanguageModelTask(model="lm_tiny", train_only="mlp")


def test_vit_recipe_starts_from_a_converted_model_and_trains_only_attention(tmp_path: Path, monkeypatch) -> None:
    from recipes.convert import main
    from recipes.vit_imagenet import cli_main

    from test_data_vision import make_folder  # tests/ is on sys.path
    from test_vit_recipe import _folder_data, _write_config

    monkeypatch.chdir(tmp_path)
    arch = {"depth": 1, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2.0, "patch_size": 4}
    main(["--from", "diffzoo:softvit_nano_patch7_28", "--out", str(tmp_path / "conv"),
          "--model-kwargs", json.dumps({**arch, "img_size": 16, "num_classes": 3, "in_chans": 3})])
    start = cv.load_converted(tmp_path / "conv").state_dict()
    cfg = _write_config(tmp_path / "c.yaml", _folder_data(make_folder(tmp_path / "ds")),
                        extra="", model="diffvit_nano_patch7_28")
    cli = cli_main(["fit", "--config", str(cfg), "--trainer.max_steps", "2",
                    "--model.model_kwargs", json.dumps({**arch, "attn": "diff_v2"}),
                    "--model.init_from", str(tmp_path / "conv"), "--model.train_only", "attention"])
    after = cli.model.model.state_dict()
    moved = {k for k in start if not torch.equal(start[k], after[k])}
    assert moved and all(".attn." in k for k in moved)
    assert "head.weight" not in moved and "blocks.0.mlp.fc1.weight" not in moved


def test_cli_converts_a_tied_lm_export_of_any_shape(tmp_path: Path) -> None:
    """``--from diffzoo:lm`` builds ``LMConfig(**model_kwargs)``; an export that stores the tied output weight
    once (``export_lm``, the MQAR recipe) loads; ``--attn softmax`` writes the source unchanged."""
    from safetensors.torch import save_file

    from recipes.convert import main

    torch.manual_seed(0)
    shape = {"vocab_size": 40, "dim": 32, "depth": 2, "num_heads": 4}  # num_heads: the former name is accepted
    soft = CausalLM(LMConfig(**shape, attn="softmax")).eval()
    state = {k: v for k, v in soft.state_dict().items() if k != "output.weight"}  # tied: stored once
    save_file(state, str(tmp_path / "soft.safetensors"))
    tokens = torch.randint(0, 40, (2, 12))
    for attn in ("diff_v2", "diff", "softmax"):
        meta = main(["--from", "diffzoo:lm", "--model-kwargs", json.dumps(shape), "--weights",
                     str(tmp_path / "soft.safetensors"), "--attn", attn, "--out", str(tmp_path / attn)])
        rebuilt = cv.load_converted(tmp_path / attn)
        assert rebuilt.config.attn == attn and rebuilt.config.dim == 32 and "recipes.mqar" in meta["rebuild_hint"]
        with torch.no_grad():
            gap = (rebuilt(tokens) - soft(tokens)).abs().max()
        assert (gap <= TOL) if attn != "diff" else (gap > TOL)
        assert meta["check"]["max_abs_diff"] <= TOL or attn == "diff"
    assert meta["check"]["max_abs_diff"] == 0 and meta["lambda_init"] is None  # softmax: a copy
    save_file({k: v for k, v in state.items() if k != "norm.weight"}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(SystemExit, match="1 missing"):  # a weight that is really missing is still refused
        main(["--from", "diffzoo:lm", "--model-kwargs", json.dumps(shape), "--weights",
              str(tmp_path / "bad.safetensors"), "--out", str(tmp_path / "bad")])


def test_init_from_a_wrong_architecture_is_one_line(tmp_path: Path) -> None:
    from diffzoo.weights.convert import load_init_from
    from recipes.convert import main

    main(["--from", "diffzoo:lm_tiny", "--attn", "diff_v2", "--out", str(tmp_path / "v2")])
    for wrong in (CausalLM.from_preset("lm_tiny", attn="diff"), CausalLM.from_preset("lm_tiny", attn="diff_v2", dim=128)):
        with pytest.raises(ValueError, match=r"^--model\.init_from .*build --model\.attn diff_v2"):
            load_init_from(wrong, tmp_path / "v2")


def test_cli_softmax_writes_the_vit_source_unchanged(tmp_path: Path) -> None:
    from recipes.convert import main

    arch = {"depth": 1, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2.0, "img_size": 16, "patch_size": 4}
    meta = main(["--from", "diffzoo:softvit_nano_patch7_28", "--attn", "softmax", "--model-kwargs", json.dumps(arch),
                 "--out", str(tmp_path / "same")])
    assert meta["check"]["max_abs_diff"] == 0 and meta["rebuild_hint"] == "--model.model softvit_nano_patch7_28"
    rebuilt = cv.load_converted(tmp_path / "same")
    assert not any(isinstance(m, (DiffAttention, DiffAttentionV2)) for m in rebuilt.modules())


def test_cli_refuses_an_out_folder_that_holds_weights_unless_overwrite(tmp_path: Path) -> None:
    from recipes.convert import main

    args = ["--from", "diffzoo:lm_tiny", "--attn", "diff_v2", "--out", str(tmp_path / "c")]
    main(args)
    first = (tmp_path / "c" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit, match=r"--out .*c already holds model\.safetensors and convert\.json: .*--overwrite"):
        main(args[:-4] + ["--attn", "diff", "--out", str(tmp_path / "c")])
    assert (tmp_path / "c" / "model.safetensors").read_bytes() == first  # left as it was
    main(args[:-4] + ["--attn", "diff", "--out", str(tmp_path / "c"), "--overwrite"])
    assert json.loads((tmp_path / "c" / "convert.json").read_text())["attn"] == "diff"


def test_cli_unknown_source_models_are_one_line(tmp_path: Path) -> None:
    from recipes.convert import main

    with pytest.raises(SystemExit, match=r"^python -m recipes\.convert: error: --from timm:no_such_model: unknown timm"):
        main(["--from", "timm:no_such_model", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=r"unknown timm model; did you mean vit_tiny_patch16_224"):
        main(["--from", "timm:vit_tiny_patch16_22", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=r"unknown open_clip model 'no_such_clip'"):
        main(["--from", "open_clip:no_such_clip", "--out", str(tmp_path / "a")])
    assert not (tmp_path / "a").exists()


def test_every_training_task_can_start_from_a_converted_model() -> None:
    """Each LightningModule of diffzoo.tasks takes ``init_from`` (``--model.init_from DIR`` in its recipe), by
    name or through ``**kwargs`` handed to a base class that takes it."""
    import importlib
    import inspect
    import pkgutil

    import lightning.pytorch as pl

    import diffzoo.tasks

    found = {}
    for info in pkgutil.walk_packages(diffzoo.tasks.__path__, "diffzoo.tasks."):
        for name, obj in vars(importlib.import_module(info.name)).items():
            if inspect.isclass(obj) and issubclass(obj, pl.LightningModule) and obj.__module__.startswith("diffzoo."):
                params = inspect.signature(obj.__init__).parameters
                forwards = any(p.kind is p.VAR_KEYWORD for p in params.values()) and any(
                    "init_from" in inspect.signature(base.__init__).parameters for base in obj.__mro__[1:])
                found[name] = "init_from" in params or forwards
    assert {"ImageClassificationTask", "ContrastiveTask", "LanguageModelTask", "MQARTask"} <= set(found)
    assert all(found.values()), f"tasks without init_from: {[n for n, ok in found.items() if not ok]}"


def test_speech_task_starts_from_a_converted_folder(tmp_path: Path) -> None:
    """The speech encoders have no converter of their own; ``--attn softmax`` writes one in the folder format,
    and the speech task starts from it like the other tasks."""
    from diffzoo.tasks import SpeechClassificationTask
    from recipes.convert import main

    main(["--from", "timm:softkwt_nano", "--attn", "softmax", "--out", str(tmp_path / "kwt")])
    start = cv.load_converted(tmp_path / "kwt").state_dict()
    task = SpeechClassificationTask(model="softkwt_nano", init_from=str(tmp_path / "kwt"), train_only="attention")
    assert all(torch.equal(v, start[k]) for k, v in task.model.state_dict().items())
    with pytest.raises(ValueError, match=r"^--model\.init_from .*the weights do not fit this model"):
        SpeechClassificationTask(model="diffkwt_nano", init_from=str(tmp_path / "kwt"))
