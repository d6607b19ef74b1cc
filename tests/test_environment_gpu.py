"""GPU fields of the environment record and of the system-metrics series. Skipped without CUDA."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from ray_cmf.buffer import MetricBuffer
from ray_cmf.environment import hardware_info, software_versions
from ray_cmf.series_format import SpillManifest, read_segments
from ray_cmf.system import SystemSampler

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_the_hardware_record_names_the_gpus_and_the_software_record_cuda_and_nccl() -> None:
    hardware = hardware_info()
    assert hardware["env_gpu_count"] == torch.cuda.device_count()
    assert hardware["env_gpu_model"] == torch.cuda.get_device_name(0)
    assert hardware["env_gpu_memory_gb"] > 1
    software = software_versions()
    assert software["env_cuda"] == torch.version.cuda and software["env_nccl"].count(".") == 2


def test_the_sampler_reads_every_gpu_through_nvml(tmp_path: Path) -> None:
    buffer = MetricBuffer(tmp_path / "spill", manifest=SpillManifest("system_metrics", 1, str(tmp_path / "s.parquet")))
    busy = torch.randn(4096, 4096, device="cuda")
    sampler = SystemSampler(buffer, interval=0.2).start()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        busy = busy @ busy / busy.norm()  # keep GPU 0 busy while it is sampled
    torch.cuda.synchronize()
    sampler.stop()
    rows = [row for batch in read_segments(tmp_path / "spill") for row in batch.to_pylist()]
    assert len(rows) >= 3
    for i in range(torch.cuda.device_count()):
        assert all(0 <= r[f"gpu{i}_util_percent"] <= 100 and r[f"gpu{i}_mem_used_mb"] > 0 for r in rows)
        assert all(r[f"gpu{i}_power_w"] > 0 for r in rows)
    assert max(r["gpu0_util_percent"] for r in rows) > 0  # the busy loop shows
