"""MQAR from converted weights (``--model.init_from``) and the conversion study (``recipes.convert_study``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
         "--curves.plot", "false", "--curves.tensorboard", "false"]


def _logged(root: Path, name: str) -> list[str]:
    return ["--trainer.logger.init_args.save_dir", str(root), "--trainer.logger.init_args.name", name, *QUIET]


def _quick_source(root: Path, seed: int) -> Path:
    """A tiny softmax MQAR run (``python -m recipes.mqar --quick``, in this process); its folder."""
    from recipes.mqar import cli_main

    name = f"softmax_seed{seed}"
    cli_main(["--quick", "--model.attn", "softmax", "--model.lr", "3e-3", "--seed_everything", str(seed),
              "--data.seed", str(seed), *_logged(root, name)])
    return root / name


def test_mqar_starts_from_converted_weights_and_trains_only_attention(tmp_path: Path) -> None:
    from diffzoo.layers import DiffAttention
    from diffzoo.study.runs import latest_log_dir
    from diffzoo.tasks.mqar import MQARTask
    from diffzoo.weights.io import read_weights
    from recipes.convert import main as convert
    from recipes.convert_study import lm_kwargs
    from recipes.mqar import cli_main

    log = latest_log_dir(_quick_source(tmp_path / "src", 100))
    config = yaml.safe_load((log / "config.yaml").read_text())
    for attn in ("diff_v2", "diff", "softmax"):
        meta = convert(["--from", "diffzoo:lm", "--model-kwargs", json.dumps(lm_kwargs(config)), "--weights",
                        str(log / "model.safetensors"), "--attn", attn, "--out", str(tmp_path / attn)])
        assert meta["check"]["max_abs_diff"] == 0 or attn == "diff"
        # the task builds the converted architecture (names and shapes) and loads the file as it is
        file = read_weights(tmp_path / attn / "model.safetensors")
        built = MQARTask(attn=attn).model.state_dict()
        assert {k: tuple(v.shape) for k, v in built.items()} == {k: tuple(v.shape) for k, v in file.items()}
        loaded = MQARTask(attn=attn, init_from=str(tmp_path / attn)).model
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in file.items())
    v1 = MQARTask(attn="diff", init_from=str(tmp_path / "diff")).model
    assert {m.lambda_init for m in v1.modules() if isinstance(m, DiffAttention)} == {0.0}  # the conversion's

    # before any training, V2 scores exactly what the source scored at its last validation
    source = json.loads((log / "summary.json").read_text())["metrics"]
    cli = cli_main(["validate", "--config", str(log / "config.yaml"), "--model.attn", "diff_v2",
                    "--model.init_from", str(tmp_path / "diff_v2"), *_logged(tmp_path / "runs", "v2_step0")])
    start = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert start["val/acc"] == source["val/acc"] and start["test/acc"] == source["test/acc"]
    assert start["val/loss"] == pytest.approx(source["val/loss"], abs=1e-5)

    # --model.train_only attention: only attention weights move
    cli = cli_main(["--quick", "--model.attn", "diff_v2", "--model.init_from", str(tmp_path / "diff_v2"),
                    "--model.train_only", "attention", *_logged(tmp_path / "runs", "v2_attention")])
    file, after = read_weights(tmp_path / "diff_v2" / "model.safetensors"), cli.model.model.state_dict()
    moved = {k for k in file if not torch.equal(file[k], after[k])}
    assert moved and all(".attn." in k for k in moved) and "tok_embeddings.weight" not in moved
    with pytest.raises(ValueError, match="build --model.attn diff_v2"):
        MQARTask(attn="diff", init_from=str(tmp_path / "diff_v2"))


# -- the study's plan and report, without training ---------------------------------------------------
def _source(name: str, seed: int, steps: int = 1000):
    from recipes.convert_study import Source

    config = {"seed_everything": seed, "model": {"attn": "softmax", "lr": 0.003, "dim": 64, "depth": 2,
                                                 "num_heads": 4, "intermediate_size": None, "max_seq_len": 2048},
              "data": {"seed": seed, "key_vocab": 64, "value_vocab": 64, "steps_per_epoch": 100},
              "trainer": {"max_epochs": steps // 100, "max_steps": -1}}
    return Source(name=name, log_dir=Path(name, "version_0"), config=config, seed=seed, data_seed=seed, lr=0.003,
                  steps=steps, metrics={"val/acc": 0.5, "test/acc": 0.48}, curve=[[500, 0.3], [1000, 0.5]])


def _arg(job: dict, flag: str) -> str:
    return job["args"][job["args"].index(flag) + 1]


def test_plan_fine_tunes_on_new_data_and_trains_scratch_for_the_whole_budget() -> None:
    from recipes.convert_study import Plan, jobs_for

    plan = Plan(steps=300, eval_every=50, warmup=20, scratch_steps=None, lr=None, data_seed_offset=1000, extra=())
    jobs = jobs_for(_source("softmax_seed100", 100), plan, Path("start"))
    assert [(j["kind"], j["arm"]) for j in jobs if j["kind"] != "step0"] == [
        ("finetune", "softmax_continued"), ("finetune", "diff_v2_converted"), ("finetune", "diff_converted"),
        ("scratch", "diff_scratch"), ("scratch", "diff_v2_scratch")]
    for j in jobs:
        assert _arg(j, "--config") == str(Path("softmax_seed100", "version_0", "config.yaml"))
        if j["kind"] == "step0":
            assert "--model.lr" not in j["args"] and _arg(j, "--model.init_from").endswith(j["arm"])
        elif j["kind"] == "finetune":
            assert (_arg(j, "--data.seed"), _arg(j, "--seed_everything"), _arg(j, "--model.lr")) == ("1100", "100", "0.003")
            assert (_arg(j, "--data.steps_per_epoch"), _arg(j, "--trainer.max_epochs")) == ("50", "6")
            assert _arg(j, "--model.warmup_steps") == "20"
        else:
            assert "--model.init_from" not in j["args"] and "--model.warmup_steps" not in j["args"]
            assert (_arg(j, "--data.seed"), _arg(j, "--trainer.max_epochs"), j["steps"]) == ("100", "26", 1300)
    with pytest.raises(ValueError, match="--steps=310 must be a positive multiple of --eval-every 50"):
        jobs_for(_source("s", 1), Plan(310, 50, 20, None, None, 1000, ()), Path("start"))


def _fake_records(sources) -> list[dict]:
    from recipes.convert_study import FINETUNED, SCRATCH

    records = []
    for i, s in enumerate(sources):
        for arm, attn in {**FINETUNED, **SCRATCH}.items():
            base = {"arm": arm, "attn": attn, "source": s.name, "seed": s.seed}
            end = 0.6 + 0.1 * (arm != "softmax_continued") + 0.01 * i
            if arm in FINETUNED:
                start = 0.5 if arm != "diff_converted" else 0.2
                records.append({**base, "kind": "step0", "key": f"{s.name}/{arm}/step0",
                                "metrics": {"val/acc": start, "test/acc": start}})
            kind = "finetune" if arm in FINETUNED else "scratch"
            records.append({**base, "kind": kind, "key": f"{s.name}/{arm}/{kind}", "steps": 300 if arm in FINETUNED else 1300,
                            "summary": {"metrics": {"val/acc": end, "test/acc": end - 0.01}},
                            "curves": {"val/acc": [[149, end - 0.05], [299, end]]}})
    return records


def test_report_tables_and_plot(tmp_path: Path) -> None:
    from recipes.convert_study import Plan, plot_curves, report

    sources = [_source(f"softmax_seed{s}", s) for s in (100, 101, 102)]
    records = _fake_records(sources)
    plan = Plan(300, 50, 20, None, None, 1000, ())
    text = report(sources, records, plan, {"diff_v2_converted": [0.0], "diff_converted": [0.3]})
    for arm in ("softmax_continued", "diff_v2_converted", "diff_converted", "diff_scratch", "diff_v2_scratch"):
        assert f"| {arm} | 3 |" in text
    assert "| source (softmax) | 3 | 1000 | – | – | 50.00 ± 0.00 | 48.00 ± 0.00 |" in text
    assert "| diff_converted | 3 | 300 | 20.00 ± 0.00 | 20.00 ± 0.00 | 71.00 ± 1.00 | 70.00 ± 1.00 |" in text
    assert text.count("2 comparison(s) in this table") == 2 and "diff vs softmax_continued [95 % CI]" in text
    assert "+10.00 [" in text and "Failed or diverged runs: none." in text
    plot_curves(sources, records, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_sources_are_softmax_runs_named_once(tmp_path: Path) -> None:
    from recipes.convert_study import find_sources, read_source

    for name, attn in (("a/softmax_seed1", "softmax"), ("b/softmax_seed1", "softmax"), ("a/diff_seed1", "diff")):
        run = tmp_path / name / "version_0"
        run.mkdir(parents=True)
        (run / "model.safetensors").write_bytes(b"")
        (run / "config.yaml").write_text(yaml.safe_dump({"model": {"attn": attn, "lr": 1e-3}, "data": {"seed": 1},
                                                         "trainer": {"max_epochs": 2}}))
    assert [p.name for p in find_sources([str(tmp_path / "a" / "*")])] == ["diff_seed1", "softmax_seed1"]
    with pytest.raises(ValueError, match="several sources are called"):
        find_sources([str(tmp_path / "*" / "softmax_seed1")])
    with pytest.raises(FileNotFoundError, match="no folder matches"):
        find_sources([str(tmp_path / "c" / "*")])
    with pytest.raises(ValueError, match="model.attn is 'diff'"):
        read_source(tmp_path / "a" / "diff_seed1")


# -- the whole pipeline ------------------------------------------------------------------------------
@pytest.mark.slow
def test_convert_study_quick_end_to_end(tmp_path: Path, monkeypatch) -> None:
    """Real processes: two tiny source runs, every arm, the report; V2 starts exactly where the source ended."""
    from recipes import convert_study

    sources = [_quick_source(tmp_path / "sources", seed) for seed in (100, 101)]
    out = tmp_path / "study"
    res = convert_study.main(["--quick", "--source-runs", str(tmp_path / "sources" / "softmax_seed*"), "--jobs", "2",
                              "--out", str(out)])
    runs = res["runs"]
    assert len(runs) == 2 * 8 and not [k for k, r in runs.items() if r.get("failed")]
    for src in sources:
        source = json.loads(next(src.glob("version_*/summary.json")).read_text())["metrics"]
        for arm in ("diff_v2_converted", "softmax_continued"):  # exact end to end: step 0 = the source's last score
            start = runs[f"{src.name}/{arm}/step0"]["metrics"]
            assert (start["val/acc"], start["test/acc"]) == (source["val/acc"], source["test/acc"])
        v2 = runs[f"{src.name}/diff_v2_converted/finetune"]
        assert v2["summary"]["global_step"] == 4 and [s for s, _ in v2["curves"]["val/acc"]] == [1, 3]
        assert runs[f"{src.name}/diff_scratch/scratch"]["summary"]["global_step"] == 8  # 4 source + 4 steps
    assert res["conversion_check"]["diff_v2_converted"] == [0.0, 0.0]
    text = (out / "convert_study.md").read_text()
    for arm in ("softmax_continued", "diff_v2_converted", "diff_converted", "diff_scratch", "diff_v2_scratch"):
        assert f"| {arm} | 2 |" in text
    assert (out / "curves.png").stat().st_size > 1000
    saved = json.loads((out / "results.json").read_text())
    assert saved["runs"].keys() == runs.keys()

    # a second call with the same arguments trains nothing
    monkeypatch.setattr(convert_study, "train", lambda *a, **k: pytest.fail("trained again"))
    again = convert_study.main(["--quick", "--source-runs", *map(str, sources), "--out", str(out)])
    assert again["runs"] == runs
