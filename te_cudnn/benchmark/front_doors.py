"""The benchmark's front-door section: what users pay who come in through the doors.

* host microseconds per cached forward (no gradient, b=1 h=8 s=128 d=64 bf16) of the direct
  call, ``fused_attention``, the module, the SDPA drop-in and the Hugging Face attention
  function, against torch's SDPA (default and cuDNN backends), transformers' ``sdpa``
  function and the cuDNN frontend's own PyTorch op where it is installed;
* forward+backward of the drop-in against torch's cuDNN SDPA on BHSD-contiguous leaves and
  on BSHD views (gradients accumulating into ``.grad``, as in training): the GPU time of steps
  run back to back, and the time and host µs of steps at the host's pace;
* Hugging Face: a random-weight 1B-like Llama (16 layers, 32 heads over 8 KV heads): generate
  tokens per second at b=4 and b=1 with the dynamic cache and with the static cache compiled
  with ``mode="reduce-overhead"`` (whole calls taking turns call by call, and their decode
  steps alone), dynamic-cache decode steps also in lockstep and switched step by step inside
  one ``generate`` call, prefill and one training step, te_cudnn against ``sdpa`` (host time
  drifts; see :mod:`te_cudnn.benchmark.turns`): whole generate calls on two models, the
  ``sdpa`` model's call taken twice per turn; the switched steps, prefill and the training
  step on one model whose attention implementation is switched between steps or calls; with
  controls (``sdpa`` against itself, and, in training, ``sdpa`` plus one Python autograd node
  per layer: :func:`_python_node_sdpa`), each with its paired ratio and ratio of medians
  (:func:`control_pairs`).

``python -m te_cudnn.benchmark.front_doors --out DIR`` writes ``front_doors.json``,
``front_doors.md`` and ``front_doors.png`` (with matplotlib) there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..autograd import fused_attention
from ..integrations import transformers as te_hf
from ..module import DotProductAttention
from ..ops import fused_attn_fwd
from ..packed_rows import packed_one_row
from ..plans.one_row import lean_one_row
from ..runtime import cudnn_module, cudnn_version_string, current_env
from ..sdpa import scaled_dot_product_attention
from ..timing import MAX_SPIN_MS, host_medians, queued_ms, spin_rate
from .environment import environment
from .front_doors_report import HF_PAIRED, replot, write
from .ratios import paired_ratio
from .turns import StepClock, SwitchingSteps, alternating, decode_in_lockstep

__all__ = ["host_doors", "dropin_fwd_bwd", "hf_llama", "control_pairs", "run", "main"]

BF16 = torch.bfloat16
#: drop-in fwd+bwd shapes: (b, h, h_kv, s, d), causal
FWD_BWD_SHAPES = ((4, 16, 16, 2048, 64), (2, 32, 8, 4096, 128), (2, 32, 32, 1024, 128))


class _Stub(torch.nn.Module):
    """What transformers' attention functions read of the attention module."""

    is_causal = False


def _transformers():
    """The ``transformers`` module (the optional ``hf`` extra) with its ``sdpa`` attention function
    loaded: this module's one import of it. Raises ImportError without it."""
    import transformers.integrations.sdpa_attention  # noqa: PLC0415 - optional dependency; binds ``transformers``

    return transformers


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """transformers' log at errors only: ``generate`` on the random model (no pad token, no
    attention mask, as measured) warns twice on every batched call."""
    logging = _transformers().logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def host_doors(rounds: int = 9, calls: int = 2000) -> dict[str, float]:
    """Median host microseconds per cached forward call of each door (no gradient)."""
    b, h, s, d = 1, 8, 128, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=BF16) for _ in range(3))
    qb, kb, vb = (torch.randn(b, h, s, d, device="cuda", dtype=BF16) for _ in range(3))
    module = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="no_mask").cuda().eval()
    stub = _Stub().eval()

    def torch_cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qb, kb, vb)

    fns: dict[str, Callable[[], Any]] = {
        "te_cudnn.fused_attn_fwd": lambda: fused_attn_fwd(False, s, s, None, None, q, k, v, BF16, None,
                                                             qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask"),
        "te_cudnn.fused_attention": lambda: fused_attention(q, k, v),
        "te_cudnn.DotProductAttention": lambda: module(q, k, v),
        "te_cudnn.scaled_dot_product_attention": lambda: scaled_dot_product_attention(qb, kb, vb),
        "te_cudnn HF attention function": lambda: te_hf.attention_forward(stub, qb, kb, vb, None),
        "torch SDPA (default backend)": lambda: F.scaled_dot_product_attention(qb, kb, vb),
        "torch SDPA (cuDNN backend)": torch_cudnn,
    }  # fmt: skip
    try:
        sdpa_attention_forward = _transformers().integrations.sdpa_attention.sdpa_attention_forward
        fns["transformers sdpa attention function"] = lambda: sdpa_attention_forward(stub, qb, kb, vb, None)
    except (ImportError, AttributeError):
        pass
    try:
        cudnn = cudnn_module()
        op = getattr(getattr(cudnn, "ops", None), "sdpa", None) or getattr(cudnn, "sdpa_torch", None)
        if op is not None:
            fns["cudnn frontend PyTorch op"] = lambda: op(qb, kb, vb)
    except Exception:  # noqa: BLE001 - reported as absent
        pass
    with torch.no_grad():
        for name, fn in list(fns.items()):
            try:
                fn()
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a contender that cannot run here is left out
                del fns[name]
        return host_medians(fns, rounds, calls)


def dropin_fwd_bwd(shapes=FWD_BWD_SHAPES, reps: int = 20, rounds: int = 31, seed: int = 0) -> list[dict[str, Any]]:
    """fwd+bwd per step of the drop-in and of torch's cuDNN SDPA in interleaved rounds (a seeded
    random order per round), each contender sampled twice per round:

    * *back to back*: ``reps`` steps queued behind a spin, so the GPU runs them without waiting
      for the host: the kernels' time, gradient accumulation included (``te_cudnn_ms``,
      ``torch_cudnn_ms``, ``ratio``);
    * *paced*: the same steps after ``3`` untimed ones, no spin (``paced_*``): where a step's
      host time exceeds its GPU time (the small shapes) the host sets the pace, and the time is
      the host's; ``host_*_us`` is the host time per step of that sample.

    Ratios are paired by round: the median of the per-round ratios and its 95 % interval
    (te_cudnn.benchmark.ratios), so host jitter and clock drift between rounds cancel."""
    order = random.Random(seed)
    rate = spin_rate(torch.cuda.current_device())
    rows = []
    for b, h, hk, s, d in shapes:
        for form in ("BHSD leaves", "BSHD views"):
            def leaf(heads):
                if form == "BHSD leaves":
                    return torch.randn(b, heads, s, d, device="cuda", dtype=BF16, requires_grad=True)
                return torch.randn(b, s, heads, d, device="cuda", dtype=BF16).transpose(1, 2).requires_grad_()

            q, k, v = leaf(h), leaf(hk), leaf(hk)
            go = torch.randn(b, h, s, d, device="cuda", dtype=BF16)
            gqa = hk != h

            def te_step():
                scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).backward(go)

            def torch_step():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).backward(go)

            names = ("te_cudnn", "torch cuDNN")
            ahead = dict.fromkeys(names, 0.0)
            device: dict[str, list[float]] = {n: [] for n in names}
            paced: dict[str, list[float]] = {n: [] for n in names}
            host: dict[str, list[float]] = {n: [] for n in names}
            steps = list(zip(names, (te_step, torch_step)))
            late_samples = 0
            for _ in range(rounds):
                order.shuffle(steps)
                for name, step in steps:
                    ms, us, _ = queued_ms(step, reps, lead=3)
                    paced[name].append(ms)
                    host[name].append(us)
                    # the spin covers twice the host time the paced sample took to queue as many steps
                    ahead[name] = max(ahead[name], min(2e-3 * us * reps + 1.0, MAX_SPIN_MS))
                    ms, _, late = queued_ms(step, reps, ahead_ms=ahead[name], rate=rate)
                    if late and ahead[name] < MAX_SPIN_MS:  # the host outran the spin: once more, spinning longer
                        ahead[name] = min(2 * ahead[name], MAX_SPIN_MS)
                        ms, _, late = queued_ms(step, reps, ahead_ms=ahead[name], rate=rate)
                    late_samples += late
                    device[name].append(ms)
            row: dict[str, Any] = {"shape": f"b={b} h={h} hg={hk} s={s} d={d} causal", "inputs": form,
                                   "rounds": rounds, "reps": reps}  # fmt: skip
            for prefix, samples in (("", device), ("paced_", paced)):
                row[f"{prefix}te_cudnn_ms"] = statistics.median(samples["te_cudnn"])
                row[f"{prefix}torch_cudnn_ms"] = statistics.median(samples["torch cuDNN"])
                row[f"{prefix}ratio"], row[f"{prefix}ratio_low"], row[f"{prefix}ratio_high"] = paired_ratio(
                    samples["te_cudnn"], samples["torch cuDNN"])  # fmt: skip
            row["host_te_cudnn_us"] = statistics.median(host["te_cudnn"])
            row["host_torch_cudnn_us"] = statistics.median(host["torch cuDNN"])
            row["back_to_back"] = bool(rate)  # False: no spin here (torch.cuda._sleep missing), all samples paced
            row["late_samples"] = late_samples  # back-to-back samples whose spin ended before the host had queued them
            rows.append(row)
            q = k = v = go = None  # free this shape's tensors before the next
    return rows


def _llama_config():
    return _transformers().LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                       max_position_embeddings=4096)  # fmt: skip


def hf_llama(new_tokens: int = 128, prompt: int = 512, reps: int = 9, lockstep_rounds: int = 6,
             switched_calls: int = 6) -> dict[str, Any]:
    """Generate tokens/s, prefill and training-step time of te_cudnn against transformers' sdpa.
    Both models are built first and whole generate calls alternate between them; the switched
    generate steps, prefill and the training step alternate implementations on the sdpa model
    (see the controls in the report)."""
    transformers = _transformers()
    AutoModelForCausalLM = transformers.AutoModelForCausalLM
    te_hf.register()
    torch.manual_seed(0)
    state = AutoModelForCausalLM.from_config(_llama_config()).to(BF16).state_dict()
    res: dict[str, Any] = {"model": "random-weight Llama, 16 layers, hidden 2048, 32 heads over 8 KV heads, bf16"}
    models = {}
    for impl in ("sdpa", "te_cudnn"):
        model = AutoModelForCausalLM.from_config(_llama_config(), attn_implementation=impl)  # its own config
        model.load_state_dict(state)
        models[impl] = model.to(device="cuda", dtype=BF16).eval()
    r: dict[str, dict[str, Any]] = {impl: {} for impl in models}

    intervals: dict[str, list[float]] = {}

    controls: dict[str, dict[str, list[float]]] = {}

    def control(measure: str, samples: dict[str, list[float]], medians: dict[str, float]) -> None:
        found = control_pairs(samples, medians)
        if found:
            controls[measure] = found

    def record(measure: str, fns: dict[str, Callable[[], Any]], reps: int, per: Callable[[float], float]) -> None:
        samples: dict[str, list[float]] = {}
        for impl, sec in alternating(fns, reps, samples).items():
            r.setdefault(impl, {})[measure] = per(sec)
        rates = {impl: [per(x) for x in secs] for impl, secs in samples.items()}
        paired = paired_ratio(rates["te_cudnn"], rates["sdpa"])
        if paired is not None:
            intervals[measure] = list(paired)
        control(measure, rates, {impl: r[impl][measure] for impl in rates})
        _progress(measure, r, intervals)

    def record_rates(measure: str, seconds: dict[str, list[float]], tokens: int) -> None:
        """Tokens/s from seconds per sample of ``tokens`` tokens, paired sample by sample
        (with the ``sdpa`` control's pair where ``seconds`` has one)."""
        samples = {impl: [tokens / sec for sec in secs] for impl, secs in seconds.items()}
        for impl, rates in samples.items():
            r.setdefault(impl, {})[measure] = statistics.median(rates)
        paired = paired_ratio(samples["te_cudnn"], samples["sdpa"])
        if paired is not None:
            intervals[measure] = list(paired)
        control(measure, samples, {impl: r[impl][measure] for impl in samples})
        _progress(measure, r, intervals)

    def switched(measure: str, fns: dict[str, Callable[[], Any]], reps: int, switch: dict) -> None:
        """:func:`record` for contenders that share one model (``switch`` selects each one's
        implementation, untimed), with the controls' paired ratios."""
        samples: dict[str, list[float]] = {}
        for impl, sec in alternating(fns, reps, samples, switch).items():
            r.setdefault(impl, {})[measure] = sec * 1e3
        intervals[measure] = list(paired_ratio(samples["te_cudnn"], samples["sdpa"]))
        control(measure, samples, {impl: r[impl][measure] for impl in samples})
        _progress(measure, r, intervals)

    # The switched measures run on the sdpa model, its implementation changed between steps or calls.
    model, name = models["sdpa"], _python_node_sdpa(transformers)
    impls = {"sdpa": "sdpa", "te_cudnn": "te_cudnn", _AGAIN: "sdpa", _NODE: name}
    switch = {label: (lambda impl=impl: model.set_attn_implementation(impl)) for label, impl in impls.items()}
    for b in (4, 1):
        ids = torch.randint(0, 32000, (b, prompt), device="cuda")
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        rate = lambda sec, b=b: b * new_tokens / sec  # noqa: E731
        with torch.no_grad():
            # whole calls, with the sdpa model's calls taken twice per turn (its own spread)
            whole = {**models, _AGAIN: models["sdpa"]}
            clocks = {i: StepClock() for i in whole}
            record(f"generate b={b} dynamic cache tokens/s",
                   {i: (lambda m=m, c=clocks[i]: m.generate(ids, streamer=c, **kw)) for i, m in whole.items()},
                   reps, rate)  # fmt: skip
            # each generate's median step (the warm-up call's left out), then steps in lockstep
            record_rates(f"decode b={b} dynamic cache tokens/s (median step)",
                         {i: c.medians[1:] for i, c in clocks.items()}, b)  # fmt: skip
            record_rates(f"decode b={b} dynamic cache tokens/s (steps in lockstep, paired by step)",
                         decode_in_lockstep(models, ids, new_tokens, lockstep_rounds)[0], b)  # fmt: skip
            # every step follows a switch of implementation, and each runs every other step
            steps = SwitchingSteps({i: switch[i] for i in ("sdpa", "te_cudnn", _AGAIN)}, _SWITCH_CYCLE)
            for call in range(switched_calls + 1):  # the first call untimed
                model.generate(ids, streamer=steps if call else SwitchingSteps(steps.switch, steps.cycle), **kw)
            switch["sdpa"]()
            record_rates(f"generate b={b} dynamic cache tokens/s (implementations switched step by step)",
                         steps.seconds, b)  # fmt: skip
            torch.compiler.reset()
            cc = transformers.CompileConfig(mode="reduce-overhead", fullgraph=False)
            clocks = {i: StepClock() for i in models}
            static = {i: (lambda m=m, c=clocks[i]: m.generate(ids, cache_implementation="static", compile_config=cc,
                                                               streamer=c, **kw))
                      for i, m in models.items()}  # fmt: skip
            try:
                record(f"generate b={b} static cache + reduce-overhead tokens/s", static, reps, rate)
                record_rates(f"decode b={b} static cache + reduce-overhead tokens/s (median step)",
                             {i: c.medians[1:] for i, c in clocks.items()}, b)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - reported
                for impl in models:
                    r[impl][f"generate b={b} static cache + reduce-overhead error"] = str(exc).splitlines()[0][:300]
    models.pop("te_cudnn")
    # Prefill and the training step: the sdpa model, its attention implementation changed call
    # by call, so that every contender runs the same weights from the same memory. Controls:
    # sdpa against itself (the measure's own spread) and, in training, sdpa with one Python
    # autograd node added per layer (see _python_node_sdpa).
    ids = torch.randint(0, 32000, (1, 4096), device="cuda")
    model.eval()
    with torch.no_grad():
        labels = ("sdpa", "te_cudnn", _AGAIN)
        switched("prefill b=1 s=4096 ms", {i: (lambda: model(ids)) for i in labels}, 61, switch)
    ids = torch.randint(0, 32000, (2, 2048), device="cuda")

    def step():
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    model.train()
    switched("training step b=2 s=2048 ms", {i: step for i in impls}, 31, switch)
    models = model = None
    torch.cuda.empty_cache()
    res.update(r)
    res["te_cudnn vs sdpa"] = {k: res["te_cudnn"][k] / res["sdpa"][k] for k in res["te_cudnn"]
                               if k in res["sdpa"] and isinstance(res["sdpa"][k], float)}  # fmt: skip
    res[HF_PAIRED] = intervals
    res["controls, paired by turn (median, 95 % interval)"] = controls
    return res


def control_pairs(samples: dict[str, list[float]], medians: dict[str, float]) -> dict[str, list[float]]:
    """The controls of one measure: for each pair whose contenders ``samples`` (per-turn samples)
    has, ``[paired median, low, high, ratio of medians]`` (``_AGAIN`` / ``sdpa``: the measure's
    own spread; the Python-node pairs: what one more autograd node per layer costs)."""
    pairs = [(_AGAIN, "sdpa"), (_NODE, "sdpa"), ("te_cudnn", _NODE)]
    return {f"{a} / {b}": [*paired_ratio(samples[a], samples[b]), medians[a] / medians[b]] for a, b in pairs
            if a in samples and b in samples}  # fmt: skip


def _progress(measure: str, r: dict[str, dict[str, Any]], intervals: dict[str, list[float]]) -> None:
    """One line per Hugging Face measure as it ends: both medians and the paired ratio."""
    paired = intervals.get(measure)
    ratio = f", paired {paired[0]:.3f} ({paired[1]:.3f}–{paired[2]:.3f})" if paired else ""
    print(f"hf {measure}: sdpa {r['sdpa'][measure]:.1f}, te_cudnn {r['te_cudnn'][measure]:.1f}{ratio}", flush=True)


_AGAIN = "sdpa, again"
_NODE = "sdpa + one Python autograd node"
#: the order of the decode steps switched inside generate (SwitchingSteps)
_SWITCH_CYCLE = ("te_cudnn", "sdpa", "te_cudnn", _AGAIN)


class _PythonNode(torch.autograd.Function):
    """The identity as an autograd node written in Python: no kernel, only the node."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _python_node_sdpa(transformers) -> str:
    """Register (under the returned name) transformers' sdpa attention with its output passed
    through :class:`_PythonNode`: the same kernels as ``sdpa``, plus what one more autograd node
    per layer costs a training step (run in the backward on autograd's device thread; a node
    compiled in C++ costs as much: ``tools/probe_python_node.py``)."""
    from transformers.masking_utils import sdpa_mask  # noqa: PLC0415 - optional dependency

    sdpa = transformers.integrations.sdpa_attention.sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        out, weights = sdpa(module, query, key, value, attention_mask, **kwargs)
        return _PythonNode.apply(out), weights

    name = "sdpa_python_node"
    transformers.AttentionInterface.register(name, attention)
    transformers.AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _device() -> str:
    """``NVIDIA H200 (driver 580.159.04), cuDNN 9.19.0, torch 2.11.0+cu130``."""
    env = environment()
    return (f"{torch.cuda.get_device_properties(0).name} (driver {env['driver']}), cuDNN "
            f"{cudnn_version_string(current_env(0).cudnn_version)}, torch {torch.__version__}")


def run(out: Optional[Path], hf: bool = True) -> dict[str, Any]:
    """Measure every section (Hugging Face only with ``hf``) and, with ``out``, write
    ``front_doors.json``, ``.md`` and ``.png`` there (:func:`te_cudnn.benchmark.front_doors_report.write`)."""
    res: dict[str, Any] = {"device": _device()}
    if packed_one_row():  # TE_CUDNN_PACKED_ONE_ROW=1: te_cudnn's decode steps ran packed
        res["packed_one_row"] = True
    if not lean_one_row():  # TE_CUDNN_LEAN_ONE_ROW=0: cuDNN's split-KV plans for the decode steps
        res["heuristic_one_row_plans"] = True
    res["host"] = host_doors()
    print("host µs:", json.dumps({k: round(v, 1) for k, v in res["host"].items()}), flush=True)
    if out is not None:  # after every section: a run cut short keeps what it measured
        write(res, out)
    res["fwd_bwd"] = dropin_fwd_bwd()
    for r in res["fwd_bwd"]:
        print("fwd+bwd", r, flush=True)
    if out is not None:
        write(res, out)
    if hf:
        with _transformers_quiet():
            res["hf"] = hf_llama()
        print("hf", json.dumps(res["hf"], indent=1), flush=True)
        if out is not None:
            write(res, out)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m te_cudnn.benchmark.front_doors", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="folder for front_doors.json, .md and .png")
    p.add_argument("--no-hf", action="store_true", help="leave out the Hugging Face section")
    p.add_argument("--replot", type=Path, metavar="DIR", help="write front_doors.md and .png again from DIR's "
                   "front_doors.json (no GPU needed), then exit")  # fmt: skip
    args = p.parse_args(argv)
    if args.replot is not None:
        try:
            replot(args.replot)
        except (OSError, ValueError) as e:
            print(f"front-door benchmark: {e}", file=sys.stderr)
            return 1
        return 0
    if args.out is None:
        p.error("--out DIR is required (or --replot DIR)")
    if not torch.cuda.is_available():
        print("front-door benchmark: needs a CUDA device", file=sys.stderr)
        return 2
    run(args.out, hf=not args.no_hf)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
