"""The dispatcher's host cost for a Python custom op, by schema size, on this host: the same
trivial CPU body called directly and through ``torch.ops`` with 1, 5, 12 and 26 arguments
(te_cudnn's fwd schema), with and without a ``register_autograd`` formula.

    python tools/probe_dispatch.py
"""
import statistics
import time

import torch

from te_cudnn import torch_ops

lib = torch.library.Library("probe_dispatch", "DEF")


def body(q, *rest):
    return q.new_empty(0)


def body2(q, *rest):
    return q.new_empty(0), q.new_empty(0)


lib.define("a1(Tensor q) -> Tensor")
lib.define("a5(Tensor q, Tensor k, Tensor v, Tensor? b, str opts) -> Tensor")
lib.define("a12(Tensor q, Tensor k, Tensor v, Tensor? a, Tensor? b, Tensor? c, Tensor? d, Tensor? e, Tensor? f, "
           "Tensor? g, Tensor? h, str opts) -> Tensor")
lib.define("te" + torch_ops.FWD_SCHEMA)
lib.define("te_ag" + torch_ops.FWD_SCHEMA)
for n in ("a1", "a5", "a12"):
    lib.impl(n, body, "CPU")
for n in ("te", "te_ag"):
    lib.impl(n, body2, "CPU")
torch.library.register_autograd("probe_dispatch::te_ag", lambda ctx, *g: (None,) * 26,
                                setup_context=lambda ctx, i, o: None, lib=lib)


def timed(fn, n=20000):
    for _ in range(2000):
        fn()
    r = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        r.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(r)


def main() -> int:
    q = torch.randn(4)
    qr = torch.randn(4, requires_grad=True)
    o = "bshd_bshd_bshd|causal|no_bias|0.125|0.1|-1,0|None|None|vanilla|0|1"
    te_args = (None,) * 9 + (True, 128, 128, "bshd_bshd_bshd", "causal", "no_bias", None, 0.0, -1, 0, None, None, "vanilla", False)
    ops = torch.ops.probe_dispatch
    rows = {
        "body called directly": lambda: body(q),
        "1 argument": lambda: ops.a1.default(q),
        "5 arguments (options in one string)": lambda: ops.a5.default(q, q, q, None, o),
        "12 arguments": lambda: ops.a12.default(q, q, q, None, None, None, None, None, None, None, None, o),
        "26 arguments (te_cudnn fwd schema)": lambda: ops.te.default(q, q, q, *te_args),
        "26 arguments + register_autograd, no grad": lambda: ops.te_ag.default(q, q, q, *te_args),
    }
    with torch.no_grad():
        res = {n: timed(f) for n, f in rows.items()}
    res["26 arguments + register_autograd, grad inputs, grad mode off"] = None
    with torch.no_grad():
        res["26 arguments + register_autograd, grad inputs, grad mode off"] = timed(lambda: ops.te_ag.default(qr, qr, qr, *te_args))
    print("host us per call (CPU tensors, trivial body)")
    for n, us in res.items():
        print(f"  {n:62s} {us:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
