#!/bin/bash
# switchyard's convolutional models on a GPU, against their expected outputs and PyTorch.
#
# On the development machine, from the project's root, after `bash ../shared/gpu/bundle.sh`:
#   bash benches/gpu/cnn.sh pack [DIR]
# copies the visible ONNX models (../shared/onnx/models: model, inputs, expected outputs) and
# the .onnx files of DIR (torchvision CNNs that benches/peers/cnn.py exported with --keep) into
# .gpu/, with this script and cnn_peers.py. Then, on the GPU machine, from the project's root:
#   bash .gpu/cnn.sh
# 1. the workspace's GPU tests of the convolutions; 2. every model on cuda:0 against its
# expected outputs, with its plan's executor mix; 3. the CNNs' time per inference with
# switchyard on cuda:0 against PyTorch eager (and torch.compile with --compile) on the same GPU,
# f32 computed as IEEE f32 on both sides; 4. the rest of the workspace's GPU tests.
# Logs go to $OUT/cnn (or /tmp/cnn).
set -uo pipefail
if [ "${1:-}" = pack ]; then
  here=$(cd "$(dirname "$0")" && pwd)
  [ -d .gpu/bin ] || { echo "run bash ../shared/gpu/bundle.sh first" >&2; exit 1; }
  mkdir -p .gpu/models .gpu/cnns
  for d in ../shared/onnx/models/*/; do
    n=$(basename "$d"); [ -f "$d/expected.safetensors" ] || continue
    mkdir -p ".gpu/models/$n"; cp "$d"/model.onnx "$d"/inputs.safetensors "$d"/expected.safetensors ".gpu/models/$n/"
  done
  [ -n "${2:-}" ] && cp "$2"/*.onnx .gpu/cnns/ 2>/dev/null
  cp "$here/cnn.sh" "$here/cnn_peers.py" .gpu/
  du -sh .gpu; exit 0
fi
cd "$(dirname "$0")"; G=$PWD; SY=$G/bin/switchyard; R=${OUT:-/tmp}/cnn; mkdir -p "$R"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in *H200*) model=h200;; *A100*) model=a100;; *) model=h100;; esac
echo "device: $name (cost model $model)" | tee "$R/summary.txt"
root=$(cat build_root); if [ ! -e "$root/examples/traces" ]; then mkdir -p "$root/examples" "$root/tests"; ln -sfn "$G/traces" "$root/examples/traces"; fi
timeout 150 ./bin/workspace_tests gpu_convolutions gpu_f32_convolutions --nocapture --test-threads 1 > "$R/gpu_conv_tests.txt" 2>&1
echo "conv GPU tests exit $?: $(grep -E '^test result' "$R/gpu_conv_tests.txt")" | tee -a "$R/summary.txt"
grep -E "equal to the fallback|IEEE worst|panicked" "$R/gpu_conv_tests.txt" | cut -c1-300 | tee -a "$R/summary.txt"
for d in models/*/; do
  n=$(basename "$d")
  if ! timeout 120 "$SY" run "$d/model.onnx" --inputs "$d/inputs.safetensors" --target cuda:0 --device-model $model \
      --outputs "/tmp/$n.st" --json > "$R/$n.json" 2> "$R/$n.err"; then
    echo "$n: failed: $(grep -m1 -iE 'error|panicked' "$R/$n.err" | cut -c1-300)" | tee -a "$R/summary.txt"; continue
  fi
  mix=$(python3 -c "import json,sys,collections; r=json.load(open(sys.argv[1])); print(dict(collections.Counter(g['executor']+'@'+g['device'] for g in r['regions'])))" "$R/$n.json" 2>&1)
  echo "$n: worst relative difference $(python3 compare.py "/tmp/$n.st" "$d/expected.safetensors" 2>&1 | tail -1) $mix" | tee -a "$R/summary.txt"
done
export SWITCHYARD_CACHE_DIR=/tmp/sy-cache
PYTHONUNBUFFERED=1 timeout 200 python3 cnn_peers.py --export cnns "$@" > "$R/torch.json" 2> "$R/torch.err"
echo "torch peers exit $?" | tee -a "$R/summary.txt"; cat "$R/torch.json" | tee -a "$R/summary.txt"
for m in cnns/*.onnx; do
  [ -f "$m" ] || continue; n=$(basename "$m" .onnx)
  timeout 120 "$SY" bench "$m" --target cuda:0 --device-model $model --repeat 50 --json "$R/bench_$n.json" > "$R/bench_$n.txt" 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], 'switchyard cuda:0 median', round(r['results'][-1]['stats']['median_ns']/1e6, 3), 'ms')" "$R/bench_$n.json" "$n" 2>&1 | tee -a "$R/summary.txt"
done
timeout 150 ./bin/workspace_tests gpu_ --skip gpu_convolutions --skip gpu_f32_convolutions --test-threads 1 > "$R/gpu_tests.txt" 2>&1
echo "other GPU tests exit $?: $(grep -E '^test result' "$R/gpu_tests.txt")" | tee -a "$R/summary.txt"
grep -E "^test .*FAILED|panicked" "$R/gpu_tests.txt" | head -20 | cut -c1-300 | tee -a "$R/summary.txt"
