"""Which objects keep the first (plan-building) call's frames alive? Prints, for each frame that
refers to O after the caller dropped it, its function and what refers to that frame, two levels
up (tracebacks, exceptions, cells, dicts), with the types and repr heads.

    python tools/probe_first_call_cycle.py [--seq 4096]
"""

from __future__ import annotations

import argparse
import gc
import types
import weakref

import torch

import te_cudnn as tc


def describe(x) -> str:
    if isinstance(x, types.FrameType):
        return f"frame {x.f_code.co_name} ({x.f_code.co_filename.rsplit('/', 2)[-1]}:{x.f_lineno})"
    if isinstance(x, types.TracebackType):
        return f"traceback at {x.tb_frame.f_code.co_name}:{x.tb_lineno}"
    if isinstance(x, BaseException):
        return f"exception {type(x).__name__}: {str(x)[:120]}"
    return f"{type(x).__name__} {repr(x)[:100]}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=4096)
    s = p.parse_args().seq
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(1, s, 32, 128, device=dev, dtype=dt)
    k, v = (torch.randn(1, s, 8, 128, device=dev, dtype=dt) for _ in range(2))
    d_o = torch.randn_like(q)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    gc.disable()
    out, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, dt, None, **kw)
    grads = tc.fused_attn_bwd(s, s, None, None, q, k, v, out, d_o, dt, aux, None, **kw)
    refs = {"out": weakref.ref(out), "dq": weakref.ref(grads[0])}
    del out, aux, grads
    for name, ref in refs.items():
        t = ref()
        print(f"== {name} alive: {t is not None}")
        if t is None:
            continue
        for holder in gc.get_referrers(t):
            if holder is globals() or isinstance(holder, list) and holder is gc.garbage:
                continue
            print("  held by", describe(holder))
            for h2 in gc.get_referrers(holder):
                if isinstance(h2, (types.FrameType, types.TracebackType, BaseException, types.CellType, dict)):
                    print("    <-", describe(h2))
                    for h3 in gc.get_referrers(h2)[:6]:
                        if isinstance(h3, (types.TracebackType, BaseException, types.FrameType, dict, list)):
                            print("       <-", describe(h3))
        del t
    # everything the cycle holds: gc.collect() with DEBUG_SAVEALL keeps the unreachable objects
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    kinds: dict = {}
    for x in gc.garbage:
        kinds[type(x).__name__] = kinds.get(type(x).__name__, 0) + 1
        if isinstance(x, (types.FrameType, types.TracebackType, BaseException)):
            print("  cycle:", describe(x))
        elif isinstance(x, types.FunctionType):
            print("  cycle: function", x.__qualname__, x.__code__.co_filename.rsplit("/", 2)[-1])
    print("cycle object types:", kinds)
    gc.set_debug(0)
    gc.garbage.clear()
    gc.enable()


if __name__ == "__main__":
    main()
