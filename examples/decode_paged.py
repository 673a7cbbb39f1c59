"""A continuous-batching decode loop over a paged KV cache with ``te_cudnn.fused_attn_decode``.

One attention layer's decode step for ``--batch`` slots, as an inference server runs it: each step
writes every slot's new K and V into the page pool at the slot's current length, bumps
``cache_seqlens`` in place and calls ``fused_attn_decode``. A slot whose sequence reaches its target
length is retired and refilled with a new sequence (a fresh prompt of random length in its pages);
the host keeps its own copy of the lengths, so nothing is read back from the GPU. The step runs
eagerly and as one captured CUDA graph (the lengths and the new tokens live in static tensors that
the graph reads at replay). At the end the last step's output is checked against te_cudnn's fp32
reference on the gathered cache, and the step times are printed (CUDA events, median).

Needs: a CUDA GPU with cuDNN (without one it says so in one line and exits with code 2). Writes
nothing unless given ``--json FILE``.

    python examples/decode_paged.py                    # b=8, h=32/8, d=128, pages of 64 tokens, 4K per slot
    python examples/decode_paged.py --steps 300 --json decode.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8, help="decode slots")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=64, help="tokens per page")
    p.add_argument("--capacity", type=int, default=4096, help="tokens each slot can hold (a multiple of --page-size)")
    p.add_argument("--steps", type=int, default=100, help="decode steps, eager and graph each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the numbers here")
    return p.parse_args(argv)


class DecodeLayer:
    """The page pool, page table, lengths and one decode step (graph-safe: no host sync)."""

    def __init__(self, a: argparse.Namespace, gen: torch.Generator):
        import te_cudnn

        self.a, self.gen, self.decode = a, gen, te_cudnn.fused_attn_decode
        b, hg, d, page = a.batch, a.kv_heads, a.head_dim, a.page_size
        self.pages = a.capacity // page
        n = b * self.pages + 7  # a pool larger than the tables use, pages shuffled between slots
        self.k_pool = torch.zeros(n, page, hg, d, device="cuda", dtype=torch.bfloat16)
        self.v_pool = torch.zeros_like(self.k_pool)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(a.seed))[: b * self.pages]
        self.table = perm.view(b, self.pages).to(torch.int32).cuda()
        self.lens = torch.zeros(b, dtype=torch.int32, device="cuda")  # cache_seqlens: the graph reads it
        self.host_lens = [0] * b  # the host's copy: never read back from the GPU
        self.targets = [0] * b
        self.rows = torch.arange(b, device="cuda")
        self.q = torch.zeros(b, 1, a.heads, d, device="cuda", dtype=torch.bfloat16)  # static step inputs
        self.k_new = torch.zeros(b, hg, d, device="cuda", dtype=torch.bfloat16)
        self.v_new = torch.zeros_like(self.k_new)
        self.retired = 0
        for slot in range(b):
            self.admit(slot)

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, device="cuda").to(torch.bfloat16)

    def admit(self, slot: int) -> None:
        """A new sequence in ``slot``: a random prompt written into its pages, a random target."""
        a = self.a
        host_gen = torch.Generator().manual_seed(a.seed + 7919 * self.retired + slot)
        prompt = int(torch.randint(1, a.capacity // 2, (1,), generator=host_gen))
        pages = self.table[slot].long()
        self.k_pool[pages] = self.rand(self.pages, a.page_size, a.kv_heads, a.head_dim)
        self.v_pool[pages] = self.rand(self.pages, a.page_size, a.kv_heads, a.head_dim)
        self.host_lens[slot], self.targets[slot] = prompt, min(a.capacity, prompt + 1 + (prompt % 97))
        self.lens[slot] = prompt

    def new_tokens(self) -> None:
        """This step's query and new K/V (a model's projections in a real server)."""
        self.q.copy_(self.rand(*self.q.shape))
        self.k_new.copy_(self.rand(*self.k_new.shape))
        self.v_new.copy_(self.rand(*self.v_new.shape))

    def step(self) -> torch.Tensor:
        """Write the new K/V at each slot's length, bump the lengths, attend. Device work only."""
        page, pos = self.a.page_size, self.lens.long()
        where = self.table[self.rows, pos // page].long()
        self.k_pool[where, pos % page] = self.k_new
        self.v_pool[where, pos % page] = self.v_new
        self.lens += 1
        return self.decode(self.q, self.k_pool, self.v_pool, self.lens, self.table)

    def after_step(self) -> None:
        """Host bookkeeping: retire finished sequences and admit new ones (outside the graph)."""
        for slot in range(self.a.batch):
            self.host_lens[slot] += 1
            if self.host_lens[slot] >= self.targets[slot]:
                self.retired += 1
                self.admit(slot)


def _time_steps(layer: DecodeLayer, run, steps: int) -> list[float]:
    """Microseconds of each step's device work (CUDA events around it; one sync at the end)."""
    from te_cudnn.timing import EventSpan

    spans = []
    for _ in range(steps):
        layer.new_tokens()
        span = EventSpan()
        span.begin()
        run()
        span.end()
        layer.after_step()
        spans.append(span)
    torch.cuda.synchronize()
    return [span.ms() * 1e3 for span in spans]


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.capacity % a.page_size or a.heads % a.kv_heads:
        print("decode_paged.py: --capacity must be a multiple of --page-size and --heads of --kv-heads",
              file=sys.stderr)  # fmt: skip
        return 2
    if not torch.cuda.is_available():
        print("decode_paged.py needs a CUDA GPU with cuDNN (te_cudnn.fused_attn_decode runs on the GPU); "
              "torch.cuda.is_available() is False here", file=sys.stderr)  # fmt: skip
        return 2
    from te_cudnn.reference import attention_reference

    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    layer = DecodeLayer(a, gen)
    layer.new_tokens()
    layer.step()  # the first call builds the plan (a capture must not be the first call)
    layer.after_step()
    eager = _time_steps(layer, layer.step, a.steps)

    graph = torch.cuda.CUDAGraph()
    layer.new_tokens()
    with torch.cuda.graph(graph):
        out = layer.step()  # capturing runs nothing: the step happens at each replay
    graph.replay()
    layer.after_step()
    replay = _time_steps(layer, graph.replay, a.steps)

    # the last replay's output against the fp32 reference on the gathered cache
    b, s = a.batch, a.capacity
    dense = [p[layer.table.long()].reshape(b, s, a.kv_heads, a.head_dim).permute(0, 2, 1, 3).float()
             for p in (layer.k_pool, layer.v_pool)]  # fmt: skip
    ref = attention_reference(layer.q.permute(0, 2, 1, 3).float(), *dense, attn_mask_type="padding",
                              seqlens_q=torch.ones_like(layer.lens), seqlens_kv=layer.lens).out  # fmt: skip
    err = ((out.permute(0, 2, 1, 3).float() - ref).norm() / ref.norm()).item()
    assert layer.lens.tolist() == layer.host_lens, "the host's lengths and the GPU's disagree"
    kv_bytes = 2 * sum(layer.host_lens) * a.kv_heads * a.head_dim * 2
    numbers = {
        "config": vars(a), "gpu": torch.cuda.get_device_name(), "sequences_retired": layer.retired,
        "eager_step_us_median": statistics.median(eager), "graph_step_us_median": statistics.median(replay),
        "last_step_kv_bytes": kv_bytes, "rel_error_vs_fp32": err,
    }  # fmt: skip
    print(f"{a.steps} steps x {b} slots (h={a.heads}/{a.kv_heads}, d={a.head_dim}, pages of {a.page_size}, "
          f"up to {a.capacity} tokens), {layer.retired} sequences retired and replaced")  # fmt: skip
    print(f"step (K/V write + lengths + fused_attn_decode): eager {numbers['eager_step_us_median']:.1f} us, "
          f"CUDA graph {numbers['graph_step_us_median']:.1f} us (median)")  # fmt: skip
    print(f"last step: relative error against the fp32 reference {err:.2e}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(numbers, f, indent=1)
    return 0 if err < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
