import math

import pytest
import torch

from benchmarks import denormals as bench


def test_subnormal_fraction_counts_probabilities_below_the_smallest_normal_float():
    # exp(-95) = 5.5e-42 is subnormal in float32; exp(-50) is normal; exp(-200) underflows to exactly zero
    scores = torch.tensor([[0.0, -95.0], [0.0, -50.0], [0.0, -200.0], [0.0, -100.0]])
    assert bench.subnormal_fraction(torch.softmax(scores, dim=-1)) == pytest.approx(2 / 8)
    assert bench.subnormal_fraction(torch.softmax(torch.zeros(3, 5), dim=-1)) == 0.0


def test_layer_table_finds_subnormals_only_where_the_logits_spread(capsys):
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals to zero")
    bench.main(["--spreads", "1", "8", "--backends", "reference", "--n", "64", "--heads", "1", "--dim", "16",
                "--batch", "1", "--repeats", "1", "--iters", "1", "--threads", "1"])
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| spread")]
    assert [r[0] for r in rows] == ["| spread 1, `reference`", "| spread 8, `reference`"]
    fractions = [float(r[1]) for r in rows]
    assert fractions[0] == 0.0 and fractions[1] > 0.0  # logits of sd ~1 never reach 87 below a row's max
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
    assert "1 thread(s)" in out and "load average" in out
    assert torch.set_flush_denormal(False)  # left off, as before


def test_run_table_reads_a_cluttered_run_folder(tmp_path, capsys):
    yaml = pytest.importorskip("yaml")
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals to zero")
    from diffzoo.data.cluttered import ClutteredDigitsDataModule
    from diffzoo.tasks.cluttered import VariantImageTask
    from diffzoo.weights.export import export_module

    with pytest.raises(SystemExit, match="no config.yaml and model.safetensors"):
        bench.main(["--run", str(tmp_path)])
    data = {"k": 2, "canvas": 35, "fragment": 14, "num_val": 32, "num_test": 32, "batch_size": 8, "seed": 0,
            "align": 7}
    dm = ClutteredDigitsDataModule(**data)
    folder = tmp_path / "diff_lr0.008_seed0" / "version_0"
    folder.mkdir(parents=True)
    model = {"attn": "diff", "size": "nano_patch7_28", "patch_size": 7}
    task = VariantImageTask(**model, num_classes=dm.num_classes, in_chans=dm.in_chans, img_size=dm.img_size)
    export_module(task, folder / "model.safetensors")
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": model, "data": data}))
    bench.main(["--run", str(folder.parent), "--repeats", "1", "--iters", "1", "--threads", "1"])
    line = [x for x in capsys.readouterr().out.splitlines() if "diff_lr0.008_seed0" in x]
    assert len(line) == 1 and "(batch 8)" in line[0]
    fraction = float(line[0].split(" | ")[1])
    assert not math.isnan(fraction)  # the attention layers' logits were found through their hooks
