"""``te-cudnn explain``: which sub-backend serves a configuration, and why the others decline."""

from __future__ import annotations

from ..runtime import HOPPER_CUDNN_919, current_env
from ..selection import explain
from .common import EXIT_FAILED, EXIT_USAGE, EXPLAIN_FLAGS, CliError, as_typed, emit, one_line, parse_dtype

__all__ = ["cmd_explain"]


def cmd_explain(args) -> int:
    env = HOPPER_CUDNN_919 if args.target == "hopper" else current_env()
    dtype = parse_dtype(args.dtype)
    skv = args.skv or args.sq
    try:
        ex = explain(
            is_training=not args.inference, q_dtype=dtype, kv_dtype=dtype, qkv_layout=args.layout,
            attn_bias_type=args.bias, attn_mask_type=args.mask, softmax_type=args.softmax_type, dropout=args.dropout,
            num_attn_heads=args.heads, num_gqa_groups=args.gqa_groups or args.heads, max_seqlen_q=args.sq,
            max_seqlen_kv=skv, head_dim_qk=args.d, head_dim_v=args.d_v or args.d, window_size_left=args.window[0],
            window_size_right=args.window[1], deterministic=args.deterministic, batch_size=args.batch, env=env,
            return_max_logit=args.return_max_logit,
        )  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise CliError(as_typed(one_line(exc), EXPLAIN_FLAGS), EXIT_USAGE) from None
    cfg = ex.config
    planned = {"b": cfg.b, "sq": cfg.sq, "skv": cfg.skv}
    text = str(ex)
    if planned != {"b": args.batch, "sq": args.sq, "skv": skv}:
        text = (f"note: THD plans are keyed on buckets, so --batch {args.batch} --sq {args.sq} --skv {skv} is checked "
                f"as b={cfg.b} sq={cfg.sq} skv={cfg.skv}\n" + text)  # fmt: skip
    payload = {"backend": ex.backend.name, "reasons": ex.reasons, "config": cfg.summary(), "env": env.describe(),
               "batch": args.batch, "planned": planned}  # fmt: skip
    emit(args, payload, text)
    return 0 if ex.backend.name != "No_Backend" else EXIT_FAILED
