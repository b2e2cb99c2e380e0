"""The tuned model of a run as an MLflow model: pyfunc flavor, logged from code
(:mod:`dynatune.tasks.pyfunc_model`).

:func:`log_tuned_model` logs it into a run as ``tuned_model``: the library and its metadata as artifacts,
a copy of :mod:`dynatune.runtime` as its code, a signature and an input example from the ONNX model's
inputs and outputs (as the metadata records them), and pinned pip requirements for what loading needs
(TVM, its FFI, numpy; MLflow adds itself). Then, in a plain Python process::

    model = mlflow.pyfunc.load_model("runs:/<run id>/tuned_model")
    outputs = model.predict({"data": x})

and ``mlflow models serve -m runs:/<run id>/tuned_model --env-manager local`` serves it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from importlib.metadata import version

import numpy as np

from dynatune import runtime
from dynatune.tasks.mlflow_store import point_mlflow_at

MODEL_NAME = "tuned_model"  # the model's name in its run: runs:/<run id>/tuned_model
# the model's code, run by MLflow when it loads the model (never imported here: it sets MLflow's model)
MODEL_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyfunc_model.py")
LIBRARY_ARTIFACT, METADATA_ARTIFACT = "library", "metadata"  # their keys among the model's artifacts
REQUIREMENTS = ("apache-tvm", "apache-tvm-ffi", "numpy")  # what loading needs, pinned to this environment


def signature(meta: dict):
    """The model's signature: its inputs and outputs as named tensors (the ONNX model's)."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    def schema(specs):
        return Schema([TensorSpec(np.dtype(s["dtype"]), tuple(s["shape"]), s["name"]) for s in specs])

    return ModelSignature(inputs=schema(meta["inputs"]), outputs=schema(meta["outputs"]))


def input_example(meta: dict, seed: int = 0) -> dict:
    """Seeded random inputs of the model's names, shapes and dtypes."""
    rng = np.random.default_rng(seed)
    return {
        s["name"]: rng.standard_normal(s["shape"]).astype(s["dtype"])
        if np.dtype(s["dtype"]).kind == "f"
        else np.zeros(s["shape"], s["dtype"])
        for s in meta["inputs"]
    }


def pip_requirements() -> list[str]:
    return [f"{name}=={version(name)}" for name in REQUIREMENTS]


def log_tuned_model(library: str, run_id: str, tracking_uri: str):
    """Log the compiled ``library`` (its metadata beside it) into MLflow run ``run_id`` as
    :data:`MODEL_NAME`; returns MLflow's ``ModelInfo``."""
    import mlflow

    meta = runtime.read_metadata(library)
    with tempfile.TemporaryDirectory(prefix="dynatune-pyfunc-") as code:
        loader = os.path.join(code, "dynatune_runtime.py")  # the runtime, under the name the model imports
        shutil.copyfile(runtime.__file__, loader)
        point_mlflow_at(tracking_uri)
        with mlflow.start_run(run_id=run_id):
            return mlflow.pyfunc.log_model(
                name=MODEL_NAME,
                python_model=MODEL_CODE,
                artifacts={LIBRARY_ARTIFACT: library, METADATA_ARTIFACT: runtime.metadata_path(library)},
                code_paths=[loader],
                signature=signature(meta),
                input_example=input_example(meta),
                pip_requirements=pip_requirements(),
            )
