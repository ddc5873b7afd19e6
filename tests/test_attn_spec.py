"""One attention spec, fixed at construction: every named variant builds in every family, exports, reloads from
its own metadata to the same outputs, and (the timm ViTs) scripts to the outputs of the eager model."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from diffzoo.layers import VARIANTS, DiffAttention, get_spec

ROOT = Path(__file__).resolve().parents[1]
NAMES = list(VARIANTS)


def _sources() -> list[Path]:
    return [p for d in ("diffzoo", "recipes") for p in (ROOT / d).rglob("*.py")]


# -- one definition, no later writes -----------------------------------------------------------------
def test_the_variant_names_are_defined_once() -> None:
    """Only diffzoo/layers/spec.py holds the names of the variants that are not also layer kinds as values; the
    study's table of ablation pairs names variants it compares, and every one of them is a defined variant."""
    from diffzoo.study.tables import ABLATIONS

    names = {"softmax_wide", "diff_nonorm", "diff_const", "diff_v2_matched"}
    study_pairs = ROOT / "diffzoo" / "study" / "tables.py"
    found = [f"{p.relative_to(ROOT)}:{node.value}" for p in (ROOT / "diffzoo").rglob("*.py") if p != study_pairs
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Constant) and node.value in names]
    assert len(found) == len(names) and all(f.startswith("diffzoo/layers/spec.py:") for f in found), found
    assert {v for pair in ABLATIONS for v in pair[:2]} <= set(VARIANTS)
    from diffzoo.layers.spec import ABLATION_VARIANTS, MAIN_VARIANTS

    # the study's groups, derived from the specs: the plain layer of each kind at softmax's parameter count,
    # and the one-change ablations (diff_v2, unmatched, is in neither)
    assert [VARIANTS[v].kind for v in MAIN_VARIANTS] == ["softmax", "diff", "diff_v2"]
    assert VARIANTS[MAIN_VARIANTS[2]].match_params and len(ABLATION_VARIANTS) == 3
    assert not set(MAIN_VARIANTS) & set(ABLATION_VARIANTS) and len(VARIANTS) == 7


def test_lambda_init_is_written_only_by_the_constructor() -> None:
    writes = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            writes += [f"{path.relative_to(ROOT)}:{node.lineno}" for t in targets
                       if isinstance(t, ast.Attribute) and t.attr == "lambda_init"]
    assert writes == ["diffzoo/layers/diff_attention.py:" + writes[0].rsplit(":", 1)[1]], writes


def test_spec_fields_and_errors() -> None:
    assert get_spec("diff_const").lambda_init_at(5) == 0.8
    assert get_spec("diff").lambda_init_at(0) == pytest.approx(0.2)
    assert get_spec("diff").with_lambda_init(0.5).lambda_init_at(3) == 0.5
    assert get_spec(get_spec("diff_nonorm").to_dict()) == VARIANTS["diff_nonorm"]
    assert get_spec("softmax_wide").scale_heads(4) == 2
    with pytest.raises(ValueError, match="unknown attention variant 'bogus'; choose one of softmax, softmax_wide"):
        get_spec("bogus")
    with pytest.raises(ValueError, match="lambda_init=0.5 applies to differential V1 only, not to attn='diff_v2'"):
        get_spec("diff_v2", lambda_init=0.5)
    with pytest.raises(ValueError, match="needs num_heads=3 divisible by 2"):
        get_spec("softmax_wide").scale_heads(3)


def _layer_settings(model: torch.nn.Module, name: str) -> None:
    """The model's differential V1 layers carry the attention spec's lambda rule and sub-norm."""
    spec = get_spec(name)
    v1 = [m for m in model.modules() if isinstance(m, DiffAttention)]
    assert bool(v1) == (spec.kind == "diff")
    for m in v1:
        assert m.use_sub_norm == spec.sub_norm and hasattr(m.sub_norm, "weight") == spec.sub_norm
        assert m.lambda_init == spec.lambda_init_at(m.depth)


# -- ViT: build, script, export, reload --------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_vit_variant_builds_scripts_exports_and_reloads(name: str, tmp_path: Path) -> None:
    from diffzoo.tasks.cluttered import VariantImageTask, VariantRunSummary
    from diffzoo.weights import load_exported

    torch.manual_seed(0)
    task = VariantImageTask(attn=name, patch_size=8, img_size=32)
    model = task.model.eval()
    _layer_settings(model, name)
    assert model.attn_spec == get_spec(name)
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        y = model(x)
        torch.testing.assert_close(torch.jit.script(model)(x), y, atol=1e-5, rtol=1e-4)
    path = VariantRunSummary().export_weights(task, tmp_path)["safetensors"]
    again = load_exported(path).eval()
    with torch.no_grad():
        assert torch.equal(again(x), y)


def test_scripted_vit_without_sub_norm_skips_the_scale() -> None:
    """The TorchScript graph and the kernels share the per-head norm: no (1 - lambda_init) scale without it."""
    import timm

    import diffzoo.models  # noqa: F401

    torch.manual_seed(0)
    model = timm.create_model("diffvit_nano_patch7_28", attn="diff_nonorm").eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        eager, scripted = model(x), torch.jit.script(model)(x)
    torch.testing.assert_close(scripted, eager, atol=1e-5, rtol=1e-4)


def test_former_variant_exports_reload(tmp_path: Path) -> None:
    """Exports that stored ``variant`` beside the resolved arguments still reload as that variant."""
    import timm
    from safetensors.torch import save_file

    import diffzoo.models  # noqa: F401
    from diffzoo.weights import load_exported

    torch.manual_seed(0)
    x = torch.randn(1, 1, 28, 28)
    former = {  # the create_model arguments earlier versions wrote, and what they mean now
        "diff_nonorm": ({"variant": "diff_nonorm"}, {"attn": "diff_nonorm"}),
        "diff_const": ({"variant": "diff_const", "lambda_init": 0.8}, {"attn": "diff_const"}),
        "softmax_wide": ({"variant": "softmax_wide", "num_heads": 2}, {"attn": "softmax_wide"}),
        "diff_v2_matched": ({"variant": "diff_v2_matched", "attn": "diff_v2", "mlp_ratio": 1.6},
                            {"attn": "diff_v2", "mlp_ratio": 1.6}),
    }
    for name, (stored, now) in former.items():
        prefix = "softvit" if name.startswith("softmax") else "diffvit"
        model = timm.create_model(f"{prefix}_nano_patch7_28", **now).eval()
        path = tmp_path / f"{name}.safetensors"
        save_file(model.state_dict(), str(path), metadata={"model": f"{prefix}_nano_patch7_28",
                                                           "model_args": json.dumps({"num_classes": 10, **stored})})
        with torch.no_grad():
            assert torch.equal(load_exported(path).eval()(x), model(x)), name


# -- LM and MQAR ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_lm_and_mqar_variant_builds_exports_and_reloads(name: str, tmp_path: Path) -> None:
    from diffzoo.tasks.lm import LanguageModelTask
    from diffzoo.tasks.mqar import MQARRunSummary, MQARTask
    from diffzoo.weights import export_lm, load_lm

    torch.manual_seed(0)
    tokens = torch.randint(0, 40, (2, 9))
    lm = LanguageModelTask(model="lm_tiny", attn=name, vocab_size=40)
    mqar = MQARTask(attn=name, vocab_size=40, dim=32, depth=2, num_heads=4)
    for task, path in ((lm, export_lm(lm, tmp_path / "lm.safetensors")),
                       (mqar, MQARRunSummary().export_weights(mqar, tmp_path)["safetensors"])):
        model = task.model.eval()
        _layer_settings(model, name)
        again = load_lm(path).eval()
        with torch.no_grad():
            assert torch.equal(again(tokens), model(tokens))


# -- speech --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_speech_variant_builds_exports_and_reloads(name: str, tmp_path: Path) -> None:
    from diffzoo.tasks.speech import SpeechClassificationTask
    from diffzoo.weights import export_module, load_exported

    torch.manual_seed(0)
    task = SpeechClassificationTask(model="softkwt_nano", attn=name)
    model = task.model.eval()
    _layer_settings(model, name)
    wave = torch.randn(2, 8000)
    again = load_exported(export_module(task, tmp_path / "model.safetensors")).eval()
    with torch.no_grad():
        assert torch.equal(again(wave), model(wave))


# -- CLIP ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_clip_variant_builds_exports_and_reloads(name: str, tmp_path: Path) -> None:
    from diffzoo.tasks.contrastive import ClipRunSummary, ContrastiveTask
    from diffzoo.weights import load_clip

    torch.manual_seed(0)
    task = ContrastiveTask(model="DiffCLIP-nano", attn=name)
    model = task.model.eval()
    _layer_settings(model, name)
    assert model.visual.trunk.attn_spec == model.text.attn_spec == get_spec(name)
    path = ClipRunSummary().export_weights(task, tmp_path)["safetensors"]
    again, _, _ = load_clip("DiffCLIP-nano", checkpoint=path)
    img, txt = torch.randn(2, 3, 32, 32), torch.randint(0, 100, (2, model.context_length))
    with torch.no_grad():
        assert torch.equal(again.encode_image(img), model.encode_image(img))
        assert torch.equal(again.encode_text(txt), model.encode_text(txt))


def test_matched_variant_has_the_softmax_parameter_count_in_every_family() -> None:
    import timm

    import diffzoo.models  # noqa: F401
    from diffzoo.layers import count_parameters
    from diffzoo.models.clip import create_clip, with_attn

    pairs = {
        "vit": lambda a: timm.create_model("diffvit_nano_patch7_28", attn=a),
        "speech": lambda a: timm.create_model("diffkwt_nano", attn=a),
        "clip text": lambda a: create_clip("DiffCLIP-nano", **with_attn("DiffCLIP-nano", a)).text,
    }
    for family, build in pairs.items():
        soft, matched, v2 = (count_parameters(build(a)) for a in ("softmax", "diff_v2_matched", "diff_v2"))
        assert abs(matched - soft) < 0.002 * soft < v2 - soft, family


# -- every recipe: one name list, one-line errors -----------------------------------------------------
RECIPES = ["lm", "mqar", "cluttered_digits", "vit_imagenet", "speech_commands", "clip"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_refuses_an_unknown_attn_in_one_line(recipe: str, tmp_path: Path, monkeypatch, capsys) -> None:
    import importlib
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DIFFZOO_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", [recipe, "--model.attn", "bogus"])
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(f"recipes.{recipe}").cli_main()
    message = str(exc.value)
    assert message == (f"python -m recipes.{recipe}: error: unknown attention variant 'bogus'; choose one of "
                       + ", ".join(NAMES))


# -- converters ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["diff_nonorm", "diff_const"])
def test_conversion_to_a_v1_variant_reloads_and_starts_a_task(name: str, tmp_path: Path) -> None:
    from diffzoo.tasks.lm import LanguageModelTask
    from diffzoo.weights import convert as cv
    from recipes.convert import main

    meta = main(["--from", "diffzoo:lm_tiny", "--attn", name, "--out", str(tmp_path / "c")])
    assert meta["attn"] == name and meta["lambda_init"] == (0.8 if name == "diff_const" else 0.0)
    ref = cv.load_converted(tmp_path / "c")
    assert all(m.lambda_init == meta["lambda_init"] and m.use_sub_norm == (name != "diff_nonorm")
               for m in ref.modules() if isinstance(m, DiffAttention))
    task = LanguageModelTask(model="lm_tiny", attn=name, init_from=str(tmp_path / "c"))
    tokens = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        assert torch.equal(task.model.eval()(tokens), ref(tokens))


def test_conversion_refuses_a_spec_that_changes_the_shape() -> None:
    from diffzoo.weights import convert as cv

    for name in ("softmax", "softmax_wide", "diff_v2_matched"):
        with pytest.raises(ValueError, match=f"attn={name!r}; a softmax model converts to one of"):
            cv.conversion_spec(name)
    assert cv.ATTN_KINDS == ("diff", "diff_nonorm", "diff_const", "diff_v2")
