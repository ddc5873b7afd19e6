"""The static build report of the Triton kernels: what each shipped configuration compiles to.

Runs where Triton's NVIDIA toolchain can compile (no GPU needed), in a subprocess without
``TRITON_INTERPRET`` (other test modules switch the interpreter on for this process). Every shipped
configuration must meet the rules or carry a documented exception, and the table in docs/kernels.md
must be the report's own output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- static-report:begin -->", "<!-- static-report:end -->"


def _toolchain_present() -> bool:
    try:
        import importlib.util

        spec = importlib.util.find_spec("triton")
    except Exception:  # noqa: BLE001
        return False
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


pytestmark = pytest.mark.skipif(not _toolchain_present(), reason="Triton's NVIDIA toolchain is not installed")


def _run(code: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_shipped_configurations_meet_the_rules_and_match_the_docs():
    proc = _run("import sys; from benchmarks.kernels import main; sys.exit(main(['--static', '--markdown']))")
    table = proc.stdout.strip()
    assert proc.returncode == 0, f"rules broken without a documented exception:\n{table}\n{proc.stderr[-3000:]}"
    docs = (ROOT / "docs" / "kernels.md").read_text()
    documented = docs.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert documented == table, "docs/kernels.md's table is not the report's output; regenerate it with " \
        "python -m benchmarks.kernels --static --markdown"


def test_report_reads_what_a_launch_compiles():
    """The capture specialises like a launch (16-byte divisibility), and the readers see what they claim:
    an acq_rel atomic brings GPU-wide barriers; 8 warps on a 64-row score tile hold it twice."""
    code = r'''
import json
from diffzoo.kernels import triton_build as tb, triton_diff as td
fn, args, kwargs = tb.capture_launches(64, tb.Problem(), {"fwd": (64, 32, 4, 2)})["fwd"]
kernel = tb.compile_launch(fn, args, kwargs, 90)
ttir = kernel.asm["ttir"]
relaxed = tb.build_report("bwd_kv", 64, (16, 128, 8, 2), 90, dq="atomic")
split = tb.build_report("bwd_kv", 64, (16, 128, 8, 2), 90, dq="split")
replicated = tb.build_report("fwd", 64, (64, 64, 8, 2), 90)
src = open(td.__file__).read()
print(json.dumps(dict(
    divisible=ttir.count("tt.divisibility = 16"),
    pipelined=[relaxed.pipelined_loops, relaxed.loops],
    atomics=relaxed.atomics, membar=relaxed.sass_membar,
    copies={p.name: p.copies for p in replicated.products},
    kinds={p.name: p.kind for p in relaxed.products},
    split_atomics=split.atomics, split_products=sorted({p.name for p in split.products}),
)))
'''
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["divisible"] >= 20  # pointers, strides and lengths of the launch carry the divisibility hint
    assert got["pipelined"][0] == got["pipelined"][1] > 0
    assert set(got["atomics"]) == {"relaxed"} and got["membar"] == 0
    assert got["copies"]["s1"] == 2 and got["copies"]["pv1"] == 1
    assert got["kinds"]["s1"] == "wgmma" and got["kinds"]["dq1"] == "mma.sync"  # dQ tiles have 16 rows
    # on the split dQ path the dK/dV kernel has neither the dQ products nor their atomics
    assert got["split_atomics"] == {} and got["split_products"] == ["dk1", "dk2", "dp", "dv", "s1", "s2"]


def test_docs_name_every_exception():
    from diffzoo.kernels import triton_build as tb

    docs = (ROOT / "docs" / "kernels.md").read_text()
    for kind, family, d in tb.EXCEPTIONS:
        assert re.search(rf"`{kind}`, {family}, d = {d}", docs), f"docs/kernels.md does not explain {kind} {family} {d}"
