#!/usr/bin/env bash
# On a lent host with 2 GPUs, from the repo root (py-spy installed): what one GPU cannot show.
# 1. A real NCCL hang: two ranks finish a warm-up all_reduce, then rank 0 enters a second one that
#    rank 1 never joins. Rank 0's GPU holds NCCL's kernel waiting for its peer; the run must be
#    called stalled (spinning) about --stall-after seconds after its last line, with the NVML
#    figures of a real NCCL spin in its stalled event and the wait in its stacks.
# 2. The trainer under torchrun on 2 GPUs (DDP over NCCL): 30 steps, checkpoint, doctor.
# 3. Extraction with the target spread over both GPUs (--device auto) equals --device cuda.
# Usage: bash benchmarks/multi_gpu_check.sh [hang|train|extract]... (default: all three)
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
t=$(mktemp -d)
stall_after=30

cat > "$t/hang.py" <<'EOF'
import os, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
print(f"rank {rank}: warm-up all_reduce done", flush=True)
if rank == 0:
    print(f"last output at {time.time()}", flush=True)
    dist.all_reduce(x)  # rank 1 never comes
    torch.cuda.synchronize()
else:
    time.sleep(3600)
EOF
c() { python3 -m console --workdir "$t/work" local "$@"; }

hang() {
echo "== NCCL hang: 2 ranks, rank 1 never joins the second all_reduce"
run=$(c launch train --gpus 0,1 --stall-after "$stall_after" -- python3 -m torch.distributed.run \
  --nproc-per-node 2 "$t/hang.py")
for _ in $(seq 1 $((stall_after + 40))); do
  state=$(c status --json | python3 -c "import json,sys; print(json.load(sys.stdin)['runs'][0]['state'])")
  [ "$state" = stalled ] && break
  sleep 1
done
c status | head -8
python3 -m benchmarks.stall_report "$t/work/runs/$run"
nvidia-smi --query-gpu=index,utilization.gpu,utilization.memory,power.draw --format=csv,noheader
c kill "$run" --grace 2 > /dev/null
}

train() {
echo "== trainer under torchrun, 2 GPUs (DDP over NCCL)"
python3 -c "from pathlib import Path; from tests.train_fixtures import write_target, write_extraction; \
write_extraction(Path('$t/d'), write_target(Path('$t/t')))"
timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 -m backends.train --data "$t/d" --target "$t/t" \
  --draft-vocab-size 48 --val-samples 4 --batch-size 8 --lr 3e-3 --log-every 10 --eval-every 15 --steps 30 \
  --out "$t/o" 2>&1 | grep -v "^W\|^\*\|OMP_NUM" | tail -5
python3 -m backends.doctor "$t/o/final" --target "$t/t" --data "$t/d" | tail -2
}

extract() {
echo "== extraction with the target spread over 2 GPUs (--device auto) equals --device cuda"
python3 -m backends.demo_target --out "$t/target" > /dev/null
for device in cuda auto; do
  timeout 200 python3 -m backends.extract --target "$t/target" --data demo --limit 64 --device "$device" \
    --out "$t/extract-$device" 2>&1 | tail -1
done
python3 -c "
from pathlib import Path; from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained('$t/target', device_map='auto')
print('layers on devices:', sorted({str(p.device) for p in m.parameters()}))"
python3 -c "
from pathlib import Path; from backends.eagle3_contract import read_manifest, read_shard
a, b = Path('$t/extract-cuda'), Path('$t/extract-auto')
pairs = [(x, y) for sa, sb in zip(read_manifest(a).shards, read_manifest(b).shards) for x, y in zip(read_shard(a / sa.file), read_shard(b / sb.file))]
diff = max(float((x[k].float() - y[k].float()).abs().max()) for x, y in pairs for k in ('hidden_state', 'aux_hidden_states'))
print(f'{len(pairs)} samples; max |cuda - auto| = {diff}')"
}

for part in "${@:-hang train extract}"; do
  for step in $part; do "$step"; done
done
