"""Where a run computes: the device, the autocast dtype, the memory it needs, and torchrun's environment."""

from __future__ import annotations

import contextlib
import os

import torch

from ..config import GPTConfig, SampleConfig, TrainConfig
from ..speed.precision import computes_bfloat16, torch_level
from ..errors import UserError, first_line
from ..memory import device_memory


def check_fits(model_cfg: GPTConfig, cfg: TrainConfig, device: str) -> None:
    """Refuse a run that cannot fit in the device's whole memory, which would hang in swap, be
    killed or fail deep inside numpy: the weights, gradients and AdamW moments (16 bytes a
    parameter in float32), or a batch's float32 activations that must be held at once: its logits
    and their log-softmax, or a block's residual stream and c_fc output; for a backward pass (a
    training step's, and the diagnostics' at each evaluation) the logits and every block's."""
    total = device_memory(device)
    if total is None:
        return
    n = model_cfg.num_params()
    if 16 * n > total:
        raise UserError(f"the model has {n:,} parameters: training needs at least {16 * n / 2**30:,.1f} "
                        f"GiB for its weights, gradients and optimizer state, more than the "
                        f"{total / 2**30:,.1f} GiB here; lower n_layer, n_embd, mlp_ratio or (for learned "
                        "positions) block_size")
    logits = 2 * model_cfg.vocab_size
    block = model_cfg.n_embd + model_cfg.mlp_hidden * (2 if model_cfg.gated else 1)
    for name, per_token, fix in (   # an evaluation keeps no block's output, but its diagnostics do
            ("batch_size", logits + model_cfg.n_layer * block,
             "; raising gradient_accumulation_steps keeps the batch per step"),
            ("eval_batch_size", logits + model_cfg.n_layer * block if cfg.diagnostics else max(logits, block), "")):
        need = getattr(cfg, name) * model_cfg.block_size * 4 * per_token
        if need > total:
            raise UserError(f"{name}={getattr(cfg, name)} needs at least {need / 2**30:,.1f} GiB for one "
                            f"batch's activations, more than the {total / 2**30:,.1f} GiB here; lower "
                            f"it{fix}")


TRAINING_FIX = ("lower batch_size (raising gradient_accumulation_steps keeps the batch per step), "
                "eval_iters or eval_batch_size, which --resume may change, or block_size or the "
                "model's size in a new run; checkpoints already saved are whole")


@contextlib.contextmanager
def compile_failure_in_one_line(compiling: bool):
    """torch.compile's own failures (no C++ compiler, an unsupported op) become a UserError: they
    surface in the first step, as pages of compiler output."""
    try:
        yield
    except Exception as e:
        if not compiling or not type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
            raise
        raise UserError(f"torch.compile failed ({first_line(e)}); run without --compile, or fix what it "
                        "names") from None


def env_int(name: str, default: int, least: int = 0) -> int:
    """A count torchrun puts in the environment (RANK, WORLD_SIZE, ...); a stray or mistyped one
    stops the run with one line."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        fix = "unset it to run one process" if name in ("RANK", "WORLD_SIZE") else "start the run with torchrun"
        raise UserError(f"{name}={text!r} in the environment is not a whole number of at least {least}; "
                        f"torchrun sets it: {fix}")
    return value


def resolve_device(name: str) -> str:
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"device={name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"device={name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cpu" and device.index not in (None, 0):
        raise UserError(f"device={name!r}: the CPU is one device; use --device=cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={name!r} but CUDA is not available here; use --device=cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"device={name!r} but there are {torch.cuda.device_count()} GPUs here "
                        f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device={name!r} but MPS is not available here; use --device=cpu")
    return "cpu" if device.type == "cpu" else name      # torch.load cannot map to "cpu:0"


def autocast_dtype(cfg: TrainConfig, device: str) -> torch.dtype:
    if cfg.dtype in ("auto", "fast"):
        # auto: bfloat16 on a GPU that computes it; fast adds a CPU that does (emulated, it is slower)
        place = torch.device(device)
        if (place.type == "cuda" or cfg.dtype == "fast" and place.type == "cpu") and computes_bfloat16(place):
            return torch.bfloat16
        return torch.float32
    return getattr(torch, cfg.dtype)


def check_threads(cfg: TrainConfig | SampleConfig) -> None:
    """Here, not in the config: a run saved on a bigger machine still loads, and says what to do."""
    cpus = os.cpu_count() or 1
    if cfg.threads > cpus:      # far past it, torch cannot start the threads and crashes
        raise UserError(f"threads={cfg.threads} is more than the {cpus} CPUs here; give at most "
                        f"--threads={cpus}, or --threads=0 for torch's default")


def check_compile(cfg: TrainConfig, device: str | None = None) -> None:
    """Refuse compile with medium on a CPU that rounds, in float32 or bfloat16 (whose attention is
    float32 too); device is resolved from cfg if not given."""
    if (cfg.compile and torch_level(cfg.matmul_precision, "cpu") == "medium"
            and (device or resolve_device(cfg.device)) == "cpu"):
        raise UserError("compile=true with matmul_precision=medium makes CPU steps slower than either "
                        "alone, since compiled attention cannot keep its matmuls exact; use one of the two")



def process_place() -> tuple[int, int]:
    """(rank, world): this process's place among those torchrun started, (0, 1) without it."""
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank, world = (env_int("RANK", 0), env_int("WORLD_SIZE", 1, least=1)) if launched else (0, 1)
    if rank >= world:
        raise UserError(f"RANK={rank} in the environment is not below WORLD_SIZE={world}; torchrun sets "
                        "both: unset them to run one process")
    return rank, world


def any_rank(flag: bool, device, world: int) -> bool:
    """Whether flag is true on any of the world processes of a torchrun (waits for all of them)."""
    if world == 1:
        return flag
    together = torch.tensor(float(flag), device=device)
    torch.distributed.all_reduce(together, op=torch.distributed.ReduceOp.MAX)
    return together.item() > 0


def join_processes(device: str, rank: int, world: int) -> str:
    """Connect this process to the others of a torchrun (none for one process) and make its GPU the
    current one; returns the device it trains on."""
    if world > 1 and device.startswith("mps"):  # gloo, the only backend there, cannot reduce MPS tensors
        raise UserError("torchrun on an Apple GPU (mps) is not supported; run one process, or pass "
                        "--device=cpu")
    if world > 1:
        local_rank = env_int("LOCAL_RANK", 0)
        gpu = None
        if device.startswith("cuda"):   # first: NCCL binds each process to the GPU current at its start
            gpu = torch.device(f"cuda:{local_rank}")
            visible = torch.cuda.device_count()
            if local_rank >= visible:
                raise UserError(f"LOCAL_RANK={local_rank}, but this machine shows {visible} GPU"
                                f"{'s' * (visible != 1)} (CUDA_VISIBLE_DEVICES="
                                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); give torchrun "
                                f"--nproc_per_node={visible} or fewer, or make more GPUs visible")
            torch.cuda.set_device(gpu)
            device = str(gpu)
        try:
            torch.distributed.init_process_group(backend="nccl" if gpu is not None else "gloo", device_id=gpu)
        except (ValueError, RuntimeError) as e:     # RANK and WORLD_SIZE left over, without torchrun
            raise UserError(f"RANK={rank} and WORLD_SIZE={world} in the environment make this one of {world} "
                            f"processes, but they could not connect ({first_line(e)}); start the run with "
                            "torchrun, or unset RANK and WORLD_SIZE to run one process") from None
    elif device.startswith("cuda:"):    # the run's GPU is the current one: no context on GPU 0
        torch.cuda.set_device(device)
    return device
