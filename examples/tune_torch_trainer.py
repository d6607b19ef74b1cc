"""A small Tune sweep whose trials each run a 2-worker TorchTrainer; every run is linked to its trial.

CmfRayLogger gives each trial an execution; inside the trial a TorchTrainer trains on 2 CPU workers,
and its StepLogger (given the trial id through ``train_loop_config``) commits the run's synced step series
as an output of both the Train run and the Tune trial. The store is named once, on the driver.
Run: ``python examples/tune_torch_trainer.py [--store DIR] [--size EPOCHS]`` (``--help`` says more).
"""

from __future__ import annotations

import ray
from _cli import arguments
from ray import tune
from torch_trainer import run

from ray_cmf import CmfRayLogger, Sweep


def trial(config: dict) -> None:
    trial_id = tune.get_context().get_trial_id()
    result = run({**config, "trial_id": trial_id}, name=f"run-{trial_id}")
    tune.report({"trained": 1.0, "failed": result.error is not None})  # not "done": that is Tune's stop flag


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "epochs of each trial's Train run", 2)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    logger = CmfRayLogger("torch_trainer_demo", pipeline_stage="nested_sweep", store=args.store)
    tune.Tuner(
        tune.with_resources(trial, {"cpu": 0.1}),
        param_space={"lr": tune.grid_search([1e-3, 3e-3]), "epochs": args.size, "results": f"{args.store}_ray"},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(name="nested_sweep", storage_path=f"{args.store}_ray", callbacks=[logger], verbose=0),
    ).fit()
    runs = Sweep(args.store, pipeline="torch_trainer_demo", stage="nested_sweep", metrics_name="train_steps")
    print(
        runs.trials(["loss", "accuracy"])[["trial_id", "status", "loss_final", "accuracy_final", "steps"]].to_string(
            index=False
        )
    )


if __name__ == "__main__":
    main()
