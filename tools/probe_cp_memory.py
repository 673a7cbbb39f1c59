"""Memory of one rank of a 2-way ring (te_cudnn.parallel.ring_rank_alone) against te_cudnn on the
same local length, per local token: forward peak, what the forward keeps, backward peak (cuDNN's
workspace included, steady state after a warm-up call).

    python tools/probe_cp_memory.py [S]
"""

import sys

import torch

import te_cudnn
from te_cudnn.parallel import ring_rank_alone, shard


def run(tag, fn, xs):
    for warm in (True, False):
        leaves = [x.detach().requires_grad_() for x in xs[:3]]
        te_cudnn.release_workspaces()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn(*leaves)
        torch.cuda.synchronize()
        fwd_peak, kept = torch.cuda.max_memory_allocated() - base, torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        out.backward(xs[3])
        torch.cuda.synchronize()
        bwd_peak = torch.cuda.max_memory_allocated() - base
        del out, leaves
    tok = xs[0].shape[1] * 1024
    print(f"{tag:28s} KiB per local token: forward peak {fwd_peak / tok:6.1f}, kept {kept / tok:6.1f}, "
          f"backward peak {bwd_peak / tok:6.1f}")


def main():
    S, cp = int(sys.argv[1]) if len(sys.argv) > 1 else 32768, 2
    mk = lambda n: torch.randn(1, S, n, 128, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    xs = [shard(x, cp, 0, "bshd") for x in (mk(32), mk(8), mk(8), mk(32))]
    run("one rank of 2", lambda a, b, c: ring_rank_alone(a, b, c, cp, 0, qkv_format="bshd", attn_mask_type="causal"), xs)
    run("te_cudnn on the local length", lambda a, b, c: te_cudnn.fused_attention(
        a, b, c, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal"), xs)


if __name__ == "__main__":
    main()
