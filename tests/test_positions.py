"""gpt/positions.py: the sinusoidal table, rotary embeddings and ALiBi's slopes and bias."""

import math

import pytest
import torch

from gpt.positions import Rotary, alibi_bias, alibi_slopes, sinusoidal_table

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py


@pytest.mark.parametrize("n_pos,dim", [(7, 6), (9, 8), (4, 5)])
def test_sinusoidal_table_matches_paper_formula(n_pos, dim):
    expected = [[math.sin(p / 10000 ** (2 * (j // 2) / dim)) if j % 2 == 0
                 else math.cos(p / 10000 ** (2 * (j // 2) / dim))
                 for j in range(dim)] for p in range(n_pos)]
    torch.testing.assert_close(sinusoidal_table(n_pos, dim), torch.tensor(expected), atol=1e-6, rtol=0)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    rotary = Rotary(head_size=8, n_pos=32)
    q, k = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8)
    at_0 = rotary(q, start=0) @ rotary(k, start=0).transpose(-2, -1)
    at_5 = rotary(q, start=5) @ rotary(k, start=5).transpose(-2, -1)
    # the rotation itself depends on absolute position, so the invariance is not vacuous
    assert not torch.allclose(rotary(q, start=0), rotary(q, start=5), atol=1e-3)
    torch.testing.assert_close(at_5, at_0, atol=1e-5, rtol=0)


def test_rope_rotates_each_pair_by_its_position_times_its_frequency():
    torch.manual_seed(0)
    hs, start, T = 8, 3, 4
    x = torch.randn(1, 1, T, hs)
    expected = torch.empty_like(x)
    for t in range(T):
        for i in range(hs // 2):
            angle = (start + t) * 10000 ** (-2 * i / hs)
            a, b = x[0, 0, t, 2 * i].item(), x[0, 0, t, 2 * i + 1].item()
            expected[0, 0, t, 2 * i] = a * math.cos(angle) - b * math.sin(angle)
            expected[0, 0, t, 2 * i + 1] = a * math.sin(angle) + b * math.cos(angle)
    torch.testing.assert_close(Rotary(hs, n_pos=16)(x, start), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n_head, slopes", [
    # the ALiBi paper's rule for head counts that are not powers of two: the slopes of the power
    # of two below, then every other slope of the power of two above
    (6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]),
    (12, [2.0 ** -k for k in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]),
])
def test_alibi_slopes_for_head_counts_that_are_not_powers_of_two(n_head, slopes):
    torch.testing.assert_close(alibi_slopes(n_head), torch.tensor(slopes))


def test_alibi_slopes_and_bias():
    slopes = alibi_slopes(8)
    torch.testing.assert_close(slopes, torch.tensor([2.0 ** -i for i in range(1, 9)]))
    T = 6
    bias = alibi_bias(slopes, 0, T, T)
    assert bias.shape == (8, T, T)
    for h in range(8):
        for i in range(T):
            for j in range(T):
                if j > i:
                    assert bias[h, i, j] == float("-inf")
                else:
                    assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j))


def test_rope_turns_pairs_alike_as_complex_numbers_and_as_real_ones(monkeypatch):
    # the real-number form is what torch.compile and Apple GPUs run; gradients must agree too
    torch.manual_seed(0)
    rotary = Rotary(head_size=8, n_pos=16)
    x = torch.randn(2, 3, 5, 8, requires_grad=True)
    complex_out = rotary(x, start=4)
    complex_grad, = torch.autograd.grad(complex_out.square().sum(), x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    real_out = rotary(x, start=4)
    real_grad, = torch.autograd.grad(real_out.square().sum(), x)
    torch.testing.assert_close(real_out, complex_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(real_grad, complex_grad, atol=1e-5, rtol=0)
    assert not torch.equal(real_out, x)


def test_rope_keeps_its_input_dtype_and_turns_in_float32_at_least():
    torch.manual_seed(0)
    rotary = Rotary(head_size=8, n_pos=16)
    x = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        assert rotary(x.to(dtype), start=3).dtype == dtype
    # bfloat16 is turned in float32 and rounded once, at the end
    low = x.bfloat16()
    assert torch.equal(rotary(low, start=3), rotary(low.float(), start=3).bfloat16())
    # float64 is not cut to float32 on the way
    exact = rotary(x, start=3)
    assert (exact - rotary(x.float(), start=3).double()).abs().max() > 1e-12


def test_rope_turns_a_view_that_starts_mid_pair():
    torch.manual_seed(0)
    rotary = Rotary(head_size=4, n_pos=8)
    base = torch.randn(1 + 2 * 3 * 4)
    x = base[1:].view(1, 2, 3, 4)          # storage offset 1: no complex view of it exists
    torch.testing.assert_close(rotary(x, start=2), rotary(x.clone(), start=2), atol=0, rtol=0)
