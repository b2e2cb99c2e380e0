"""The CLI's live view of a tuning run: a progress bar over the budget and a table of recent rounds.

Everything goes to stderr, so ``--json`` keeps stdout to one JSON object. Without a terminal (CI, logs)
it prints one plain line per round instead.
"""

from __future__ import annotations

import sys

from dynatune.run.callbacks import RunCallback


class LiveView(RunCallback):
    def __init__(self, cfg, quiet: bool = False):
        from rich.console import Console

        self.cfg = cfg
        self.console = Console(stderr=True)
        self.interactive = sys.stderr.isatty() and not quiet
        self.rows: list = []
        self.live = None
        self.progress = None
        self.task_id = None
        self.last_est = None

    def __enter__(self):
        if self.interactive:
            from rich.live import Live
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]tuning"),
                BarColumn(),
                TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task_id = self.progress.add_task("tune", total=self.cfg.budget_s)
            self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None

    def _render(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"{self.cfg.model.name}: {self.cfg.scheduler.name}", expand=False)
        for col in ("round", "task", "trials", "gain ms", "est. ms", "elapsed s"):
            table.add_column(col, justify="right" if col != "task" else "left")
        for r in self.rows[-10:]:
            table.add_row(*r)
        return Group(self.progress, table) if self.progress else table

    # -- RunCallback events ---------------------------------------------------------------------------
    def on_start(self, run) -> None:
        self._say(f"{run.model.name}: {len(run.tasks)} tasks" + (" (from cache)" if run.cache_hit else ""))
        if run.warm_start:
            w = run.warm_start
            self._say(f"warm start: {w['records']} records for {w['matched_tasks']} matching tasks")
        self.last_est = run.untuned_estimate_s
        what = "resuming: estimate" if run.rounds_done else "starting: untuned estimate"
        self._say(
            f"{what} {run.untuned_estimate_s * 1e3:.2f} ms, {run.rounds_done} rounds done, "
            f"{run.elapsed_s:.0f}/{self.cfg.budget_s:.0f} s spent"
        )
        if self.progress:
            self.progress.update(self.task_id, completed=run.elapsed_s)

    def on_round(self, rec) -> None:
        gain = (self.last_est - rec.estimated_latency_s) * 1e3 if self.last_est is not None else 0.0
        self.last_est = rec.estimated_latency_s
        name = ("first batch: " if rec.phase == "warmup" else "") + rec.task_name
        row = (
            str(rec.round),
            name[:40],
            str(rec.result["trials"]),
            f"{gain:.3f}",
            f"{rec.estimated_latency_s * 1e3:.3f}",
            f"{rec.elapsed_s:.0f}",
        )
        self.rows.append(row)
        if self.progress:
            self.progress.update(self.task_id, completed=min(rec.elapsed_s, self.cfg.budget_s))
            self.live.update(self._render())
        else:
            self._say(
                "round {0:>3}  {1:<40} trials {2:>4}  gain {3:>9} ms  est {4:>9} ms  {5:>5} s".format(*row)
            )

    def on_retired(self, event) -> None:
        self._say(f"task {event.task} ({event.task_name}) retired: {event.note}")

    def on_round_failed(self, error: str) -> None:
        self._say(f"round failed (continuing): {error}")

    def on_measurement(self, m) -> None:
        vs = f", {m.ratio:.2f}x ONNX Runtime ({m.onnxruntime_ms:.3f} ms)" if m.ratio is not None else ""
        est = f"estimate {m.estimated_ms:.3f} ms"
        if m.residual_ms is not None:
            est += f" + {m.residual_ms:.3f} ms the kernels alone miss"
        self._say(f"measured at {m.elapsed_s:.0f} s: {m.latency_ms:.3f} ms{vs} ({est})")

    def _say(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def print_summary(self, s) -> None:
        """The end of ``dynatune tune``: ``s`` is the run's :class:`~dynatune.run.summary.RunSummary`."""

        def ms(v):
            return f"{v:.3f} ms" if isinstance(v, (int, float)) else "-"

        lines = [
            f"model {s.model} ({s.tasks} tasks), scheduler {s.scheduler}: {s.rounds} rounds, "
            f"{s.trials} trials, {s.elapsed_s:.0f} s tuning, {s.wall_s:.0f} s wall",
            f"  estimated latency {s.estimated_latency_ms:.3f} ms (untuned estimate "
            f"{s.initial_estimated_latency_ms:.3f} ms)"
            + (
                f"; with what the kernels alone miss {s.estimated_model_latency_ms:.3f} ms"
                if s.estimated_model_latency_ms is not None
                else ""
            ),
            f"  measured latency  {ms(s.latency_ms)}   untuned TVM {ms(s.untuned_latency_ms)}   "
            f"ONNX Runtime {ms(s.onnxruntime_latency_ms)}",
        ]
        if s.estimate_excludes:
            left_out = ", ".join(s.estimate_excludes)
            lines.insert(2, f"  (the estimate leaves out tasks with no measured latency: {left_out})")
        if s.max_rel_err is not None:
            per = s.max_rel_err_per_input or []
            each = f" over {len(per)} random inputs ({', '.join(f'{e:.1e}' for e in per)})" if per else ""
            lines.append(
                f"  numerics vs ONNX Runtime: max rel err {s.max_rel_err:.2e}{each} "
                f"({'ok' if s.numerics_ok else 'FAILED'})"
            )
        if s.never_tuned_tasks:
            lines.append(
                f"  {len(s.never_tuned_tasks)} of {s.tasks} tasks were never tuned (the budget "
                f"could not pay one batch each): they run their untuned schedules"
            )
        lines.append(f"  compiled library: {s.artifact}")
        lines.append(f"  work dir: {s.work_dir}")
        lines.append(f"  MLflow run {s.mlflow_run_id}: {s.mlflow_ui or ''}")
        print("\n".join(lines))
