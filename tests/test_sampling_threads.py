import time

import pytest
import torch

import sample
from gpt.speed import threads
from gpt.speed.threads import fastest_threads, sampling_threads


@pytest.fixture(autouse=True)
def keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def stream(steps: int, slow: callable, log: list):
    """Steps that take 4 ms at the thread counts `slow` names, none at the others."""
    for i in range(steps):
        n = torch.get_num_threads()
        log.append(n)
        if slow(i, n):
            time.sleep(0.004)
        yield i


def test_auto_runs_nearly_every_step_at_the_faster_count_and_puts_torch_back():
    torch.set_num_threads(2)
    for fast in (1, 2):
        log = []
        items = list(fastest_threads(stream(1000, lambda i, n: n != fast, log), (1, 2)))
        assert items == list(range(1000))
        assert log.count(fast) > 0.9 * len(log)
        assert torch.get_num_threads() == 2


def test_every_item_comes_through_wherever_the_stream_ends():
    for n in range(0, 160):     # inside the first run, and inside each block of the first probe
        assert list(fastest_threads(iter(range(n)), (1, 2))) == list(range(n))


def test_auto_moves_when_the_other_count_becomes_faster():
    log = []    # one thread is fast for 400 steps, then slow: a core was freed, say
    list(fastest_threads(stream(4000, lambda i, n: (n == 1) == (i >= 400), log), (1, 2)))
    assert log[:400].count(1) > 0.9 * 400
    moved = next(i for i in range(400, 4000) if log[i:i + 100] == [2] * 100)
    assert moved < 400 + 2 * threads.LONGEST_RUN
    assert log[moved:].count(2) > 0.97 * len(log[moved:])


def test_a_count_that_keeps_losing_is_probed_less_and_less_often():
    log = []
    list(fastest_threads(stream(5000, lambda i, n: n == 2, log), (1, 2)))
    probes = [i for i in range(1, len(log)) if log[i] == 2 and log[i - 1] == 1]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] >= threads.LONGEST_RUN
    assert log.count(2) < 0.01 * len(log)


def test_a_fixed_count_holds_for_the_stream_and_is_undone_after():
    torch.set_num_threads(2)
    log = []
    assert list(sampling_threads(stream(5, lambda i, n: False, log), 1, torch.device("cpu"))) == list(range(5))
    assert log == [1] * 5 and torch.get_num_threads() == 2


def test_off_the_cpu_the_stream_is_left_alone():
    items = iter([1, 2])
    assert sampling_threads(items, 0, torch.device("cuda")) is items


@pytest.mark.parametrize("arg, said", [("--threads=-1", "threads=-1 must not be negative"),
                                       ("--threads=100000", "threads=100000 is more than the")])
def test_sample_refuses_a_bad_thread_count_in_one_line(arg, said, tmp_path, capsys):
    assert sample.main([f"--out_dir={tmp_path}", arg]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


@pytest.mark.parametrize("load, first", [(0.1, 2), (1.7, 1)])
def test_auto_starts_at_torchs_count_only_on_an_idle_machine(load, first, monkeypatch):
    torch.set_num_threads(2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    log = []
    list(sampling_threads(stream(10, lambda i, n: False, log), 0, torch.device("cpu")))
    assert log == [first] * 10
