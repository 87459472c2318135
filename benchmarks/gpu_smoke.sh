#!/usr/bin/env bash
# On the lent GPU machine, from the repo root: the trainer's CLI end to end on CUDA (train,
# checkpoint, resume, doctor on the result), then extraction throughput with 1 and 2 shard writers.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
t=$(mktemp -d)
python3 -c "from pathlib import Path; from tests.train_fixtures import write_target, write_extraction; \
write_extraction(Path('$t/d'), write_target(Path('$t/t')))"
args=(--data "$t/d" --target "$t/t" --draft-vocab-size 48 --val-samples 4 --batch-size 8 --lr 3e-3
      --log-every 10 --eval-every 15 --save-every 15 --steps 30)
echo "== train 30 steps on CUDA"
timeout 240 python3 -m backends.train "${args[@]}" --out "$t/o" 2>&1 | tail -6
echo "== resume from step 15 in a fresh folder"
mkdir -p "$t/r" && cp -r "$t/o/step-15" "$t/r/"
timeout 200 python3 -m backends.train "${args[@]}" --out "$t/r" --resume 2>&1 | tail -4
echo "== doctor on the final checkpoint"
python3 -m backends.doctor "$t/o/final" --target "$t/t" --data "$t/d" | tail -3
for w in 1 2; do
  echo "== extraction throughput, $w writer(s)"
  timeout 200 python3 -m benchmarks.extract_throughput --iters 3 --writers "$w" 2>&1 | tail -9
done
