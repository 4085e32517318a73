#!/usr/bin/env bash
# What one GPU does with this project, in under 10 minutes: the shakespeare_char baseline trained to
# its end (time to val loss <= 1.47), gpt.bench's tokens/s, MFU and peak memory, a sample, and the
# tests marked for CUDA. Results go to $OUT (default /tmp/gpu_check). EXTRA holds options added to
# train.py and gpt.bench alike, TRAIN_EXTRA and BENCH_EXTRA to one of them (the tests use them to run
# the script small on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_check}
extra=(${EXTRA:-})
train_extra=(${TRAIN_EXTRA:-})
bench_extra=(${BENCH_EXTRA:-})
mkdir -p "$out"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    | tee "$out/gpu.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee "$out/torch.txt"

python -m gpt.bench --config shakespeare_char --json "${extra[@]}" "${bench_extra[@]}" > "$out/bench.json"
start=$(date +%s)
python train.py --config shakespeare_char --out_dir="$out/run" --overwrite=true "${extra[@]}" "${train_extra[@]}" \
    | tee "$out/train.log"
echo "train.py wall time: $(( $(date +%s) - start )) s" | tee -a "$out/train.log"
python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
bench = json.loads((out / "bench.json").read_text())
evals = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
evals = [e for e in evals if e.get("kind") == "eval"]
reached = next((e for e in evals if e["val_loss"] <= 1.47), None)
summary = {"final_val_loss": evals[-1]["val_loss"], "best_val_loss": min(e["val_loss"] for e in evals),
           "seconds_to_val_1.47": reached["elapsed_s"] if reached else None,
           "tokens_per_sec": bench["tokens_per_sec"], "mfu": bench["mfu"], "peak_source": bench["peak_source"],
           "peak_memory_mb": bench["peak_memory_mb"], "ms_per_iter": bench["ms_per_iter"]}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
PY
python sample.py --out_dir="$out/run" --ckpt=best --start="ROMEO:" --max_new_tokens=300 --seed=1 | tee "$out/sample.txt"
python -m pytest -q -m cuda tests/test_cuda.py | tee "$out/tests.txt"
