"""Which way of capturing a torch SDPA *backward alone* in a CUDA graph works (the benchmark's
``bwd`` mode: a forward made before the capture, its graph retained, ``torch.autograd.grad``
captured), and what a failed capture leaves behind (reserved memory after ``empty_cache``).
Each variant runs in its own process, since a failed capture poisons the allocator.

    python tools/probe_autograd_capture.py [--backend cudnn|flash]
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import torch

VARIANTS = {
    "leaves_used_on_default_stream": "the benchmark today: leaves made and first used on the default stream",
    "fresh_leaves_on_capture_stream": "detached leaves made in setup, on the capture stream",
    "leaves_unused_before": "leaves made on the default stream, first used on the capture stream",
}


def child(variant: str, backend: str, gqa: bool) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    b, h, s, d = 2, 32, 4096, 128  # test_3's heads (32 query heads, 4 KV heads with --gqa)
    hk = 4 if gqa else h
    base = [torch.randn(b, n, s, d, device="cuda", dtype=torch.bfloat16) for n in (h, hk, hk)]
    d_o = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    leaves = [t.detach().requires_grad_() for t in base]

    def fwd(q, k, v):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    if variant == "leaves_used_on_default_stream":
        o = fwd(*leaves)
        torch.autograd.grad(o, leaves, d_o)
        del o
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ls = [t.detach().requires_grad_() for t in base] if variant == "fresh_leaves_on_capture_stream" else leaves
        out = fwd(*ls)
        for _ in range(2):
            torch.autograd.grad(out, ls, d_o, retain_graph=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    ok = "ok"
    try:
        with torch.cuda.graph(g, stream=side):
            for _ in range(3):
                torch.autograd.grad(out, ls, d_o, retain_graph=True)
        g.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        ok = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    del g, out, ls, leaves, base, d_o
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    print(f"RESULT {backend:6} gqa={int(gqa)} {variant:32} capture {ok}; reserved after empty_cache "
          f"{torch.cuda.memory_reserved() / 2**20:.0f} MiB (torch {torch.__version__})")


def main() -> int:
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        child(sys.argv[i + 1], sys.argv[i + 2], sys.argv[i + 3] == "1")
        return 0
    backends = [sys.argv[sys.argv.index("--backend") + 1]] if "--backend" in sys.argv else ["cudnn", "flash"]
    for be, (v, what), gqa in itertools.product(backends, VARIANTS.items(), ("0", "1")):
        p = subprocess.run([sys.executable, __file__, "--child", v, be, gqa], capture_output=True, text=True)
        lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT")]
        print(lines[-1] if lines else f"{be} {v}: child failed: {p.stderr[-800:]}", f"  [{what}]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
