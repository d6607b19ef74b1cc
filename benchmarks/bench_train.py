"""TorchTrainer overhead: 2 CPU workers (gloo), a small MLP, 3000 steps.

Variants, each a separate TorchTrainer run in one Ray session, timed inside the training loop (Ray's
start-up excluded):
* no logging;
* ray_cmf: device metrics updated every step, ``StepLogger`` synced every 50 steps (<= 3 collectives),
  rank 0 appending one row per sync, committed at the end;
* torchmetrics: the same metrics in a ``torchmetrics.MetricCollection``, ``compute()`` (its sync) every 50
  steps, the values moved to the host and kept by rank 0;
* ray_cmf without accuracy: only the loss and the gradient norm (scalars), to separate the logging path's
  cost from the cost of computing accuracy on the logits.

Run: ``.venv/bin/python benchmarks/bench_train.py [--steps 3000 --rounds 2]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

sys.path.insert(0, str(Path(__file__).parent))

from _common import print_table  # noqa: E402

SYNC_EVERY = 50


def loop(config: dict[str, Any]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4096, 32, generator=g), torch.randint(0, 4, (4096,), generator=g)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    variant = config["variant"]
    if variant.startswith("ray_cmf"):
        from ray_cmf.metrics import Accuracy, Max, Mean, MetricCollection
        from ray_cmf.train import StepLogger

        chosen = {"loss": Mean(), "accuracy": Accuracy(), "grad_norm_max": Max()}
        if variant == "ray_cmf without accuracy":
            chosen.pop("accuracy")
        metrics = MetricCollection(chosen)
        logger = StepLogger(
            metrics, sync_every=SYNC_EVERY, store=config["store"], pipeline_name="bench_train", run_name=config["run"]
        )
    elif variant == "torchmetrics":
        import torchmetrics

        tm = torchmetrics.MetricCollection(
            {
                "loss": torchmetrics.MeanMetric(),
                "grad_norm_max": torchmetrics.MaxMetric(),
                "accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=4),
            }
        )
        kept: list[dict[str, float]] = []
    dist.barrier()
    start = time.perf_counter()
    for step in range(config["steps"]):
        i = (step * 64) % 4096
        logits = model(x[i : i + 64])
        loss = torch.nn.functional.cross_entropy(logits, y[i : i + 64])
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        if variant.startswith("ray_cmf"):
            metrics["loss"].update(loss.detach())
            if "accuracy" in chosen:
                metrics["accuracy"].update(logits.detach(), y[i : i + 64])
            metrics["grad_norm_max"].update(grad_norm.detach())
            logger.step(samples=64)
        elif variant == "torchmetrics":
            tm["loss"].update(loss.detach())
            tm["accuracy"].update(logits.detach(), y[i : i + 64])
            tm["grad_norm_max"].update(grad_norm.detach())
            if (step + 1) % SYNC_EVERY == 0:
                values = {k: v.item() for k, v in tm.compute().items()}
                tm.reset()
                if rank == 0:
                    kept.append(values)
    if variant.startswith("ray_cmf"):
        logger.finish()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        Path(config["out"]).write_text(str(elapsed))


def run(variant: str, steps: int, tmp: Path, index: int) -> float:
    slug = variant.replace(" ", "_")
    out = tmp / f"{slug}-{index}.txt"
    TorchTrainer(
        loop,
        train_loop_config={
            "variant": variant,
            "steps": steps,
            "out": str(out),
            "store": str(tmp / "store"),
            "run": f"{slug}-{index}",
        },
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=f"{slug}-{index}", storage_path=str(tmp / "results")),
    ).fit()
    return float(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    variants = ("no logging", "ray_cmf", "torchmetrics", "ray_cmf without accuracy")
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for variant in variants:
            times[variant].append(run(variant, args.steps, tmp, r))
    base = statistics.median(times["no logging"])
    rows = [
        [
            v,
            f"{statistics.median(t):.2f} s",
            f"{(statistics.median(t) / base - 1) * 100:+.1f}%",
            f"{statistics.median(t) / args.steps * 1e3:.3f} ms",
        ]
        for v, t in times.items()
    ]
    print(
        f"## TorchTrainer, 2 gloo workers, {args.steps} steps, metrics every step, synced every {SYNC_EVERY} "
        f"(median of {args.rounds})\n"
    )
    print_table(["logging", "training loop time", "overhead vs no logging", "per step"], rows)
    print(f"\nall loop times (s): { {k: [round(x, 2) for x in v] for k, v in times.items()} }")


if __name__ == "__main__":
    main()
