"""Per-clip speech statistics: test_clips.csv from a real fit, the voice-level bootstrap, the SNR interaction
test, and the study records that carry the clips (diffzoo.stats, diffzoo.tasks.callbacks.clips,
diffzoo.study.sweep / runs / tables)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from diffzoo.stats import cluster_bootstrap_diff, snr_interaction
from diffzoo.study import sweep, tables
from diffzoo.study.families import FAMILIES
from diffzoo.study.runs import read_test_clips

from test_speech_data import TINY_WORDS, make_speech_commands, tiny_synth_config  # tests/ is on sys.path
from test_speech_recipe import TINY_MODEL

COLUMNS = ["index", "voice", "snr_db", "label", "pred", "correct"]


# -- test_clips.csv from a real (tiny) fit ------------------------------------------------------------
def test_fit_writes_every_test_clip_with_the_voice_and_snr_it_was_made_with(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    import diffzoo.data.speech as speech_data
    from diffzoo.data.speech import SynthKeywordDataset
    from diffzoo.data.synth import load_or_synthesize
    from recipes.speech_commands import cli_main

    monkeypatch.setattr(speech_data, "SynthConfig", lambda **kw: tiny_synth_config(tuple(kw["clips_per_word"])))
    cli = cli_main(["fit", "--model.model_kwargs", TINY_MODEL, "--data.init_args.clips_per_word", "[3, 1, 2]",
                    "--data.init_args.silence_clips", "[3, 1, 2]", "--data.init_args.snr_db", "[0.0, 20.0]",
                    "--data.init_args.batch_size", "36", "--trainer.max_steps", "2",
                    "--trainer.enable_model_summary", "false"])
    run = Path(cli.trainer.log_dir)
    with open(run / "test_clips.csv") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        assert reader.fieldnames == COLUMNS
    test_set = cli.datamodule.test_set
    assert [int(r["index"]) for r in rows] == list(range(len(test_set))) and len(rows) == 24  # 2 per class
    # the voices, read independently from the synthesised data (index into the split's voice names)
    data = load_or_synthesize(tiny_synth_config((3, 1, 2)), "data/cache/speech_synth", show_progress=False)
    names = data["voices"]["test"]
    expected = [names[v] if v >= 0 else "" for v in data["test"]["voices"][test_set.rows].tolist()]
    assert [r["voice"] for r in rows] == expected and len(set(expected) - {""}) > 1
    assert [int(r["label"]) for r in rows] == test_set.labels
    silence = [r for r in rows if r["voice"] == ""]
    assert len(silence) == 2 and all(r["snr_db"] == "" for r in silence)  # noise only: no voice, no SNR
    spoken = [r for r in rows if r["voice"]]
    snrs = [float(r["snr_db"]) for r in spoken]
    assert all(0.0 <= x <= 20.0 for x in snrs) and len(set(snrs)) == len(snrs)  # drawn per clip
    # the recorded SNR is the one the clip was mixed at: the same clip rendered at exactly that SNR is the same
    # wave (every other draw of its seeded generator is unchanged), and at another SNR it is not
    for r in spoken[:4]:
        i, x = int(r["index"]), float(r["snr_db"])
        wave = test_set[i][0]
        kw = dict(split="test", num_classes=12, seed=0)
        at = SynthKeywordDataset(data["test"], TINY_WORDS, snr_db=(x, x), **kw)[i][0]
        off = SynthKeywordDataset(data["test"], TINY_WORDS, snr_db=(x + 3, x + 3), **kw)[i][0]
        assert torch.allclose(at, wave, atol=1e-5) and not torch.allclose(off, wave, atol=1e-3)
    # correct is pred == label, and its mean is the summary's test top-1
    assert all(int(r["correct"]) == int(int(r["pred"]) == int(r["label"])) for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    accuracy = sum(int(r["correct"]) for r in rows) / len(rows)
    assert accuracy == pytest.approx(summary["metrics"]["test/top1"], abs=1e-6)
    # the study's compact form of the same file
    compact = read_test_clips(run.parent)
    assert compact == [[r["voice"] or None, round(float(r["snr_db"]), 2) if r["snr_db"] else None, int(r["label"]),
                        int(r["pred"])] for r in rows]


def test_clip_info_at_a_fixed_snr_and_not_for_training(tmp_path: Path) -> None:
    from diffzoo.data.speech import SynthKeywordDataset
    from diffzoo.data.synth import load_or_synthesize

    cfg = tiny_synth_config((2, 1, 1))
    data = load_or_synthesize(cfg, tmp_path, show_progress=False)
    fixed = SynthKeywordDataset(data["val"], cfg.words, "val", snr_db=(-5.0, -5.0), voice_names=data["voices"]["val"])
    infos = [fixed.clip_info(i) for i in range(len(fixed))]
    assert {i["snr_db"] for i in infos} == {-5.0, None} and {i["voice"] for i in infos} - {None} <= set(data["voices"]["val"])
    train = SynthKeywordDataset(data["train"], cfg.words, "train")
    with pytest.raises(ValueError, match="afresh on every read"):
        train.clip_info(0)
    # Speech Commands: the speaker of each clip (the test list holds speaker s2), none for silence
    from diffzoo.data.speech import SpeechCommandsKeywords

    sc = SpeechCommandsKeywords(make_speech_commands(tmp_path / "sc"), "test")
    infos = [sc.clip_info(i) for i in range(len(sc))]
    assert {i["voice"] for i in infos} == {"s2", None} and {i["snr_db"] for i in infos} == {None}


# -- the voice-level bootstrap --------------------------------------------------------------------------
VOICES, PER_VOICE, SILENCE, SEEDS = 10, 30, 30, 8
CLUSTERS = [f"v{v}" for v in range(VOICES) for _ in range(PER_VOICE)] + [None] * SILENCE


def _bernoulli_runs(p: np.ndarray, rng: np.random.Generator, seeds: int = SEEDS) -> list[np.ndarray]:
    return [(rng.random(p.size) < p).astype(float) for _ in range(seeds)]


def test_bootstrap_is_wide_when_one_voice_carries_the_difference_and_narrow_when_all_do() -> None:
    rng = np.random.default_rng(0)
    n = len(CLUSTERS)
    base = np.full(n, 0.7)
    # uniform: a is 10 points better on every voice (and on silence)
    uni = cluster_bootstrap_diff(_bernoulli_runs(base + 0.1, rng), _bernoulli_runs(base, rng), CLUSTERS)
    # concentrated: same accuracy everywhere except voice v0, which a always gets right and b always wrong
    a, b = base.copy(), base.copy()
    a[:PER_VOICE], b[:PER_VOICE] = 1.0, 0.0
    runs_a, runs_b = _bernoulli_runs(a, rng), _bernoulli_runs(b, rng)
    conc = cluster_bootstrap_diff(runs_a, runs_b, CLUSTERS)
    assert uni.diff == pytest.approx(0.1, abs=0.02) and conc.diff == pytest.approx(0.1, abs=0.02)
    assert uni.ci_low > 0.02 and uni.p < 0.001  # excludes 0
    assert conc.ci_low <= 0.0 <= conc.ci_high and conc.p > 0.05  # one voice: it may not be in the test set
    assert conc.ci_high - conc.ci_low > 3 * (uni.ci_high - uni.ci_low)
    assert conc.n_clusters == VOICES and conc.n_unclustered == SILENCE and conc.n_clips == n
    v0 = conc.by_cluster[0]
    assert v0["cluster"] == "v0" and v0["diff"] == pytest.approx(1.0) and conc.by_cluster[-1]["cluster"] is None
    # the same data with every clip its own unit (no voices): a narrow interval that excludes 0 -- the
    # clustering is what widens it
    naive = cluster_bootstrap_diff(runs_a, runs_b, [None] * n)
    assert naive.ci_low > 0.0 and naive.ci_high - naive.ci_low < 0.5 * (conc.ci_high - conc.ci_low)
    # seeded: the same call gives the same numbers
    assert cluster_bootstrap_diff(runs_a, runs_b, CLUSTERS) == conc


def test_bootstrap_point_estimate_and_input_checks() -> None:
    a = [[1, 1, 0, 0], [1, 0, 0, 0]]
    b = [[0, 0, 0, 0]]
    r = cluster_bootstrap_diff(a, b, ["x", "x", "y", "y"], n_boot=200, resample_seeds=False)
    assert r.diff == pytest.approx(3 / 8) and r.mean_b == 0.0 and r.n_a == 2 and r.n_b == 1
    # only the voices are resampled here: voice y (no correct clip) drawn twice gives 0; x twice gives 3/4
    assert 0.0 <= r.ci_low and r.ci_high <= 0.75
    with pytest.raises(ValueError, match="same clips"):
        cluster_bootstrap_diff(a, b, ["x", "y", "y"])
    with pytest.raises(ValueError, match="same clips in the same order"):
        cluster_bootstrap_diff([[1, 0], [1]], b, ["x", "y"])


# -- the SNR interaction -----------------------------------------------------------------------------
def _logistic_runs(intercept: float, slope: float, snr: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    p = 1 / (1 + np.exp(-(intercept + slope * (np.nan_to_num(snr, nan=10.0) - 10.0))))
    return _bernoulli_runs(p, rng)


def test_interaction_detects_a_planted_interaction_and_not_a_main_effect_alone() -> None:
    rng = np.random.default_rng(1)
    snr = np.r_[rng.uniform(0.0, 20.0, VOICES * PER_VOICE), [np.nan] * SILENCE]  # silence has no SNR
    snr_list = [None if np.isnan(x) else float(x) for x in snr]
    b = _logistic_runs(0.5, 0.15, snr, rng)
    # a main effect only: one log-odds better at every SNR, same slope
    main = snr_interaction(_logistic_runs(1.5, 0.15, snr, rng), b, snr_list)
    assert main.p_perm > 0.2 and abs(main.diff) < 0.03 and main.perm_exact and main.perm_count == 12870
    assert main.n_clips == VOICES * PER_VOICE  # silence left out
    assert all(g["diff"] > 0 for g in main.gap_by_bin)  # a is better everywhere ...
    # an interaction: a does not lose accuracy with noise, b does (the gap grows as the SNR falls)
    inter = snr_interaction(_logistic_runs(1.5, 0.0, snr, rng), b, snr_list)
    assert inter.p_perm < 0.001 and inter.diff == pytest.approx(-0.15, abs=0.05) and inter.ci_high < 0
    gaps = [g["diff"] for g in inter.gap_by_bin]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] - gaps[-1] > 0.2  # bins from low to high SNR
    # on the linear (probability) scale the main effect near the ceiling flattens a's slope: it shows up as
    # an "interaction", which is why the default scale is the logit
    ceiling = _logistic_runs(3.5, 0.15, snr, rng)
    assert snr_interaction(ceiling, b, snr_list, scale="linear").p_perm < 0.01
    assert snr_interaction(ceiling, b, snr_list).p_perm > 0.05


def test_interaction_needs_a_varying_snr_and_handles_perfect_runs() -> None:
    with pytest.raises(ValueError, match="does not vary"):
        snr_interaction([[1, 0, 1]], [[0, 0, 1]], [-10.0, -10.0, -10.0])
    # a run with every clip right (separation) still gets a finite slope
    r = snr_interaction([[1, 1, 1, 1], [1, 1, 1, 0]], [[0, 0, 1, 1], [0, 1, 0, 1]], [0.0, 5.0, 10.0, 15.0])
    assert all(np.isfinite(r.slopes_a)) and r.slope_b > 0


# -- the study records ------------------------------------------------------------------------------
def _fake_training(clips_rows: list[list]):
    """A stand-in for ``runs.train`` that leaves a finished run folder (summary, metrics, test_clips.csv)."""
    def train(command: list[str], log: Path, append: bool = False, until: float | None = None) -> float:
        folder = Path(command[command.index("--trainer.logger.init_args.save_dir") + 1])
        name = command[command.index("--trainer.logger.init_args.name") + 1]
        run = folder / name / "version_0"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"metrics": {"val/top1": 0.5, "test/top1": 0.5}}))
        (run / "metrics.csv").write_text("step,val/top1,train/grad_norm\n10,0.5,1.0\n")
        # written for every run here (a grid run of the speech recipe does not score the test set at all), so
        # that the record's rule (final runs only) is what is tested
        with open(run / "test_clips.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            for i, (voice, snr, label, pred) in enumerate(clips_rows):
                w.writerow([i, voice or "", "" if snr is None else f"{snr:.4f}", label, pred, int(label == pred)])
        return 1.0
    return train


def test_final_runs_keep_their_clips_in_the_record_and_the_file_stays_small(tmp_path: Path, monkeypatch) -> None:
    rows = [["f1", 3.14159, 2, 2], ["m3", 17.5, 4, 1], [None, None, 11, 11]]
    monkeypatch.setattr(sweep, "train", _fake_training(rows))
    family = FAMILIES["speech"]
    final = sweep.train_run(family, tmp_path, "softmax", 1e-3, sweep.FINAL_SEED, False, [])
    grid = sweep.train_run(family, tmp_path, "softmax", 1e-3, 0, False, [])
    assert final["test_clips"] == [["f1", 3.14, 2, 2], ["m3", 17.5, 4, 1], [None, None, 11, 11]]
    assert "test_clips" not in grid  # a grid seed's record never carries test results
    results = {"family": "speech", "runs": {final["name"]: final, grid["name"]: grid}}
    text = sweep.dump_records(results)
    assert json.loads(text) == results
    assert '    ["m3",17.5,4,1],\n' in text  # one clip per line
    assert sweep.dump_records({"runs": {"old": {"seed": 100}}}) == json.dumps({"runs": {"old": {"seed": 100}}}, indent=1)


def _record(variant: str, lr: float, seed: int, clips: list[list], **extra) -> dict:
    return {"name": f"{variant}_lr{lr:g}_seed{seed}", "variant": variant, "lr": lr, "seed": seed, "knob": None,
            "summary": {"metrics": {}}, "test_clips": clips, "diverged": None, **extra}


def test_speech_voice_stats_compares_every_variant_with_softmax_from_the_records() -> None:
    rng = np.random.default_rng(2)
    snr = rng.uniform(0.0, 20.0, VOICES * PER_VOICE)
    table = [[f"v{i // PER_VOICE}", round(float(x), 2), int(i % 12)] for i, x in enumerate(snr)]
    table += [[None, None, 11]] * SILENCE
    snr_all = np.r_[snr, [np.nan] * SILENCE]

    def clips(correct: np.ndarray) -> list[list]:
        return [[v, s, y, y if c else (y + 1) % 12] for (v, s, y), c in zip(table, correct)]

    runs = {}
    for seed in range(100, 106):
        for variant, (icpt, slope) in {"softmax": (0.5, 0.15), "diff": (1.5, 0.0)}.items():
            r = _record(variant, 1e-3, seed, clips(_logistic_runs(icpt, slope, snr_all, rng)[0]))
            runs[r["name"]] = r
    runs["old"] = {**_record("diff", 1e-3, 106, []), "test_clips": None}  # recorded before runs kept clips
    del runs["old"]["test_clips"]
    runs["grid"] = _record("diff", 1e-3, 0, clips(np.ones(len(table))))  # a grid seed: not a final run
    runs["other_lr"] = _record("diff", 2e-3, 100, clips(np.ones(len(table))))  # not the best lr
    moved = clips(np.ones(len(table)))
    moved[0] = ["v9", *moved[0][1:]]
    runs["mismatch"] = _record("diff", 1e-3, 107, moved)  # other clips: left out, counted
    records = {"family": "speech", "best": {"softmax": {"lr": 1e-3}, "diff": {"lr": 1e-3}}, "runs": runs}
    result = tables.speech_voice_stats(records, n_boot=2000)
    assert (result["clips"], result["voices"], result["unclustered"], result["mismatched"]) == (330, 10, 30, 1)
    (row,) = result["rows"]
    assert row["variant"] == "diff" and row["n"] == 6 and row["n_reference"] == 6
    boot, inter = row["bootstrap"], row["interaction"]
    assert boot["ci_low"] < boot["diff"] < boot["ci_high"] and 0 < boot["diff"] < 100  # percent
    assert inter["diff"] < 0 and inter["p_perm"] < 0.01 and inter["perm_count"] == 924  # C(12, 6)
    text = tables.speech_voice_table(result)
    assert text.count("\n") == 2 and "| diff | 6 (6) |" in text
    # a records file without any clips (the study before this change) gives no rows, not an error
    assert tables.speech_voice_stats({"family": "speech", "best": records["best"],
                                      "runs": {"old": runs["old"]}})["rows"] == []


def test_report_shows_no_voice_statistics_of_a_variant_half_way_through_its_final_seeds(tmp_path: Path) -> None:
    """The study's report compares a speech variant with softmax by voices and SNR only once it has every final
    seed, as its headline table does: one finished V1 run beside softmax's eight is not a result."""
    from diffzoo.study import plan

    cell = plan.cell_named("speech")
    rng = np.random.default_rng(3)
    table = [[f"v{i // PER_VOICE}", round(float(x), 2), int(i % 12)]
             for i, x in enumerate(rng.uniform(0.0, 20.0, VOICES * PER_VOICE))]

    def clips() -> list[list]:
        return [[v, s, y, y if rng.random() < 0.8 else (y + 1) % 12] for v, s, y in table]

    def write(diff_seeds: int) -> str:
        runs = {}
        for variant, n in (("softmax", cell.final_seeds), ("diff", diff_seeds)):
            for seed in range(sweep.FINAL_SEED, sweep.FINAL_SEED + n):
                r = _record(variant, 1e-3, seed, clips())
                runs[r["name"]] = r
        records = {"family": "speech", "best": {"softmax": {"lr": 1e-3}, "diff": {"lr": 1e-3}}, "runs": runs}
        (tmp_path / "speech.json").write_text(json.dumps(records))
        return plan.report_markdown(tmp_path, [cell], plan.headline(tmp_path, [cell]), tmp_path)

    heading = "### Speech (`speech`): test voices resampled"
    assert heading not in write(1)
    assert heading not in write(cell.final_seeds - 1)
    text = write(cell.final_seeds)
    assert heading in text and f"| diff | {cell.final_seeds} ({cell.final_seeds}) |" in text
    # the function itself, asked for one variant, leaves the others out; without the reference it has no rows
    records = json.loads((tmp_path / "speech.json").read_text())
    assert tables.speech_voice_stats(records, n_boot=200, variants={"softmax"})["rows"] == []
    assert tables.speech_voice_stats(records, n_boot=200, variants={"diff"})["rows"] == []


def test_records_write_each_curve_on_one_line() -> None:
    curves = {"val/top1": [[0, 0.5], [1, 0.75]], "train/grad_norm": [], "note": "x"}
    results = {"runs": {"a": {"seed": 0, "curves": curves, "test_clips": [["f1", 1.0, 2, 2]]}}}
    text = sweep.dump_records(results)
    assert json.loads(text) == results
    assert '"val/top1": [[0,0.5],[1,0.75]]' in text and '"train/grad_norm": []' in text
    assert '    ["f1",1.0,2,2]\n' in text  # clips stay one per line
