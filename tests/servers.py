"""Test helpers for the tests that run servers on loopback: ports, waiting, stopping, registering models."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

MLFLOW_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@contextlib.contextmanager
def mlflow_uris_kept():
    """MLflow's fluent tracking and registry URIs, and the variables MLflow exports them to, as they were.

    ``mlflow.set_tracking_uri`` keeps its URI in the process and exports it to the environment; putting back
    what ``mlflow.get_tracking_uri()`` read (a resolved default, or a URI taken from a variable a test set
    for itself) pins it for every later test of the process, whose runs then log to a server long gone. So
    MLflow's own values are kept (None: never set) and put back, then the variables, exactly."""
    env = {name: os.environ.get(name) for name in MLFLOW_URI_VARIABLES}
    before = _mlflow_uris()
    try:
        yield
    finally:
        if "mlflow" in sys.modules:
            from mlflow.tracking._model_registry import utils as registry
            from mlflow.tracking._tracking_service import utils as tracking

            tracking.set_tracking_uri(before[0])  # (None unsets it; MLflow's tracer follows the change)
            registry._registry_uri = before[1]
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _mlflow_uris() -> tuple:
    """MLflow's fluent tracking and registry URIs as set in this process (None: never set, or MLflow not
    imported yet)."""
    if "mlflow" not in sys.modules:
        return None, None
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    return tracking._tracking_uri, registry._registry_uri


def register_model(uri: str, name: str, path: str, artifacts: str) -> str:
    """Log an ONNX model (MLflow's ONNX flavour) and register it as a new version of ``name``."""
    import mlflow
    import onnx
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("models")
    exp_id = (
        exp.experiment_id
        if exp
        else client.create_experiment("models", artifact_location="file://" + artifacts)
    )
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    with mlflow.start_run(experiment_id=exp_id):
        info = mlflow.onnx.log_model(onnx.load(path), name="model", registered_model_name=name)
    return str(info.registered_model_version)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}")
        try:
            v = check()
            if v:
                return v
        except AssertionError:
            raise
        except Exception:  # not up yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def stop_process(proc) -> None:
    """SIGINT, as Ctrl-C; then SIGTERM; then SIGKILL, 5 s apart: a server done with its test need not shut
    down gracefully (the Prefect stack's teardown took the full 20 s once given to SIGINT alone)."""
    for stop in (lambda: proc.send_signal(signal.SIGINT), proc.terminate, proc.kill):
        if proc.poll() is not None:
            return
        stop()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
