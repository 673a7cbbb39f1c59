"""torch's own attention as contenders: SDPA with each CUDA backend (``sdpa_kernel``, BHSD views
of the same bshd tensors, ``enable_gqa``; decode reads the same keys and values gathered into a
dense cache) and FlexAttention (``torch.compile``d once per case; causal, document or no block
mask; a bias as a ``score_mod``)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch._functorch.config as functorch_config
from torch.nn.attention import SDPBackend, sdpa_kernel

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - torch 2.4: FlexAttention declines every case
    create_block_mask = flex_attention = None

from .cases import Case
from .contender import Contender, Run
from .inputs import Inputs

__all__ = ["TorchSdpa", "SdpaRun", "FlexAttention", "FlexRun", "FLEX_DEFAULT_CASES"]


def _sdpa_backends() -> dict[str, Any]:
    return {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip


class _AutogradRun(Run):
    """A contender timed through torch's autograd: ``_forward()`` computes the output from
    ``self.q``/``k``/``v`` (which require grad when training); the backward is
    ``torch.autograd.grad`` with ``self.d_o``."""

    training: bool

    def _forward(self, q, k, v):  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def fwd(self):
        if not self.training:
            with torch.no_grad():
                return self._forward(self.q, self.k, self.v)
        return self._forward(self.q, self.k, self.v)

    def before(self, mode: str):
        """The backward alone needs a forward: made here, on the current stream (the capture
        stream when a CUDA graph is captured), from leaves made here too. Autograd hands a
        leaf's gradient over on the stream the leaf was first used on; with the contender's
        own leaves (first used on the default stream) a captured backward makes the legacy
        default stream wait on the capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), the capture
        fails, and torch 2.11 never gives a failed capture's memory back."""
        if mode != "bwd":
            return None
        leaves = tuple(t.detach().requires_grad_() for t in (self.q, self.k, self.v))
        return self._forward(*leaves), leaves

    def bwd(self, state):
        out, leaves = state
        return torch.autograd.grad(out, leaves, self.d_o, retain_graph=True)

    def fwd_bwd(self):
        out = self._forward(self.q, self.k, self.v)
        return out, torch.autograd.grad(out, (self.q, self.k, self.v), self.d_o)


class SdpaRun(_AutogradRun):
    def __init__(self, case: Case, inp: Inputs, backend_name: str):
        super().__init__()
        backend = _sdpa_backends()[backend_name]
        self.ctx = lambda: sdpa_kernel(backend)
        self.training = case.training
        self.gqa = case.gqa
        self.mask, self.causal = None, case.causal
        if case.is_paged:  # the same keys and values, gathered once into a dense cache
            self.q = Inputs.bhsd(inp.q)
            self.k, self.v = inp.dense_kv()
            self.info["notes"] = "dense KV cache (torch SDPA has no paged KV)"
            self.causal = False  # every key of the cache is visible to the one new token
        else:
            self.q, self.k, self.v = (Inputs.bhsd(t).detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
            self.d_o = Inputs.bhsd(inp.d_o)
            if inp.bias is not None:  # torch takes a bias as an additive mask; causal folds into it
                causal = torch.full((case.sq, case.skv), float("-inf"), device=inp.device).triu(1)
                self.mask = (inp.bias.float() + causal).to(inp.q.dtype)
                self.causal = False
                self.info["notes"] = "bias and causal mask as one additive attn_mask (no dBias)"

    def _forward(self, q, k, v):
        with self.ctx():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask,
                                                                    is_causal=self.causal, enable_gqa=self.gqa)  # fmt: skip

    def output(self) -> torch.Tensor:
        with torch.no_grad():
            return self._forward(self.q, self.k, self.v).permute(0, 2, 1, 3)


class TorchSdpa(Contender):
    def __init__(self, backend_name: str):
        self.backend_name = backend_name
        self.name = f"torch SDPA {backend_name}"
        self.key = f"sdpa_{backend_name.lower()}"

    def supports(self, case: Case) -> Optional[str]:
        if case.is_thd:
            return "torch SDPA takes no packed variable-length (THD) batch"
        if case.is_padded:
            return "a padded batch needs an explicit boolean mask in torch SDPA: not benchmarked"
        if case.mask not in ("no_mask", "causal", "padding"):
            return f"mask {case.mask} is not mapped to torch SDPA here"
        if case.bias != "no_bias" and self.backend_name == "flash":
            return "the flash backend takes no attn_mask (the case's bias)"
        return None

    def prepare(self, case: Case, inputs: Inputs) -> Run:
        return SdpaRun(case, inputs, self.backend_name)


def _no_buffer_donation() -> None:
    """Turn AOTAutograd's buffer donation off for the rest of the process. The backward-alone
    timing replays one backward with ``retain_graph=True``, which a compiled backward with
    donated buffers refuses ("non-empty donated buffers which requires ... retain_graph=False").
    Donation is decided when the forward is compiled and the backward is compiled lazily, so a
    patch around the first call alone did not help (the backward still saw donated buffers);
    the benchmark is a process of its own, and this only costs the compiled backward the memory
    donation would have saved."""
    if getattr(functorch_config, "donated_buffer", False):
        functorch_config.donated_buffer = False


class FlexRun(_AutogradRun):
    def __init__(self, case: Case, inp: Inputs):
        super().__init__()
        # a fresh compile per case: dynamo's recompile limit would otherwise send later cases
        # to flex_attention's eager path, which materializes the whole score matrix
        torch.compiler.reset()
        _no_buffer_donation()
        self.compiled = torch.compile(flex_attention)
        self.training, self.gqa, self.thd = case.training, case.gqa, case.is_thd
        self.score_mod, self.block_mask = None, None

        def make_mask(mod, q_len, kv_len):
            try:
                return create_block_mask(mod, None, None, q_len, kv_len, device=inp.device, _compile=True)
            except TypeError:  # a torch without the _compile keyword
                return create_block_mask(mod, None, None, q_len, kv_len, device=inp.device)

        if case.is_paged:
            self.q = Inputs.bhsd(inp.q)
            self.k, self.v = inp.dense_kv()
            self.info["notes"] = "dense KV cache (no paged KV here)"
        elif case.is_thd:
            self.q, self.k, self.v = (inp.thd_as_bhsd(t).detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
            self.d_o = inp.thd_as_bhsd(inp.d_o)
            doc = inp.doc_ids()

            def document_causal(b, h, q_idx, kv_idx):
                return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

            self.block_mask = make_mask(document_causal, case.tokens, case.tokens)
            self.info["notes"] = "document mask over the packed tokens"
        else:
            self.q, self.k, self.v = (Inputs.bhsd(t).detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
            self.d_o = Inputs.bhsd(inp.d_o)
            if case.causal:

                def causal(b, h, q_idx, kv_idx):
                    return q_idx >= kv_idx

                self.block_mask = make_mask(causal, case.sq, case.skv)
            if inp.bias is not None:
                bias = inp.bias

                def add_bias(score, b, h, q_idx, kv_idx):
                    return score + bias[0, h, q_idx, kv_idx]

                self.score_mod = add_bias
                self.info["notes"] = "bias as a score_mod (no dBias)"

    def _forward(self, q, k, v):
        return self.compiled(q, k, v, score_mod=self.score_mod, block_mask=self.block_mask,
                             enable_gqa=self.gqa)  # fmt: skip

    def output(self) -> torch.Tensor:
        out = self.fwd().detach()  # in the timed calls' grad mode: a no_grad call would recompile
        return out[0].permute(1, 0, 2) if self.thd else out.permute(0, 2, 1, 3)


#: the cases FlexAttention runs by default (every shape is compiled anew; --every-case for every case)
FLEX_DEFAULT_CASES = frozenset({"test_3", "llama_h32_s8k", "llama_h32_s32k", "thd_mixed_16k", "decode_kv8k"})


class FlexAttention(Contender):
    name, key = "FlexAttention", "flex"
    quick, quick_why = False, "compiling takes most of a minute per case"
    default_cases = FLEX_DEFAULT_CASES
    subset_why = "compiling costs 20-40 s per shape"

    def supports(self, case: Case) -> Optional[str]:
        if flex_attention is None:  # pragma: no cover - torch 2.4
            return f"torch {torch.__version__} has no FlexAttention (torch >= 2.5)"
        if case.is_padded:
            return "padded batches are left to te_cudnn (FlexAttention runs the packed THD case)"
        if case.mask not in ("no_mask", "causal", "padding", "padding_causal"):
            return f"mask {case.mask} is not mapped to a FlexAttention mask here"
        return None

    def prepare(self, case: Case, inputs: Inputs) -> Run:
        return FlexRun(case, inputs)
