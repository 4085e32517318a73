"""The training step queues its work without waiting for the device: the numbers it makes are
read only every log_interval steps, before an evaluation and at a stop."""

import json

import pytest
import torch

import train
from conftest import tiny_args
from gpt.speed import optim as speed_optim
from gpt.speed.optim import AdamW
from gpt.data import Batches
from gpt.train.loop import Loop

# what reads a tensor's value on the host, and so waits for a GPU to get there (a copy to the
# host, `.to("cpu")`, is counted apart below; on a GPU, tests/test_cuda.py catches every other wait)
READS = ("item", "tolist", "cpu", "numpy", "nonzero", "copy_", "__float__", "__int__", "__bool__", "__index__")
FUNCTIONS = ("equal", "allclose", "nonzero")


def to_the_host(args, kwargs) -> bool:
    return any(str(a) == "cpu" for a in (*args, *kwargs.values()))


@pytest.fixture
def counted_reads(monkeypatch):
    """Tensor reads, counted by where they happen: 'steps' (the loop outside its reads, evaluations,
    saves and the batch draw) or 'read' (Loop.read_steps)."""
    counts = {"steps": [], "read": [], "places": []}
    place = ["outside"]
    # the optimizers step as on a GPU, the non-finite flag left on the device: a CPU reads it
    monkeypatch.setattr(speed_optim, "READ_FLAG_ON", ("mps",))
    for name in READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            if place[-1] in ("steps", "read"):
                counts[place[-1]].append(_name)
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    for name in FUNCTIONS:
        real = getattr(torch, name)

        def called(*args, _real=real, _name=name, **kwargs):
            if place[-1] in ("steps", "read"):
                counts[place[-1]].append(f"torch.{_name}")
            return _real(*args, **kwargs)
        monkeypatch.setattr(torch, name, called)
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if place[-1] in ("steps", "read") and to_the_host(args, kwargs):
            counts[place[-1]].append("to cpu")
        return real_to(self, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "to", to)

    def inside(where, method):
        def wrapped(self, *args, **kwargs):
            place.append(where)
            try:
                return method(self, *args, **kwargs)
            finally:
                place.pop()
        return wrapped
    real_read = Loop.read_steps

    def read_steps(self):
        counts["places"].append(list(self.pending.iters))
        return real_read(self)
    monkeypatch.setattr(Loop, "fit_steps", inside("steps", Loop.fit_steps))
    monkeypatch.setattr(Loop, "read_steps", inside("read", read_steps))
    for elsewhere in ("evaluate", "stop_at"):
        monkeypatch.setattr(Loop, elsewhere, inside("outside", getattr(Loop, elsewhere)))
    # the batch's window indices come from a generator on the host, and stay there
    monkeypatch.setattr(Batches, "draw", inside("outside", Batches.draw))
    return counts


@pytest.mark.e2e
def test_the_steps_between_two_reads_never_wait_for_the_device(no_estimate, data_dir, tmp_path, counted_reads):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=12", "--eval_interval=8", "--log_interval=5",
                                "--gradient_accumulation_steps=2", "--grad_clip=0.01", "--dropout=0.1")) == 0
    assert counted_reads["steps"] == []
    assert counted_reads["read"], "the reads themselves are counted, so a wait in the steps would be"
    # read at each logged step, before each evaluation and at the end; nothing read twice
    assert [steps for steps in counted_reads["places"] if steps] == [[0], [1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in rows if r["kind"] == "train"] == [0, 5, 10]
    assert all(r["grad_norm"] > 0.01 for r in rows if r["kind"] == "train")     # clipping was on


@pytest.mark.parametrize("read_on", [("cpu", "mps"), ("mps",)], ids=["flag read", "flag left on the device"])
def test_a_skipped_update_leaves_weights_moments_and_step_count_as_they_were(read_on, monkeypatch):
    monkeypatch.setattr(speed_optim, "READ_FLAG_ON", read_on)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = AdamW([{"params": model.parameters(), "weight_decay": 0.1}], lr=1e-2, betas=(0.9, 0.95))
    x = torch.randn(5, 4)
    model(x).square().sum().backward()
    opt.step(found_inf=torch.tensor(0.0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [{k: v.clone() for k, v in s.items()} for s in opt.state.values()]
    model(x).square().sum().backward()
    opt.step(found_inf=torch.tensor(1.0))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    for saved, state in zip(moments, opt.state.values()):
        assert all(torch.equal(saved[k], state[k]) for k in saved)
    assert [s["step"].item() for s in opt.state.values()] == [1.0, 1.0]
