#!/usr/bin/env bash
# Issue 29's must-holds on a quiet many-core host: calibrate, then validate, each of the three
# CPU layers at 2 gloo ranks, recording the host's load before and after each step.
#
#   bash benchmarks/validate_cpu_host.sh OUT_DIR [REPEATS]
#
# Run it from the repository root. PYTHON names the interpreter (default python3, with `sim`
# importable from the root). On a lent GPU machine run it alone, pinned by `taskset` to a few
# cores: beside the GPU suite its runs spread by 88% (reports/gpu-h100-80gb-hbm3-2026-11-28).
set -u
out=${1:?usage: validate_cpu_host.sh OUT_DIR [REPEATS]}
repeats=${2:-5}
py=${PYTHON:-python3}
mkdir -p "$out"
log="$out/host.log"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "cores (affinity): $($py -c 'import os; print(len(os.sched_getaffinity(0)))')"
  echo "cores (machine): $(nproc --all)"
  grep -m1 'model name' /proc/cpuinfo
  lscpu -e=CPU,CORE,SOCKET,NODE 2>/dev/null
  $py -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads())'
} >"$log" 2>&1
for name in base odd wide; do
  case $name in
    base) cfg=benchmarks/validate_cpu.yaml ;;
    *) cfg=benchmarks/validate_cpu_$name.yaml ;;
  esac
  echo "$name load before calibrate: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
  t0=$(date +%s)
  $py -m sim.cli calibrate --nprocs 2 --backend gloo --shapes-from "$cfg" \
    --out "$out/$name-calibration.yaml" >"$out/$name-calibrate.log" 2>&1
  echo "$name calibrate rc $? in $(($(date +%s) - t0)) s" >>"$log"
  echo "$name load before validate: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
  t0=$(date +%s)
  $py -m sim.cli validate "$cfg" --nprocs 2 --backend gloo --repeats "$repeats" \
    --calibration "$out/$name-calibration.yaml" --out "$out/$name" >"$out/$name-validate.log" 2>&1
  echo "$name validate rc $? in $(($(date +%s) - t0)) s" >>"$log"
  echo "$name load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
  cp "$out/$name/report.md" "$out/$name.md" 2>/dev/null
done
cat "$log"
