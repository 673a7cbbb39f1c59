import sys, torch
sys.path.insert(0, "tests")
import te_cudnn as tc
from te_cudnn.reference import attention_reference
import test_sinks_gpu as T
q, k, v, offset = T._bshd(seed=13, s=192)
def sums():
    return [float(t.double().sum()) for t in (q, k, v, offset)]
before = sums()
def fd():
    qr, kr, vr = (x.transpose(1, 2) for x in (q, k, v))
    w = torch.randn((2, 192, 8, 64), device="cuda", generator=torch.Generator(device="cuda").manual_seed(3)).to(q.dtype)
    w64 = w.transpose(1, 2).double()
    u = torch.randn(offset.shape, generator=torch.Generator(device="cuda").manual_seed(5), device="cuda", dtype=torch.float64)
    eps = 1e-3
    def loss(alpha, grad=False):
        a = alpha.double().clone().requires_grad_(grad)
        r = attention_reference(qr, kr, vr, attn_mask_type="causal", softmax_type="learnable", softmax_offset=a, compute_dtype=torch.float64)
        value = (r.out * w64).sum()
        if grad:
            value.backward(); return a.grad
        return float(value.detach())
    numeric = (loss(offset + eps * u) - loss(offset - eps * u)) / (2 * eps)
    analytic = float((loss(offset, grad=True) * u).sum())
    return numeric, analytic, abs(numeric - analytic) / abs(analytic)
for i in range(3):
    print("pure reference", fd())
for i in range(3):
    off = offset.clone().requires_grad_()
    out = tc.fused_attention(q, k, v, attn_mask_type="causal", softmax_type="learnable", softmax_offset=off)
    out.float().sum().backward()
    torch.cuda.synchronize()
    print("after te_cudnn", fd(), "inputs unchanged:", sums() == before)
print(torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
