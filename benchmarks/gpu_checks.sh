#!/usr/bin/env bash
# The CUDA checks, in one run on a machine with a GPU: the gpu-marked tests (the side-stream sync, no host
# sync over 1,000 training steps under torch.cuda.set_sync_debug_mode("error")), then the metric-sync
# benchmark (gloo; and NCCL when there are 2 GPUs). Run from the repository root:
#   bash benchmarks/gpu_checks.sh [PYTHON]   (default .venv/bin/python)
set -uo pipefail
PY=${1:-.venv/bin/python}
"$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" || exit 1
"$PY" -m pytest -m gpu -v -p no:cacheprovider tests/test_metrics_gpu.py tests/test_environment_gpu.py
status=$?
"$PY" benchmarks/bench_metric_sync.py
if [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    "$PY" benchmarks/bench_metric_sync.py --backend nccl
fi
exit $status
