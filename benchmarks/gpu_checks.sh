#!/usr/bin/env bash
# The CUDA checks, in one run on a machine with a GPU: the gpu-marked tests (the side-stream sync, no host
# sync over 1,000 training steps under torch.cuda.set_sync_debug_mode("error"), the GPU fields of the
# environment and the NVML sampler), then the metric-sync benchmark on gloo and on NCCL (one rank per GPU,
# at most 2), and what a CUDA graph would save the fold. The gpu tests need only torch, pyarrow, psutil and nvidia-ml-py, not Ray or ML-Metadata, so
# they run without the suite's conftest. Run from the repository root:
#   bash benchmarks/gpu_checks.sh [PYTHON] [TAG]   (default .venv/bin/python; TAG names the results' files)
set -uo pipefail
PY=${1:-.venv/bin/python}
TAG=${2:-}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, 'CUDA', torch.version.cuda,
      'NCCL', torch.cuda.nccl.version(), torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))" || exit 1
"$PY" -m pytest -m gpu -v -p no:cacheprovider --noconftest tests/test_metrics_gpu.py tests/test_environment_gpu.py
status=$?
"$PY" benchmarks/bench_metric_sync.py ${TAG:+--tag "$TAG"} || status=1
"$PY" benchmarks/bench_metric_sync.py --backend nccl ${TAG:+--tag "$TAG"} || status=1
"$PY" benchmarks/bench_fold_graph.py ${TAG:+--tag "$TAG"} || status=1
exit $status
