"""The GPU configuration sweep's candidate grid and its behaviour without CUDA (the timing itself needs a GPU)."""

from __future__ import annotations

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
