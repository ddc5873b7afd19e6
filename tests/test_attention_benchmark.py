from benchmarks import attention as bench


def test_triton_row_only_on_a_cuda_device():
    cpu = [backend for _, _, backend in bench._candidates("module", device="cpu")]
    cuda = [backend for _, _, backend in bench._candidates("module", device="cuda:0")]
    assert "triton" not in cpu
    assert cuda == cpu[:4] + ["triton"] + cpu[4:]
    # the standard attention comes first (the ratio column divides by it); no timm row under a causal mask
    assert bench._candidates("module", device="cpu")[0][0] == bench.STANDARD
    assert all(impl != "timm" for _, impl, _ in bench._candidates("module", causal=True, device="cpu"))
