"""A 2-worker TorchTrainer (gloo, CPU) that logs device metrics every step and syncs them every 25 steps.

Every rank updates its metrics on its own data shard; every 25 steps StepLogger reduces them across the
workers in one collective and rank 0 appends one row. CmfTrainCallback records every rank's
``ray.train.report`` metrics; it names the store on the driver, and the workers learn it from there.
Run: ``python examples/torch_trainer.py [--store DIR] [--size EPOCHS]`` (``--help`` says more).
"""

from __future__ import annotations

import ray
import torch
from _cli import arguments
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

from ray_cmf import CmfTrainCallback, StepLogger, Sweep
from ray_cmf.metrics import Accuracy, Max, Mean, MetricCollection


def train_loop_per_worker(config: dict) -> None:
    torch.set_num_threads(1)
    context = ray.train.get_context()
    g = torch.Generator().manual_seed(context.get_world_rank())  # a different shard per rank
    x = torch.randn(2048, 20, generator=g)
    y = (x[:, :5].sum(dim=1) > 0).long()
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    metrics = MetricCollection({"loss": Mean(), "accuracy": Accuracy(), "grad_norm_max": Max()})
    steps = StepLogger(
        metrics,
        sync_every=25,
        report_every=4,
        pipeline_name="torch_trainer_demo",
        trial_id=config.get("trial_id"),
    )
    for _epoch in range(config["epochs"]):
        for i in range(0, len(x), 64):
            logits = model(x[i : i + 64])
            loss = torch.nn.functional.cross_entropy(logits, y[i : i + 64])
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
            metrics.update(
                loss=(loss, torch.tensor(float(len(logits)))),  # weighted by the batch size
                accuracy=(logits, y[i : i + 64]),
                grad_norm_max=grad_norm,
            )
            steps.step(samples=len(logits))
    steps.finish()


def run(config: dict, name: str, store: str | None = None) -> ray.train.Result:
    """Train on 2 workers; ``store`` is named where the trainer is built (None: the driver's, in a trial)."""
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=name,
            storage_path=config["results"],
            callbacks=[CmfTrainCallback("torch_trainer_demo", store=store)],
        ),
    )
    return trainer.fit()


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "epochs of training", 3)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    run({"lr": 1e-3, "epochs": args.size, "results": f"{args.store}_ray"}, name="two_workers", store=args.store)
    sweep = Sweep(args.store, pipeline="torch_trainer_demo", metrics_name="train_steps")
    print(sweep.steps(["loss", "accuracy", "grad_norm_max", "samples_per_s"]).tail(8).to_string(index=False))


if __name__ == "__main__":
    main()
