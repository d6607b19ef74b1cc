"""The sweep report at scale: 500 trials x 10 000 steps (targets: <= 5 s, <= 20 MB).

Side by side, for the loss curves alone:
* ray_cmf ``Sweep.report`` (every curve downsampled to 200 points: bucket min/max + first, last, best);
* the plain plotly way: ``plotly.express.line`` over every step, ``write_html(include_plotlyjs=True)``.
Then ray_cmf's full report (every metric, parallel coordinates, importance, lineage).

The store is generated as in ``bench_sweep_scale.py``: the real Store and its single writer, one MLMD
execution and one Parquet file per trial.

Run: ``.venv/bin/python benchmarks/bench_report.py [--trials 500 --steps 10000]``
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import Results, command_line, sweep_size, timed
from bench_sweep_scale import generate

from ray_cmf import Sweep


def plain_plotly(root: Path, path: Path) -> None:
    import plotly.express as px

    steps = Sweep(root, pipeline="scale").steps(["loss"])
    px.line(steps, x="step", y="loss", color="trial_id").write_html(path, include_plotlyjs=True)


def main() -> None:
    args = sweep_size(steps=10_000)
    results = Results("report", command_line(__file__, args))
    tmp = Path(tempfile.mkdtemp())
    root = tmp / "store"
    generated = generate(root, None, args.trials, args.steps)
    results.figure("generated", {"seconds": generated})
    print(f"generated {args.trials} trials x {args.steps} steps through the store in {generated:.1f} s\n")

    ours_loss, ours_all, peer = tmp / "loss.html", tmp / "report.html", tmp / "plotly.html"
    t_loss, _ = timed(lambda: Sweep(root, pipeline="scale").report(ours_loss, metrics=["loss"]), repeat=3)
    t_all, _ = timed(lambda: Sweep(root, pipeline="scale").report(ours_all), repeat=3)
    t_peer, _ = timed(lambda: plain_plotly(root, peer), repeat=1)
    mb = {p: p.stat().st_size / 2**20 for p in (ours_loss, ours_all, peer)}
    results.figure("loss curves: ray_cmf Sweep.report(metrics=['loss'])", {"seconds": t_loss, "mb": mb[ours_loss]})
    results.figure("loss curves: plotly.express.line over every step", {"seconds": t_peer, "mb": mb[peer]})
    results.figure("the full report: ray_cmf Sweep.report()", {"seconds": t_all, "mb": mb[ours_all]})
    results.table(
        f"The sweep report, {args.trials} trials x {args.steps} steps",
        ["report", "how", "time", "file"],
        [
            ["loss curves", "ray_cmf Sweep.report(metrics=['loss'])", f"{t_loss:.2f} s", f"{mb[ours_loss]:.1f} MB"],
            ["", "plotly.express.line over every step", f"{t_peer:.2f} s", f"{mb[peer]:.1f} MB"],
            ["", "ratio (plotly / ray_cmf)", f"{t_peer / t_loss:.1f}x", f"{mb[peer] / mb[ours_loss]:.1f}x"],
            ["the full report", "ray_cmf Sweep.report() (all metrics)", f"{t_all:.2f} s", f"{mb[ours_all]:.1f} MB"],
        ],
    )
    print(f"\nfull report: {t_all:.2f} s (target <= 5 s), {mb[ours_all]:.1f} MB (target <= 20 MB)")
    results.verdict("full report <= 5 s", t_all <= 5)
    results.verdict("full report <= 20 MB", mb[ours_all] <= 20)
    results.save()


if __name__ == "__main__":
    main()
