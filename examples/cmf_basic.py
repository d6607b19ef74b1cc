"""The plain Cmf API on a small torch training loop: log every step, commit, read back.

Run: ``python examples/cmf_basic.py [--store DIR] [--size EPOCHS]`` (``--help`` says more).
"""

from __future__ import annotations

import torch
from _cli import arguments

from ray_cmf import Cmf


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "epochs of training", 5)
    store = args.store
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(512, 1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    cmf = Cmf(pipeline_name="cmf_basic", store=store)
    cmf.create_context("train")
    cmf.create_execution("Train", {"lr": 0.05, "batch_size": 32})
    for epoch in range(args.size):
        for i in range(0, len(x), 32):
            loss = torch.nn.functional.mse_loss(model(x[i : i + 32]), y[i : i + 32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            cmf.log_metric("train_steps", {"epoch": epoch, "step": i // 32, "loss": loss.item()})
    artifact = cmf.commit_metrics("train_steps")
    frame = cmf.read_metrics("train_steps")
    print(f"committed {artifact.properties['rows'].int_value} rows, md5 {artifact.properties['Commit'].string_value}")
    print(f"file: {artifact.uri}")
    print(frame.groupby("epoch")["loss"].agg(["mean", "min", "max"]).to_string())


if __name__ == "__main__":
    main()
