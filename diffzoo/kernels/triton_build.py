"""Static build report of the fused Triton kernels: what a launch compiles to, read without a GPU.

For each launch configuration this module runs the backend's own wrapper on CPU tensors of a stated
problem with the kernel launch intercepted, so the argument list, the integer specialisation (16-byte
divisibility of pointers, strides and lengths; arguments equal to 1 folded to constants) and the
compile options are exactly those a CUDA launch of that problem would use. It then compiles the kernel
for a GPU target (``sm_90a`` or ``sm_80``) with Triton's bundled toolchain and reads from the build:

* registers per thread and spilled bytes (``ptxas -v``), shared memory per program;
* the instruction of every matrix product (``wgmma``: Hopper warp-group MMA, ``mma.sync``: Ampere-style
  warp MMA, ``fma``: no tensor cores) and how many times its result tile is held by the warps
  (``copies`` > 1: warps compute the same tile again, the work of the product and of everything
  elementwise on its result is repeated);
* whether each loop that contains a product is software-pipelined (asynchronous copies into
  multi-buffered shared memory);
* the memory semantics of the global atomics and the memory barriers in the machine code (SASS).

Needs a Triton with the NVIDIA backend and a process in which ``TRITON_INTERPRET`` was not set before
triton was imported. ``python -m benchmarks.kernels --static`` prints the report.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from . import triton_diff as td

# shared memory one program may use: H100 (sm_90); for the sm80 tables the A100 (163 KB), and for their
# pinned configurations the smallest of the family (sm_86 / sm_89: 99 KB), since a pinned configuration
# is launched without the autotuner, which would skip one that does not fit
SHARED_LIMIT = {90: 232448, 80: 166912}
PINNED_SHARED_LIMIT = {90: 232448, 80: 101376}
# Spill stores a shipped entry may have, in bytes per thread. Measured on an H200 (docs/kernels.md, "Measured
# on a GPU"): the fastest entry of each sm90 forward and dK/dV list spills 24-244 B, and each ran 1.2-1.35x
# faster than the spill-free pinned entry it replaced. Larger spills stay out.
SPILL_LIMIT = 256
ARCH_FAMILY = {90: "sm90", 80: "sm80"}
KIND_LABEL = {"fwd": "forward", "bwd_kv": "backward dK/dV (+ dQ by atomics on the atomic dQ path)",
              "bwd_q": "backward dQ (no atomics)"}
# The products of each kernel, by the variable their result is assigned to in triton_diff.py.
PRODUCTS = {
    "fwd": {"s1": "Q1 K1^T", "s2": "Q2 K2^T", "pv1": "P1 V", "pv2": "P2 V"},
    "bwd_kv": {"s1": "K1 Q1^T", "s2": "K2 Q2^T", "dv": "(P1 - lam P2)^T dO", "dp": "V dO^T", "dk1": "dS1^T Q1",
               "dk2": "dS2^T Q2", "dq1": "dS1 K1 (atomic)", "dq2": "dS2 K2 (atomic)"},
    "bwd_q": {"s1": "Q1 K1^T", "s2": "Q2 K2^T", "dp": "dO V^T", "dq1": "dS1 K1", "dq2": "dS2 K2"},
}


@dataclass(frozen=True)
class Problem:
    """The launch the report specialises for (any problem with the same divisibility compiles the same)."""

    batch: int = 2
    heads: int = 8  # differential heads H (2H query heads)
    kv_heads: int = 8  # key/value groups (H == kv_heads: no grouped-query loop; 1 is folded into the code)
    tokens: int = 1024  # Nq = Nk
    causal: bool = True
    dtype: torch.dtype = torch.bfloat16

    def describe(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        return (f"{dt}, B={self.batch}, H={self.heads}, H_kv={self.kv_heads}, N={self.tokens}, "
                f"causal={self.causal}, contiguous (B, heads, N, width) tensors, training (dQ on each family's "
                f"default path: {', '.join(f'{fam} {path}' for fam, path in td.DQ_DEFAULT.items())})")


@dataclass
class Product:
    name: str  # variable in the source
    shape: tuple[int, int, int]  # M, N, K
    kind: str  # wgmma, mma.sync or fma
    copies: float  # how many times the warps hold the result tile

    @property
    def label(self) -> str:
        return f"{self.name} {self.shape[0]}x{self.shape[1]}x{self.shape[2]} {self.kind}" + (
            f" x{self.copies:g}" if self.copies > 1 else "")


@dataclass
class BuildReport:
    kind: str
    arch: int
    d: int
    config: td.Config
    registers: int
    spill_bytes: int
    shared_bytes: int
    products: list[Product]
    loops: int  # loops that contain a product
    pipelined_loops: int
    atomics: dict[str, int] = field(default_factory=dict)  # PTX memory semantics -> count
    sass_membar: int = 0
    error: str | None = None

    @property
    def label(self) -> str:
        bm, bn, w, st = self.config
        return f"{self.kind:6s} sm_{self.arch}{'a' if self.arch == 90 else ' '} d={self.d:3d} {bm:3d}x{bn:3d} w{w} s{st}"

    def violations(self, pinned: bool = False) -> list[str]:
        """The rules a shipped configuration must meet (docs/kernels.md, "Choosing configurations")."""
        if self.error:
            return [f"does not compile: {self.error}"]
        out = []
        if self.spill_bytes > SPILL_LIMIT:
            out.append(f"spills {self.spill_bytes} B > {SPILL_LIMIT} B")
        limit = (PINNED_SHARED_LIMIT if pinned else SHARED_LIMIT)[self.arch]
        if self.shared_bytes > limit:
            out.append(f"shared memory {self.shared_bytes} B > {limit} B")
        for p in self.products:
            if p.copies > 1:
                out.append(f"{p.name} result tile held {p.copies:g} times")
            if p.kind == "fma":
                out.append(f"{p.name} runs on FMA units")
            if self.arch == 90 and p.shape[0] >= 64 and p.kind != "wgmma":
                out.append(f"{p.name} has {p.shape[0]} rows but uses {p.kind}, not wgmma")
        if self.config[3] > 1 and self.pipelined_loops < self.loops:
            out.append(f"{self.loops - self.pipelined_loops} of {self.loops} product loops not pipelined")
        if any(sem != "relaxed" for sem in self.atomics):
            out.append(f"atomics with semantics {sorted(self.atomics)}")
        if self.sass_membar:
            out.append(f"{self.sass_membar} GPU-wide MEMBAR / L1 invalidations in the machine code")
        return out


# Rules a shipped configuration of (kernel, target family, width) may break, with the reason; the report
# fails on any other violation. docs/kernels.md ("Choosing configurations") explains each.
_WIDE_ACCUMULATORS = (
    "at d = 128 the accumulators (two of 64 x 256 fp32 in the forward; dK1, dK2 and dV in the backward) need "
    "more registers than one warp group has: every build that holds each score tile once spills, and the "
    "spill-free builds split the value width over two warp groups, which then both compute the score tiles"
)
EXCEPTIONS: dict[tuple[str, str, int], tuple[str, str]] = {
    ("fwd", "sm90", 128): (r"^s[12] result tile held 2 times$", _WIDE_ACCUMULATORS),
    ("fwd", "sm80", 128): (r"^s[12] result tile held 2 times$", _WIDE_ACCUMULATORS),
    ("bwd_kv", "sm90", 128): (r"^(s[12]|dp) result tile held 2 times$", _WIDE_ACCUMULATORS),
    ("bwd_kv", "sm80", 128): (r"^(s[12]|dp) result tile held 2 times$", _WIDE_ACCUMULATORS),
}


def unexplained(report: BuildReport, pinned: bool = False) -> list[str]:
    """Violations of ``report`` that no entry of :data:`EXCEPTIONS` explains."""
    allowed = EXCEPTIONS.get((report.kind, ARCH_FAMILY[report.arch], report.d))
    return [v for v in report.violations(pinned) if not (allowed and re.match(allowed[0], v))]


# --------------------------------------------------------------------------------------------------
# Capturing the launch arguments from the backend's own wrapper
# --------------------------------------------------------------------------------------------------


def capture_launches(d: int, problem: Problem = Problem(), config: dict[str, td.Config] | None = None,
                     deterministic: bool = False, dq: str = "atomic") -> dict[str, tuple]:
    """``{kernel kind: (jit function, args, kwargs)}`` of a forward and backward of ``problem``.

    Runs ``_forward_impl`` and ``_backward_impl`` on CPU tensors with the launch replaced by a recorder,
    with ``config[kind]`` forced for each kernel and dQ on path ``dq`` (``"split"`` when deterministic).
    """
    if td.INTERPRET:
        raise RuntimeError("the build report compiles kernels: run it without TRITON_INTERPRET=1")
    p = problem
    B, H, Hkv, N = p.batch, p.heads, p.kv_heads, p.tokens
    q = torch.zeros(B, 2 * H, N, d, dtype=p.dtype)
    k = torch.zeros(B, 2 * Hkv, N, d, dtype=p.dtype)
    v = torch.zeros(B, Hkv, N, 2 * d, dtype=p.dtype)
    lam = torch.zeros((), dtype=torch.float32)
    captured: dict[str, tuple] = {}

    def record(kernel, grid, args, kwargs):
        kind = next((k for k, fn in td.KERNELS.items() if fn is kernel), "delta")
        captured[kind] = (kernel, args, kwargs)

    saved = td._run_kernel
    td._run_kernel = record
    try:
        forced = {kind: (64, 64, 4, 1) for kind in td.KERNELS}  # every launch forced: no device is asked
        forced.update(config or {})
        with contextlib.ExitStack() as stack:
            stack.enter_context(td.dq_path(dq))
            for kind, cfg in forced.items():
                stack.enter_context(td.forced_config(kind, cfg))
            out, parts, lse = td._forward_impl(q, k, v, lam, None, None, p.causal, d**-0.5, True, deterministic)
            td._backward_impl(torch.zeros_like(out), q, k, v, lam, None, None, parts, lse, p.causal, d**-0.5,
                              deterministic)
    finally:
        td._run_kernel = saved
    return captured


# --------------------------------------------------------------------------------------------------
# Compiling and reading a build
# --------------------------------------------------------------------------------------------------


def compile_launch(fn, args: tuple, kwargs: dict, arch: int):
    """Compile one captured launch for ``sm_<arch>`` exactly as the jit runtime would specialise it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton_compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def _toolchain(tool: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


def _ptxas_usage(ptx: str, arch: int) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        proc = subprocess.run([_toolchain("ptxas"), "-v", f"--gpu-name={gpu}", path, "-o", path + ".o"],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr else ''}")
    regs = re.search(r"Used (\d+) registers", proc.stderr)
    spill = re.search(r"(\d+) bytes spill stores", proc.stderr)
    return int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else 0


def _sass_membar(cubin: bytes) -> int:
    """GPU- or system-wide memory barriers and L1 invalidations in the machine code (an ``acq_rel`` atomic
    compiles to both; the CTA-scope barriers around Hopper's asynchronous MMA are not counted)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        proc = subprocess.run([_toolchain("nvdisasm"), path], capture_output=True, text=True)
    if proc.returncode != 0:
        return -1
    return len(re.findall(r"\bMEMBAR\.\w+\.(?:GPU|SYS)\b|\bCCTL\.IVALL\b", proc.stdout))


_LAYOUT = re.compile(r"^#(\w+) = #ttg\.(nvidia_mma|blocked)<\{(.*)\}>", re.M)
_DOT = re.compile(
    r"%([A-Za-z_][\w]*?)(?:_\d+)?(?::\d+)? = (ttng\.warp_group_dot|tt\.dot) (.*?) : (\S+?<(\d+)x(\d+)x\w+[^>]*>)"
    r".*-> tensor<(\d+)x(\d+)xf32, #(\w+)>")


def _ints(text: str, key: str) -> list[int]:
    m = re.search(key + r" = \[([\d, ]+)\]", text)
    return [int(x) for x in m.group(1).split(",")] if m else []


def _copies(layout: tuple[str, str], M: int, N: int) -> float:
    """How many times a layout's threads cover an ``M x N`` tile (1 = each element held once)."""
    kind, body = layout
    warps = _ints(body, "warpsPerCTA")
    if kind == "nvidia_mma":
        version = re.search(r"versionMajor = (\d+)", body)
        major = int(version.group(1)) if version else 2
        instr = _ints(body, "instrShape")
        rows, cols = 16 * warps[0], (instr[1] if major >= 3 else 8) * warps[1]
    else:
        size, threads = _ints(body, "sizePerThread"), _ints(body, "threadsPerWarp")
        rows, cols = size[0] * threads[0] * warps[0], size[1] * threads[1] * warps[1]
    return max(1.0, rows / M) * max(1.0, cols / N)


def parse_products(ttgir: str) -> list[Product]:
    layouts = {name: (kind, body) for name, kind, body in _LAYOUT.findall(ttgir)}
    found = []
    for m in _DOT.finditer(ttgir):
        name, op = m.group(1), m.group(2)
        M, K = int(m.group(5)), int(m.group(6))
        N = int(m.group(8))
        layout = layouts.get(m.group(9), ("blocked", ""))
        if op == "ttng.warp_group_dot":
            kind = "wgmma"
        elif layout[0] == "nvidia_mma":
            kind = "mma.sync"
        else:
            kind = "fma"
        found.append(Product(name, (M, N, K), kind, _copies(layout, M, N) if layout[1] else 1.0))
    return found


def _loop_bodies(ttgir: str) -> Iterator[str]:
    """The text of every ``scf.for`` region (nested loops included in their parent's text)."""
    for m in re.finditer(r"scf\.for .*?\{\n", ttgir):
        depth, i = 1, m.end()
        while depth and i < len(ttgir):
            c = ttgir[i]
            depth += c == "{"
            depth -= c == "}"
            i += 1
        yield ttgir[m.end():i]


def parse_loops(ttgir: str) -> tuple[int, int]:
    """``(loops containing a product, of them pipelined)``; innermost loops only."""
    loops = pipelined = 0
    for body in _loop_bodies(ttgir):
        if "scf.for" in body or not re.search(r"ttng\.warp_group_dot|tt\.dot ", body):
            continue
        loops += 1
        pipelined += bool(re.search(r"async_copy_global_to_local|async_tma_copy", body))
    return loops, pipelined


def parse_atomics(ptx: str) -> dict[str, int]:
    sems: dict[str, int] = {}
    for instr in re.findall(r"\b(?:atom|red)\.[\w.:]*global[\w.:]*", ptx):
        sem = next((s for s in ("relaxed", "acq_rel", "acquire", "release", "sc") if f".{s}" in instr), "relaxed")
        sems[sem] = sems.get(sem, 0) + 1
    return sems


def build_report(kind: str, d: int, config: td.Config, arch: int, problem: Problem = Problem(),
                 dq: str | None = None) -> BuildReport:
    """Compile kernel ``kind`` for head width ``d`` with ``config`` as a launch would, and read the build.

    ``dq``: the dQ path of the backward; by default the family's (``td.DQ_DEFAULT``), which decides whether
    the dK/dV kernel carries the atomic dQ products.
    """
    dq = dq or td.DQ_DEFAULT[ARCH_FAMILY[arch]]
    try:
        fn, args, kwargs = capture_launches(d, problem, {kind: config}, deterministic=kind == "bwd_q", dq=dq)[kind]
        kernel = compile_launch(fn, args, kwargs, arch)
        regs, spill = _ptxas_usage(kernel.asm["ptx"], arch)
    except Exception as e:  # noqa: BLE001 - a configuration that does not build is a finding, not a crash
        msg = str(e).strip().splitlines()
        return BuildReport(kind, arch, d, config, -1, -1, -1, [], 0, 0, error=f"{type(e).__name__}: "
                           f"{msg[-1][:120] if msg else ''}")
    loops, pipelined = parse_loops(kernel.asm["ttgir"])
    return BuildReport(
        kind, arch, d, config, regs, spill, int(kernel.metadata.shared), parse_products(kernel.asm["ttgir"]),
        loops, pipelined, parse_atomics(kernel.asm["ptx"]), _sass_membar(kernel.asm["cubin"]),
    )


def summarise(report: BuildReport) -> dict[str, Product]:
    """One row per product name (the masked and unmasked loops compile each product twice)."""
    by_name: dict[str, Product] = {}
    for p in report.products:
        seen = by_name.get(p.name)
        if seen is None or p.copies > seen.copies or (seen.kind == "wgmma" and p.kind != "wgmma"):
            by_name[p.name] = p
    return by_name


def format_report(report: BuildReport, pinned: bool = False) -> str:
    if report.error:
        return f"{report.label}: {report.error}"
    prods = ", ".join(p.label for p in summarise(report).values())
    atom = ", ".join(f"{n} {s}" for s, n in sorted(report.atomics.items())) or "none"
    bad = unexplained(report, pinned)
    excused = len(report.violations(pinned)) - len(bad)
    return (f"{report.label}: {report.registers:3d} regs, spill {report.spill_bytes} B, shared "
            f"{report.shared_bytes // 1024} KB, pipelined {report.pipelined_loops}/{report.loops}, atomics {atom}, "
            f"MEMBAR {report.sass_membar}; {prods}" + (f"  << {'; '.join(bad)}" if bad else "  ok")
            + (f" ({excused} documented exception{'s' * (excused > 1)})" if excused else ""))


def shipped(arch: int, widths=(64, 128), kinds=("fwd", "bwd_kv", "bwd_q")) -> Iterator[tuple[str, int, td.Config, bool]]:
    """``(kind, d, config, pinned)`` of every configuration in the shipped tables for ``sm_<arch>``."""
    for kind in kinds:
        for d in widths:
            for i, config in enumerate(td.CONFIGS[kind][ARCH_FAMILY[arch]][td.width_bucket(d)]):
                yield kind, d, config, i == 0


def markdown_table(reports: list[tuple[BuildReport, bool]]) -> str:
    """The report as the Markdown table docs/kernels.md carries (``(report, pinned)`` per row)."""
    lines = [
        "| kernel | target | d | BLOCK_M x BLOCK_N, warps, stages | registers | spilled B | shared KB | "
        "products (MMA, copies of the result tile) | pipelined loops | atomics | GPU-wide barriers | rules |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, pinned in reports:
        bm, bn, w, st = r.config
        cfg = f"{bm} x {bn}, {w}, {st}" + (" (pinned)" if pinned else "")
        target = f"sm_{r.arch}" + ("a" if r.arch == 90 else "")
        if r.error:
            lines.append(f"| {r.kind} | {target} | {r.d} | {cfg} | | | | | | | | does not build |")
            continue
        prods = ", ".join(
            f"{p.name} {p.kind}" + (f" x{p.copies:g}" if p.copies > 1 else "")
            for p in summarise(r).values()
        )
        atom = ", ".join(f"{n} {s}" for s, n in sorted(r.atomics.items())) or "-"
        bad = unexplained(r, pinned)
        rules = "; ".join(bad) or ("met" if not r.violations(pinned) else "exception (below)")
        lines.append(
            f"| {r.kind} | {target} | {r.d} | {cfg} | {r.registers} | {r.spill_bytes} | {r.shared_bytes // 1024} | "
            f"{prods} | {r.pipelined_loops}/{r.loops} | {atom} | {r.sass_membar} | {rules} |"
        )
    return "\n".join(lines)
