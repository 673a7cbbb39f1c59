"""Train a small GPT on a synthetic task with te_cudnn's attention and with PyTorch SDPA.

Needs: a CUDA GPU with cuDNN (without one it says so in one line and exits with code 2), except
the CPU smoke run below. Runs from any directory.

Run on a CUDA machine (te_cudnn and cuDNN installed)::

    python examples/train_gpt.py --steps 300                 # both attentions, eager + compile + graph
    python examples/train_gpt.py --attn te_cudnn --mode graph --json out.json

The model is a pre-LN GPT decoder (default 6 layers, width 512, 8 heads, sequence 1024, causal,
dropout 0.1 on the attention probabilities and on the residual/MLP branches), with fp32 master
weights under bf16 autocast, trained with AdamW (``capturable=True``, warm-up + cosine learning
rate held in a device tensor) on sequences of a fixed random second-order Markov process: the
token two back picks how likely each of the K successors of the previous token is, so the model
needs its attention (a previous-token head) to reach the entropy floor, well below ln(vocab).
Both implementations start from the same weights and see the same batches in the same order.

Modes: ``eager``; ``compile`` (``torch.compile(fullgraph=True)`` of forward + loss, standard
backward and optimizer step); ``graph`` (a whole training step -- compiled forward and loss,
backward, grad clipping, ``optimizer.step()`` -- captured once with ``torch.cuda.graph`` after
warm-up steps on a side stream, then replayed; dropout draws fresh masks at every replay;
``--graph-step eager`` captures the eager step instead).

The default batch (64 sequences of 1024 tokens) keeps an H100 busy: the step time is the GPU's.
At small batches (``--batch 8``) the eager and compiled steps are host-bound -- the CPU cannot
issue the step's ~600 kernels as fast as the GPU runs them -- and te_cudnn's Python custom op
costs more host time per layer than torch's C++ SDPA op (the host time per call is measured by
``te-cudnn bench``, see docs/performance.md; CUDA graphs in docs/guide/pytorch.md); the CUDA
graph removes the host from the step. The two attentions' runs of one mode advance in turn, one
training step each, so that drift in the host's speed affects both alike.

Prints one line per run, then a table: per attention and mode, the median step time (CUDA
events, steps after ``--timing-warmup``), tokens/s and the mean loss of the last 50 steps, then
per mode the relative difference of that loss, te_cudnn vs sdpa (target <= 2%). Loss curves go to
``--png`` (matplotlib, if installed; by default a new temporary directory, whose path is printed),
all numbers to ``--json`` (only when given).

CPU smoke run (CI, no GPU): ``--device cpu --attn sdpa --mode eager`` with small sizes.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MODES = ("eager", "compile", "graph")
ATTNS = ("te_cudnn", "sdpa")
BRANCHING = 4  # successors per token in the Markov process
FINAL = 50  # steps averaged for the final loss
REL_TARGET = 0.02


# ----------------------------------------------------------------------------- data
def make_dataset(args: argparse.Namespace) -> tuple[Tensor, float]:
    """Token ids ``[steps, batch, seq + 1]`` (CPU, int64) of a fixed second-order Markov process,
    and its entropy rate (nats/token, ignoring successor collisions): the loss floor."""
    g = torch.Generator().manual_seed(args.seed)
    v, k = args.vocab, BRANCHING
    succ = torch.randint(0, v, (v, k), generator=g)  # successors of the previous token
    weights = (-torch.log(torch.rand(v, k, generator=g))) ** 2.5  # peaked, reproducible (generator)
    probs = weights / weights.sum(-1, keepdim=True)  # row: choice of successor, given token two back
    cum = probs.cumsum(-1)
    n, length = args.steps * args.batch, args.seq + 1
    u = torch.rand(n, length, generator=g)
    tok = torch.empty(n, length, dtype=torch.long)
    tok[:, 0] = torch.randint(0, v, (n,), generator=g)
    tok[:, 1] = succ[tok[:, 0], torch.randint(0, k, (n,), generator=g)]
    for t in range(2, length):
        j = (u[:, t, None] > cum[tok[:, t - 2]]).sum(-1).clamp_(max=k - 1)
        tok[:, t] = succ[tok[:, t - 1], j]
    floor = float(-(probs * probs.clamp_min(1e-30).log()).sum(-1).mean())
    return tok.view(args.steps, args.batch, length), floor


# ----------------------------------------------------------------------------- model
class SdpaAttention(nn.Module):
    """[b, s, h, d] q/k/v -> [b, s, h*d], like te_cudnn.DotProductAttention(qkv_format="bshd")."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        b, s = q.shape[:2]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return o.transpose(1, 2).reshape(b, s, -1)


def _te_cudnn(name: str = "te_cudnn") -> Any:
    """``te_cudnn`` (or one of its modules), imported when first needed: ``--help`` and the CPU
    smoke run never need it. A source checkout that is not installed finds the package beside
    examples/."""
    try:
        return importlib.import_module(name)
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return importlib.import_module(name)


def make_attention(kind: str, heads: int, head_dim: int, dropout: float) -> nn.Module:
    if kind == "sdpa":
        return SdpaAttention(dropout)
    return _te_cudnn().DotProductAttention(num_attention_heads=heads, kv_channels=head_dim, attention_dropout=dropout,
                                           qkv_format="bshd", attn_mask_type="causal")


class Block(nn.Module):
    def __init__(self, attn: str, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.attn = make_attention(attn, heads, width // heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, w // self.heads).unbind(2)  # [b, s, h, d] each
        x = x + self.drop(self.proj(self.attn(q, k, v)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, attn: str, vocab: int, seq: int, layers: int, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(attn, width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def init_weights(self, seed: int, layers: int) -> None:
        """GPT-2 init from a private generator: identical weights whichever attention is used."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():  # tied weight listed once
            with torch.no_grad():
                if p.dim() == 1:
                    p.copy_(torch.ones_like(p) if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight"))
                            else torch.zeros_like(p))
                else:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.drop(self.tok(idx) + self.pos.weight[: idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# ----------------------------------------------------------------------------- training
def lr_at(step: int, args: argparse.Namespace) -> float:
    warm = max(1, min(args.lr_warmup, args.steps // 5))
    if step < warm:
        return args.lr * (step + 1) / warm
    frac = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))  # cosine down to 10%


def train(attn: str, mode: str, data: Tensor, args: argparse.Namespace) -> Iterator[None]:
    """One training run as a generator: it yields after every step (so that ``main`` can
    interleave the runs of one mode step by step: host-speed drift then hits both alike) and
    returns the run's results (``StopIteration.value``)."""
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and dev.index is not None:
        torch.cuda.set_device(dev)  # CUDA events and the graph's streams use the current device
    model = GPT(attn, args.vocab, args.seq, args.layers, args.width, args.heads, args.dropout)
    model.init_weights(args.seed, args.layers)
    model.to(dev).train()
    lr = torch.tensor(args.lr, device=dev) if cuda else args.lr  # a tensor: the captured step reads it
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, capturable=cuda)
    torch.manual_seed(args.seed + 1)  # same dropout RNG stream start for every run

    def loss_fn(x: Tensor, y: Tensor) -> Tensor:
        amp = torch.autocast("cuda", torch.bfloat16, cache_enabled=False) if cuda else nullcontext()
        with amp:
            logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    forward_loss: Callable[[Tensor, Tensor], Tensor] = loss_fn
    if mode == "compile" or (mode == "graph" and args.graph_step == "compiled"):
        forward_loss = torch.compile(loss_fn, fullgraph=True)  # graph: compiled on the first warm-up step

    def step(x: Tensor, y: Tensor) -> Tensor:  # one whole training step; what "graph" captures
        loss = forward_loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=cuda)
        opt.step()
        return loss.detach()

    def set_lr(i: int) -> None:
        for group in opt.param_groups:
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(lr_at(i, args))
            else:
                group["lr"] = lr_at(i, args)

    xs = data[:, :, :-1].contiguous().to(dev)
    ys = data[:, :, 1:].contiguous().to(dev)
    losses = torch.zeros(args.steps, device=dev)
    event_span = _te_cudnn("te_cudnn.timing").EventSpan if cuda else None  # the CPU run needs no te_cudnn
    spans = [event_span() for _ in range(args.steps)] if cuda else []
    cpu_ms: list[float] = []  # the CPU smoke run times with perf_counter
    first = 0

    if mode == "graph":  # PyTorch docs, "whole network capture" (of the compiled or the eager step)
        static_x, static_y = torch.empty_like(xs[0]), torch.empty_like(ys[0])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up steps (real training steps 0..n-1) off the capture stream
            for i in range(args.graph_warmup):
                static_x.copy_(xs[i])
                static_y.copy_(ys[i])
                set_lr(i)
                opt.zero_grad(set_to_none=True)
                losses[i].copy_(step(static_x, static_y))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # grads are then allocated from the graph's pool: static
        with torch.cuda.graph(graph):
            static_loss = step(static_x, static_y)
        first = args.graph_warmup

    for i in range(first, args.steps):
        t0 = time.perf_counter()
        if cuda:
            spans[i].begin()
        set_lr(i)
        if mode == "graph":
            static_x.copy_(xs[i])  # same device: an ordinary kernel before the replay
            static_y.copy_(ys[i])
            graph.replay()
            losses[i].copy_(static_loss)
        else:
            opt.zero_grad(set_to_none=True)
            losses[i].copy_(step(xs[i], ys[i]))
        if cuda:
            spans[i].end()
        else:
            cpu_ms.append(1e3 * (time.perf_counter() - t0))
        yield
    timed = range(max(first, args.timing_warmup), args.steps)
    if cuda:
        torch.cuda.synchronize()
        times = [spans[i].ms() for i in timed]
    else:
        times = cpu_ms[timed.start - first:]
    loss_list = losses.tolist()
    median_ms = statistics.median(times) if times else float("nan")
    result = {
        "attn": attn, "mode": mode, "median_step_ms": median_ms,
        "tokens_per_s": args.batch * args.seq / (median_ms / 1e3),
        "final_loss_mean": statistics.fmean(loss_list[-min(FINAL, len(loss_list)):]),
        "losses": loss_list, "step_ms": times,
    }
    return result


# ----------------------------------------------------------------------------- reporting
def plot(results: list[dict[str, Any]], floor: float, args: argparse.Namespace) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no loss-curve plot written")
        return
    if args.png is None:  # never a file of the source tree: a new temporary directory
        args.png = os.path.join(tempfile.mkdtemp(prefix="train_gpt-"), "train_gpt_loss.png")
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"eager": "-", "compile": "--", "graph": ":"}
    colors = {"te_cudnn": "tab:green", "sdpa": "tab:blue"}
    for r in results:
        ax.plot(r["losses"], styles[r["mode"]], color=colors[r["attn"]], lw=1, label=f"{r['attn']} ({r['mode']})")
    ax.axhline(math.log(args.vocab), color="grey", lw=0.8, label="ln(vocab)")
    ax.axhline(floor, color="black", lw=0.8, ls="-.", label="entropy floor")
    ax.set_ylim(0, math.log(args.vocab) * 1.1)
    ax.set(xlabel="step", ylabel="training loss (nats)",
           title=f"GPT {args.layers}L x {args.width}, seq {args.seq}, batch {args.batch}, dropout {args.dropout}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    plt.close(fig)
    print(f"loss curves written to {args.png}")


def report(results: list[dict[str, Any]], floor: float, args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n{'attn':<10}{'mode':<9}{'median ms':>11}{'tokens/s':>12}{'final loss':>12}")
    for r in results:
        print(f"{r['attn']:<10}{r['mode']:<9}{r['median_step_ms']:>11.2f}{r['tokens_per_s']:>12.0f}"
              f"{r['final_loss_mean']:>12.4f}")
    print(f"(ln(vocab) = {math.log(args.vocab):.3f}, entropy floor ~ {floor:.3f}; final = mean of last {FINAL} steps)")
    comparison: dict[str, Any] = {}
    by_key = {(r["attn"], r["mode"]): r for r in results}
    for mode in MODES:
        if ("te_cudnn", mode) in by_key and ("sdpa", mode) in by_key:
            te, ref = by_key["te_cudnn", mode]["final_loss_mean"], by_key["sdpa", mode]["final_loss_mean"]
            rel = abs(te - ref) / ref
            comparison[mode] = {"te_cudnn": te, "sdpa": ref, "rel_diff": rel, "within_target": rel <= REL_TARGET}
            print(f"{mode}: final loss te_cudnn vs sdpa differs by {100 * rel:.2f}% "
                  f"({'ok' if rel <= REL_TARGET else 'ABOVE'} target {100 * REL_TARGET:.0f}%)")
    return comparison


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--attn", choices=(*ATTNS, "both"), default="both", help="attention implementation(s)")
    p.add_argument("--mode", choices=(*MODES, "all"), default="all", help="execution mode(s)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64,
                   help="sequences per step (64: the GPU, not the host, sets the step time on an H100)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (warm-up, then cosine to 10%%)")
    p.add_argument("--lr-warmup", type=int, default=30, help="linear warm-up steps (at most steps/5)")
    p.add_argument("--dropout", type=float, default=0.1, help="attention and residual/MLP dropout")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--timing-warmup", type=int, default=10, help="steps left out of the median step time")
    p.add_argument("--graph-warmup", type=int, default=3, help="side-stream steps before the CUDA-graph capture")
    p.add_argument("--graph-step", choices=("compiled", "eager"), default="compiled",
                   help="what the graph mode captures: the compiled training step (torch.compile's fused kernels, "
                        "no host time) or the eager one")
    p.add_argument("--png", default=None, help="loss-curve plot (default: train_gpt_loss.png in a new temporary "
                   "directory)")
    p.add_argument("--json", default=None, help="write all numbers here")
    args = p.parse_args(argv)
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    if args.steps <= args.graph_warmup:
        p.error("--steps must exceed --graph-warmup")
    for flag, path in (("--png", args.png), ("--json", args.json)):  # checked now, not after the training
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            p.error(f"{flag} {path}: directory {folder} does not exist")
    try:
        torch.device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device!r} is not a torch device (e.g. cuda, cuda:1, cpu)")
    return args


def missing(args: argparse.Namespace, attns: tuple[str, ...], modes: tuple[str, ...]) -> str | None:
    """What this run needs and does not have, in one line (None: all there)."""
    dev = torch.device(args.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return ("train_gpt.py needs a CUDA GPU with cuDNN (te_cudnn runs cuDNN); torch.cuda.is_available() is "
                    "False here. For a CPU smoke run use: --device cpu --attn sdpa --mode eager")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"train_gpt.py: --device {args.device}, but there are {torch.cuda.device_count()} CUDA GPU(s) here"
    elif args.device != "cpu" or attns != ("sdpa",) or modes != ("eager",):
        return ("train_gpt.py needs a CUDA GPU for te_cudnn, torch.compile timing and CUDA graphs: only --device cpu "
                "--attn sdpa --mode eager runs without one")
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    attns = ATTNS if args.attn == "both" else (args.attn,)
    modes = MODES if args.mode == "all" else (args.mode,)
    problem = missing(args, attns, modes)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    data, floor = make_dataset(args)
    print(f"GPT {args.layers} layers x {args.width}, {args.heads} heads, seq {args.seq}, batch {args.batch}, "
          f"vocab {args.vocab}, {args.steps} steps on {args.device}; ln(vocab) {math.log(args.vocab):.3f}, "
          f"entropy floor ~ {floor:.3f}")
    results: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    for mode in modes:
        if mode == "compile" or (mode == "graph" and args.graph_step == "compiled"):
            torch._dynamo.reset()
        # the attentions' runs of one mode advance in turn, one step each (A B A B ...)
        active = {attn: train(attn, mode, data, args) for attn in attns}
        done: dict[str, dict[str, Any]] = {}
        while active:
            for attn, run in list(active.items()):
                try:
                    next(run)
                except StopIteration as stop:
                    done[attn] = stop.value
                    del active[attn]
                except Exception:  # keep the other runs: one failing mode should not hide the rest
                    traceback.print_exc()
                    failed.append({"attn": attn, "mode": mode, "error": traceback.format_exc(limit=3)})
                    print(f"  {attn:<9}{mode:<8} FAILED (traceback above)", flush=True)
                    del active[attn]
        for attn in attns:
            if attn in done:
                r = done[attn]
                results.append(r)
                print(f"  {attn:<9}{mode:<8} median {r['median_step_ms']:8.2f} ms/step  "
                      f"loss {r['losses'][0]:.3f} -> {r['final_loss_mean']:.4f}", flush=True)
        del active, done
        gc.collect()  # free the runs' models, optimizer states and graph pools before the next mode
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    comparison = report(results, floor, args)
    if results:
        plot(results, floor, args)
    if args.json:
        with open(args.json, "w") as f:
            device = torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else "cpu"
            json.dump({"config": vars(args), "device": device, "torch": torch.__version__,
                       "ln_vocab": math.log(args.vocab), "entropy_floor": floor, "results": results,
                       "failed": failed, "comparison": comparison}, f, indent=1)
        print(f"numbers written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
