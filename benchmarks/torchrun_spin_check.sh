#!/usr/bin/env bash
# On a lent GPU host (one GPU is enough), from the repo root, with py-spy installed: a rank spinning
# in a kernel under torchrun, so the launcher (torchrun's agent, polling its workers) is a process of
# the run that does not wait on the GPU. It must be idle enough for the run to be called stalled
# (spinning) about --stall-after seconds after its last line.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
t=$(mktemp -d)
cat > "$t/spin.py" <<'PY'
import time, torch
torch.cuda.init()
print(f"last output at {time.time()}", flush=True)
torch.cuda._sleep(2**60)
torch.cuda.synchronize()
PY
c() { python3 -m console --workdir "$t/work" local "$@"; }
run=$(c launch train --stall-after 30 -- python3 -m torch.distributed.run --nproc-per-node 1 "$t/spin.py")
for _ in $(seq 1 75); do
  [ "$(c status --json | python3 -c "import json,sys; print(json.load(sys.stdin)['runs'][0]['state'])")" = stalled ] && break
  sleep 1
done
python3 -m benchmarks.stall_report "$t/work/runs/$run"
launcher=$(c status --json | python3 -c "import json,sys; print(json.load(sys.stdin)['runs'][0]['pid'])")
a=$(python3 -c "from benchmarks._common import cpu_seconds; print(cpu_seconds($launcher))"); sleep 10
b=$(python3 -c "from benchmarks._common import cpu_seconds; print(cpu_seconds($launcher))")
python3 -c "print(f'torchrun launcher CPU over 10 s: {100 * ($b - $a) / 10:.1f}% of a core')"
c kill "$run" --grace 2 > /dev/null
