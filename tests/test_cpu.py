"""gpt/speed/: matmul precision (precision.py), exact float32 attention (attention.py), weight layout (layout.py)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import conftest
from conftest import BLOCK, V
from gpt import model as gpt_model
from gpt.speed import attach_attention, lay_out_weights
from gpt.speed.attention import attention
from gpt.speed.precision import (cpu_can_round, cpu_computes_bfloat16, cpu_rounds_matmuls, exact_cpu_matmuls,
                               lists_bfloat16, matmul_precision)

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py


@pytest.fixture
def medium(cpu_rounds_when_asked):
    with matmul_precision("medium", "cpu"):
        yield


# ------------------------------------------------------------------ precision.py

def test_cpu_rounds_matmuls_says_whether_medium_rounds_linear_layers():
    # torch rounds only on CPUs with AMX; elsewhere medium is not asked for: SDPA slows down under it
    torch.manual_seed(0)
    x, w = torch.randn(64, 128), torch.randn(256, 128)
    with matmul_precision("medium", "cpu"):
        rounded = F.linear(x, w)
        with exact_cpu_matmuls():
            exact = F.linear(x, w)
            assert not cpu_rounds_matmuls()
        assert cpu_rounds_matmuls() == (not torch.equal(rounded, exact))
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "amx_bf16" in cpuinfo.read_text():
        assert cpu_can_round()      # where torch does round, medium must ask for it


def test_cpus_computing_bfloat16_are_read_from_their_flags():
    assert lists_bfloat16("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert lists_bfloat16("flags\t\t: avx512f amx_bf16 amx_tile\n")
    assert not lists_bfloat16("flags\t\t: fpu avx2 avx512f avx512bw\n")          # AVX-512 without BF16
    assert not lists_bfloat16("model name\t: avx512_bf16 lookalike\nflags\t\t: avx2\n")
    assert not lists_bfloat16("Features\t: fp asimd bf16\n")     # Arm's bfloat16: not measured, so float32
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        words = cpuinfo.read_text().split()
        avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        assert cpu_computes_bfloat16() == (avx512 and ("avx512_bf16" in words or "amx_bf16" in words))


def _precision_state():
    def read(get):
        try:
            return get()
        except RuntimeError:        # torch's level getters raise when the backends contradict it
            return "raises"
    return (read(torch.get_float32_matmul_precision), read(lambda: torch.backends.cuda.matmul.allow_tf32),
            torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)


CALLER_SETTINGS = {
    "nothing": [],
    "level high": [("level", "high")],
    "level medium": [("level", "medium")],
    "medium, CPU exact": [("level", "medium"), ("mkldnn", "ieee")],
    "high, CPU exact": [("level", "high"), ("mkldnn", "ieee")],
    "medium, CUDA exact": [("level", "medium"), ("cuda", "ieee")],
    "CUDA tf32 only": [("cuda", "tf32")],
    "CPU bf16 only": [("mkldnn", "bf16")],
}


@pytest.mark.parametrize("caller", CALLER_SETTINGS)
def test_runs_put_back_every_precision_setting_they_found(caller, cpu_rounds_when_asked):
    try:
        for what, value in CALLER_SETTINGS[caller]:
            if what == "level":
                torch.set_float32_matmul_precision(value)
            else:
                getattr(torch.backends, what).matmul.fp32_precision = value
        found = _precision_state()
        for level in ("highest", "high", "medium", "medium"):
            for device_type in ("cpu", "cuda"):
                with matmul_precision(level, device_type):
                    assert cpu_rounds_matmuls() == (level == "medium")
                assert _precision_state() == found
    finally:        # torch's own start: level highest, no backend set
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.fp32_precision = torch.backends.mkldnn.matmul.fp32_precision = "none"


def test_medium_changes_a_models_loss_and_gradients_by_rounding_only(medium):
    model = tiny_model(n_layer=2, n_embd=32)
    idx = torch.randint(0, V, (4, BLOCK))
    _, loss = model(idx, idx)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with exact_cpu_matmuls():
        _, exact_loss = model(idx, idx)
        exact_grads = torch.autograd.grad(exact_loss, list(model.parameters()))
    assert loss.item() == pytest.approx(exact_loss.item(), rel=1e-2)
    for got, want in zip(grads, exact_grads):
        assert (got - want).norm() <= 0.05 * want.norm() + 1e-6


def test_the_model_runs_after_torchs_own_precision_settings_are_used():
    # torch's legacy precision getter raises once these are set; the model must not need it
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        model = tiny_model()
        model(torch.randint(0, V, (1, 4)))
        assert model.generate(torch.zeros(1, 1, dtype=torch.long), 3).shape == (1, 4)
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


# ------------------------------------------------------------------ attention.py

@pytest.mark.parametrize("masked", [False, True], ids=["causal", "bias"])
@pytest.mark.parametrize("grads", ["qkv", "q", "none"])
def test_attention_at_medium_precision_equals_exact_sdpa(medium, masked, grads):
    # SDPA's CPU kernel slows 10x when its products are rounded: attention stays exact, to the
    # bit, forward and backward, and the setting is medium again afterwards
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 16, requires_grad=name in grads) for name in "qkv")
    bias = torch.randn(4, 32, 32) if masked else None
    y = attention(q, k, v, bias, 0.0, not masked)
    wanted = [t for t in (q, k, v) if t.requires_grad]
    with exact_cpu_matmuls():
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=not masked)
        expected_grads = torch.autograd.grad(expected.square().sum(), wanted) if wanted else []
    assert torch.equal(y, expected)
    assert y.requires_grad == bool(wanted)
    if wanted:
        for got, want in zip(torch.autograd.grad(y.square().sum(), wanted), expected_grads, strict=True):
            assert torch.equal(got, want)
    assert cpu_rounds_matmuls()


def test_attention_backward_leaves_the_precision_it_found_and_frees_its_graph(medium):
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    y = attention(q, q, q, None, 0.0, True)
    with matmul_precision("highest", "cpu"):   # a caller that changed it between forward and backward
        y.sum().backward(retain_graph=True)
        assert not cpu_rounds_matmuls()
    assert y.grad_fn.graph is None      # held until the loss is dropped, it cost 0.5 GB at batch 64
    with pytest.raises(RuntimeError, match="goes backward once; for retain_graph use matmul_precision=high"):
        y.sum().backward()


def test_attention_goes_backward_inside_inference_mode(medium):
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    loss = attention(q, q, q, None, 0.0, True).sum()
    with torch.inference_mode():
        (grad,) = torch.autograd.grad(loss, q)
    with exact_cpu_matmuls():
        (expected,) = torch.autograd.grad(F.scaled_dot_product_attention(q, q, q, is_causal=True).sum(), q)
    assert torch.equal(grad, expected)


def test_attention_leaves_the_precision_it_found_when_sdpa_fails(medium):
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    with pytest.raises(RuntimeError):
        attention(q, torch.randn(1, 2, 8, 5), torch.randn(1, 2, 8, 4), None, 0.0, True)
    assert cpu_rounds_matmuls()


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The dtypes of q, k, v and the mask of each call of SDPA."""
    calls, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kwargs):
        calls.append((q.dtype, k.dtype, v.dtype, None if attn_mask is None else attn_mask.dtype))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


@pytest.mark.parametrize("pos", ["learned", "alibi"])
def test_cpu_attention_under_bfloat16_autocast_runs_in_float32(sdpa_calls, pos):
    # SDPA's CPU kernel in bfloat16 took 3.3x as long going backward: the linear layers take
    # bfloat16, attention float32, ALiBi's bias unrounded; the gradients still reach every weight
    calls = sdpa_calls
    model = tiny_model(pos_encoding=pos).train()
    idx = torch.randint(0, V, (2, BLOCK))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
        assert model.transformer.h[0].attn.c_attn(torch.randn(1, 16)).dtype == torch.bfloat16
    loss.backward()
    mask = torch.float32 if pos == "alibi" else None
    assert calls == [(torch.float32, torch.float32, torch.float32, mask)] * 2
    assert logits.dtype == torch.bfloat16
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with torch.no_grad():
        exact = tiny_model(pos_encoding=pos)(idx)[0]
    assert (logits.float() - exact).abs().max() < 0.05     # the same model, rounded


@pytest.mark.parametrize("pos", ["learned", "alibi"])
def test_a_bfloat16_model_runs_and_samples_on_cpu(sdpa_calls, pos):
    # attention computes in float32 on a CPU and hands back the dtype it was given
    model = tiny_model(pos_encoding=pos).to(torch.bfloat16)
    idx = torch.randint(0, V, (2, BLOCK))
    logits, _ = model(idx)
    assert logits.dtype == torch.bfloat16
    assert {call[:3] for call in sdpa_calls} == {(torch.float32,) * 3}
    reference = tiny_model(pos_encoding=pos)(idx)[0]
    assert (logits.float() - reference).abs().max() < 0.1
    assert model.generate(idx[:, :3], max_new_tokens=BLOCK, temperature=0.0).shape == (2, BLOCK + 3)


def test_cpu_attention_keeps_float64_exact():
    # only bfloat16 and float16 go through float32: a float64 model stays float64, for gradcheck
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    y = attention(q, k, v, None, 0.0, True)
    assert y.dtype == torch.float64 and torch.equal(y, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.autograd.gradcheck(lambda *t: attention(*t, None, 0.0, True), (q, k, v))


def test_bfloat16_autocast_attention_at_medium_precision_is_exact_float32(medium):
    # on a CPU that rounds, the float32 detour of bfloat16 attention takes the exact path too
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 16).bfloat16() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attention(q, k, v, None, 0.0, True)
    with exact_cpu_matmuls():
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert y.dtype == torch.bfloat16 and torch.equal(y, expected.bfloat16())


def test_torch_compile_traces_attention_at_medium_precision_without_a_break(medium):
    model = tiny_model()
    explanation = torch._dynamo.explain(model)(torch.randint(0, V, (2, 8)))
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_torch_compile_keeps_cpu_attention_in_float32_under_bfloat16_autocast():
    # compiled, bfloat16 attention made the earlier AdamW fast config's steps 11.6-14.9 ms against 10.1-10.2
    seen = []

    def recording_backend(gm, example_inputs):
        seen.extend(tuple(a.meta["example_value"].dtype for a in node.args[:3])
                    for node in gm.graph.nodes if node.target is F.scaled_dot_product_attention)
        return gm.forward

    model = tiny_model().train()
    idx = torch.randint(0, V, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = torch.compile(model, backend=recording_backend)(idx, idx)
    loss.backward()
    assert seen == [(torch.float32,) * 3] * 2 and logits.dtype == torch.bfloat16



def tiny_model(seed: int = 0, **overrides):
    """The model as the commands build it: this package's attention attached, the weights laid out."""
    return lay_out_weights(attach_attention(conftest.tiny_model(seed, **overrides)))


def test_a_model_built_plainly_has_plain_attention_and_contiguous_weights():
    # the model imports nothing of gpt/speed; the commands attach it
    plain = conftest.tiny_model(tie_weights=False, vocab_size=40)
    assert all(p.is_contiguous() for p in plain.parameters())
    assert all(m.attend is gpt_model.attend for m in plain.modules() if hasattr(m, "attend"))
    attached = tiny_model(tie_weights=False, vocab_size=40)
    assert all(m.attend is attention for m in attached.modules() if hasattr(m, "attend"))
    idx = torch.randint(0, 40, (3, BLOCK))
    assert torch.equal(plain(idx)[0], attached(idx)[0])


# ------------------------------------------------------------------ layout.py

def test_widening_weights_are_stored_transposed_and_no_result_changes():
    # a layout for sampling speed: the weights' values, outputs and gradients are those of
    # row-major weights, a weight's gradient has its layout, and row-major state dicts load
    model = tiny_model(tie_weights=False, vocab_size=40)          # a head that widens 16 to 40
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    widening = [m.weight for m in linears if m.out_features > m.in_features]
    assert len(widening) == 5 and all(w.t().is_contiguous() for w in widening)
    assert all(m.weight.is_contiguous() for m in linears if m.out_features <= m.in_features)
    plain = tiny_model(tie_weights=False, vocab_size=40)
    for m in plain.modules():
        if isinstance(m, nn.Linear):
            m.weight.data = m.weight.data.contiguous()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters()))
    idx = torch.randint(0, 40, (3, BLOCK))
    (_, loss), (_, plain_loss) = model.train()(idx, idx), plain.train()(idx, idx)
    loss.backward()
    plain_loss.backward()
    torch.testing.assert_close(loss, plain_loss)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
        assert p.grad.stride() == p.stride()
    fresh = tiny_model(seed=1, tie_weights=False, vocab_size=40)
    fresh.load_state_dict(plain.state_dict())
    assert all(m.weight.t().is_contiguous() for m in fresh.modules()
               if isinstance(m, nn.Linear) and m.out_features > m.in_features)
    torch.testing.assert_close(fresh(idx)[0], model(idx)[0])
