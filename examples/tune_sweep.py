"""A small Ray Tune sweep over the learning rate with per-step logging inside every trial.

Each trial trains a small torch MLP on synthetic data, logs every optimizer step through its own Cmf
(``ray_cmf.tune.get_cmf()``), reports per-epoch validation loss to Tune, and commits its step series.
CmfRayLogger gives every trial its own MLMD execution and commits its Tune results as versioned
Parquet. At the end the trials are compared with ``ray_cmf.Sweep``, which also writes the interactive
report ``demo_report.html``.

Run with ``make demo`` (or ``python examples/tune_sweep.py [--store DIR] [--size EPOCHS]``; ``--help``).
Tune's own files go to ``<store>_ray``.
"""

from __future__ import annotations

import ray
import torch
from _cli import arguments
from ray import tune

import ray_cmf
from ray_cmf import CmfRayLogger, Sweep


def make_data(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(1024, 1, generator=g)
    return x[:768], y[:768], x[768:], y[768:]


def train(config: dict) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial weights for every learning rate
    x, y, x_val, y_val = make_data()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    cmf = ray_cmf.tune.get_cmf()
    cmf.log_seeds(data=0)  # with torch's own seed, recorded on its own
    step = 0
    for epoch in range(config["epochs"]):
        for i in range(0, len(x), config["batch_size"]):
            loss = torch.nn.functional.mse_loss(model(x[i : i + config["batch_size"]]), y[i : i + config["batch_size"]])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            cmf.log_metric("train_steps", {"step": step, "epoch": epoch, "loss": loss.item()})
        with torch.no_grad():
            val_loss = torch.nn.functional.mse_loss(model(x_val), y_val).item()
        tune.report({"val_loss": val_loss, "epoch": epoch})
    cmf.commit_metrics("train_steps")


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "epochs per trial", 8)
    store = args.store
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    logger = CmfRayLogger("lr_sweep", metric="val_loss", mode="min", top_n=2, store=store)
    tuner = tune.Tuner(
        train,
        param_space={"lr": tune.grid_search([0.003, 0.01, 0.03, 0.1]), "batch_size": 32, "epochs": args.size},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(name="lr_demo", storage_path=f"{store}_ray", callbacks=[logger], verbose=0),
    )
    tuner.fit()
    ray.shutdown()

    sweep = Sweep(store, pipeline="lr_sweep", stage="lr_demo")
    table = sweep.trials(["val_loss"])[["trial_id", "status", "config/lr", "val_loss_best", "val_loss_final", "steps"]]
    print("\nTrial comparison (lr_sweep / lr_demo), best first:")
    print(table.sort_values("val_loss_best").to_string(index=False))
    fine = Sweep(store, pipeline="lr_sweep", stage="lr_demo", metrics_name="train_steps")
    print(f"\nPer-step series: {len(fine.steps(['loss']))} optimizer steps logged across {len(table)} trials")
    curves = sweep.plot_curves("val_loss", "demo_curves.png", color_by="lr")
    print(f"Learning curves: {curves.absolute()}")
    report = sweep.report("demo_report.html", metrics=["val_loss"])
    print(f"Interactive report (one file, opens offline): {report.absolute()}")


if __name__ == "__main__":
    main()
