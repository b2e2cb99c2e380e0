"""The CLI's live view of a tuning run: a progress bar over the budget and a table of recent rounds.

Everything goes to stderr, so ``--json`` keeps stdout to one JSON object. Without a terminal (CI, logs)
it prints one plain line per round instead.

Each stage says so as it starts (import, extraction, the untuned latencies, the coverage pass, compile,
verify, timing, ...), and a stage with no rounds to show says how long it has been running every
``heartbeat_s`` seconds, so the console is never silent for long.
"""

from __future__ import annotations

import sys
import threading
import time

from dynatune.run.callbacks import RunCallback

HEARTBEAT_S = 5.0
ROUND_STAGES = ("coverage pass", "tuning")  # stages whose rounds are shown one by one


class LiveView(RunCallback):
    def __init__(self, cfg, quiet: bool = False, heartbeat_s: float = HEARTBEAT_S):
        from rich.console import Console

        self.cfg = cfg
        self.heartbeat_s = heartbeat_s
        self._stage: tuple[str, float] | None = None  # the stage without rounds that runs, since when
        self._stage_changed = threading.Condition()
        self._closed = False
        self._beat = threading.Thread(target=self._heartbeat, name="dynatune-heartbeat", daemon=True)
        self.console = Console(stderr=True)
        self.interactive = sys.stderr.isatty() and not quiet
        self.rows: list = []
        self.live = None
        self.progress = None
        self.task_id = None
        self.last_est = None

    def __enter__(self):
        self._beat.start()
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
        with self._stage_changed:
            self._closed, self._stage = True, None
            self._stage_changed.notify_all()
        if self._beat.is_alive():
            self._beat.join(timeout=2 * self.heartbeat_s)
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

    def _heartbeat(self) -> None:
        """Every ``heartbeat_s`` while a stage without rounds runs: a line saying how long it has run."""
        with self._stage_changed:
            while not self._closed:
                stage = self._stage
                self._stage_changed.wait(self.heartbeat_s)
                if stage is not None and self._stage == stage and not self._closed:
                    self._say(f"  {stage[0]}: {time.monotonic() - stage[1]:.0f} s")

    # -- RunCallback events ---------------------------------------------------------------------------
    def on_stage(self, name: str, detail: str = "") -> None:
        self._say(f"{name}: {detail}" if detail else f"{name}...")
        with self._stage_changed:
            self._stage = None if name in ROUND_STAGES else (name, time.monotonic())
            self._stage_changed.notify_all()

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
        stop, reopened = run.state.get("stop"), run.state.get("reopened_stop")
        carried = run.state.get("carried_stop") if not run.rounds_done else None
        confirmed = run.state.get("confirmed")
        if confirmed and not run.rounds_done:
            self._say(
                f"confirmed: {len(confirmed)} tasks' best schedules from earlier runs measured again here"
            )
        if carried:
            slots = carried.get("slots")
            over = f", over the {slots:.1f} slots it had left," if slots is not None else ""
            agreed = (run.state.get("carried_check") or {}).get("stop")
            self._say(
                f"{carried['source']} stopped with the same tasks and stopping settings; its "
                f"{carried['streak']} checks in a row count here, and this run's own check{over} before its "
                + ("first slot agrees" if agreed else "first slot does not: tuning goes on, counting afresh")
            )
        elif stop:
            self._say(
                f"stopped earlier at {stop['elapsed_s']:.0f} s: {stop['reason']}; the same budget and "
                "tasks, so tuning does not go on (a larger --budget, or --no-stop, tunes on)"
            )
        elif reopened:
            self._say(f"stopped earlier at {reopened['elapsed_s']:.0f} s; tuning goes on: {reopened['why']}")
        if self.progress:
            self.progress.update(self.task_id, completed=run.elapsed_s)

    def on_tuning_end(self, event) -> None:
        if event.stopped_early:
            self._say(f"tuning over, {event.saved_s:.0f} s of the budget saved: {event.reason}")
        else:
            self._say(f"tuning over: {event.reason}")

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
        if m.under_load:
            vs += f" (taken under load: other work took {m.load_cores:.2f} cores)"
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
        if s.ratio_vs_onnxruntime is not None:
            from dynatune.run.report import unfair_timing_note

            per, note = s.ratio_vs_onnxruntime_per_process or [], unfair_timing_note(s)
            processes = f"; {len(per)} processes {', '.join(f'{r:.3f}' for r in per)}" if len(per) > 1 else ""
            lines.append(
                f"  TVM / ONNX Runtime side by side {s.ratio_vs_onnxruntime:.3f} (rounds "
                f"{s.ratio_vs_onnxruntime_min:.3f}-{s.ratio_vs_onnxruntime_max:.3f}{processes})"
                + (f" {note}" if note else "")
            )
        if s.max_rel_err is not None:
            per = s.max_rel_err_per_input or []
            each = f" over {len(per)} random inputs ({', '.join(f'{e:.1e}' for e in per)})" if per else ""
            lines.append(
                f"  numerics vs ONNX Runtime: max rel err {s.max_rel_err:.2e}{each} "
                f"({'ok' if s.numerics_ok else 'FAILED'})"
            )
        if s.stop_reason:
            saved = f" ({s.tuning_s_saved:.0f} s saved)" if s.stopped_early and s.tuning_s_saved else ""
            lines.append(f"  why tuning ended{saved}: {s.stop_reason}")
        if s.never_tuned_tasks:
            lines.append(
                f"  {len(s.never_tuned_tasks)} of {s.tasks} tasks were never tuned (no batch before tuning "
                f"ended, no schedule from an earlier run): they run their untuned schedules"
            )
        lines.append(f"  compiled library: {s.artifact}")
        if s.artifact_metadata:
            lines.append(
                f"  its metadata: {s.artifact_metadata} (timed on {s.threads} threads); run it at that speed "
                f"with dynatune.runtime.load({s.artifact!r}).predict(inputs)"
            )
        lines.append(f"  work dir: {s.work_dir}")
        lines.append(f"  MLflow run {s.mlflow_run_id}: {s.mlflow_ui or ''}")
        if s.tuned_model_uri:
            lines.append(f"  MLflow model: mlflow.pyfunc.load_model({s.tuned_model_uri!r})")
        print("\n".join(lines))
