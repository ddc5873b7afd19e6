"""The GPU configuration sweep's candidate grid and its behaviour without CUDA (the timing itself needs a GPU)."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks import kernel_sweep as ks

triton_diff = pytest.importorskip("diffzoo.kernels.triton_diff")


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_grid_holds_every_shipped_entry_and_no_one_group_128_row_accumulator(family):
    todo = ks.candidates([64, 128], [False, True], family=family)
    assert len(todo) == len(set(todo))
    for kind in ks.KINDS:
        for d in (64, 128):
            got = {c for k, dd, causal, c in todo if k == kind and dd == d and not causal}
            assert set(triton_diff.CONFIGS[kind][family][d]) <= got, (kind, d)
            assert got == {c for k, dd, causal, c in todo if k == kind and dd == d and causal}
            for bm, bn, warps, stages in got - set(triton_diff.CONFIGS[kind][family][d]):
                rows = bn if kind == "bwd_kv" else bm
                assert not (warps == 4 and rows == 128)
                assert stages in (2, 3) and bm >= 16 and bn >= 32


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_it_says_so_and_measures_nothing(capsys):
    assert ks.main(["--json", "never-written.json"]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_relative_error_flags_a_wrong_tensor():
    want = (torch.ones(4, 4), torch.full((3,), 2.0))
    assert ks.relative_error(want, want) == 0.0
    off = (torch.ones(4, 4), torch.tensor([2.0, 2.0, 2.2]))
    assert ks.relative_error(off, want) == pytest.approx(0.1, rel=1e-4) and ks.relative_error(off, want) > ks.MAX_ERR


def test_one_candidate_of_each_kernel_checks_and_times_in_the_interpreter():
    """The sweep's own check and timing code, run on CPU by Triton's interpreter at a tiny size (block sizes
    only; nothing it times means anything there)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = r'''
import json
from benchmarks import kernel_sweep as ks
todo = ks.candidates([16], [True], family="sm90")
items = [next(it for it in todo if it[0] == kind) for kind in ks.KINDS]
rows = [ks.check_one(it, n=48, width=32, tokens=48, family="sm90", device="cpu") for it in items]
entry = ks.time_group(rows, 16, True, 48, 32, 48, warmup=0, reps=1, family="sm90", device="cpu")
from diffzoo.kernels import triton_diff as td
print(ks.format_rows(rows, lambda kind, d: td.CONFIGS[kind]["sm90"][td.width_bucket(d)]))
from benchmarks import kernels as kb
dq = kb.compare_dq([48], [16], [True], width=32, tokens=48, warmup=0, reps=1, rounds=2, device="cpu")
print(json.dumps(dict(rows=rows, entry={k: v for k, v in entry.items() if k != "best"}, best=sorted(entry["best"]),
                      dq=dq)))
'''
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    got = json.loads(lines[-1])
    table = lines[-6:-2]  # the printed list (then the dQ comparison's line): a header and one line per candidate, each with its time
    assert table[0].startswith("kernel")
    assert sorted(line.split()[0] for line in table[1:]) == sorted(ks.KINDS)
    assert all(re.search(r" \d+\.\d{3}  .*err \d", line) for line in table[1:]), table  # a time and an error each
    assert [r["kind"] for r in got["rows"]] == list(ks.KINDS)
    for r in got["rows"]:
        assert r["ok"] and "error" not in r and r["err"] <= ks.MAX_ERR, r
        assert r["ms"] > 0
    assert got["best"] == sorted(ks.KINDS)
    assert all(got["entry"][k] > 0 for k in ("best_fwd_bwd_ms", "pinned_fwd_bwd_ms", "sdpa_fwd_bwd_ms"))
    # bwd_q runs only with deterministic algorithms, so its pinned-or-best pair is timed that way too
    for which in ("best", "pinned"):
        for prefix in ("", "det_"):
            runs = got["entry"][f"{prefix}{which}_fwd_bwd_runs_ms"]
            assert len(runs) == ks.ROUNDS and all(t > 0 for t in runs)
            assert got["entry"][f"{prefix}{which}_fwd_bwd_ms"] == sorted(runs)[len(runs) // 2]
    # the dQ-path comparison (benchmarks.kernels --compare-dq): both paths timed once per round, alternated
    (dq,) = got["dq"]
    assert "error" not in dq, dq
    for path in ("atomic", "split"):
        assert len(dq[f"{path}_runs_ms"]) == 2 and all(t > 0 for t in dq[f"{path}_runs_ms"])
    assert dq["split_over_atomic"] == pytest.approx(dq["split_ms"] / dq["atomic_ms"])
    assert lines[-2].split()[:3] == ["True", "16", "48"]
