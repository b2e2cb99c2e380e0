"""The tuned model of a run as an MLflow model: pyfunc flavor, with its own loader module
(:mod:`dynatune.tasks.pyfunc_model`), saved as files only (no pickle).

:func:`log_tuned_model` logs it into a run as ``tuned_model``: the library and its metadata as the model's
data, the loader module and a copy of :mod:`dynatune.runtime` as its code, a signature and an input example
from the ONNX model's inputs and outputs (as the metadata records them), and pinned pip requirements for
what loading needs (TVM, its FFI, numpy; MLflow adds itself). Then, in a plain Python process::

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
# the model's loader module, imported by MLflow when it loads the model (never here: it imports the
# runtime's copy by its name in the model's code), and the names both take in the model's code
LOADER_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyfunc_model.py")
LOADER_MODULE, RUNTIME_MODULE = "dynatune_pyfunc", "dynatune_runtime"
DATA_DIR = "library"  # the model's data: data/library/model.so and its model.json
# where models logged before the loader module (as a PythonModel from code) kept the library
OLD_LIBRARY_DIR = "artifacts"
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
    with tempfile.TemporaryDirectory(prefix="dynatune-pyfunc-") as tmp:
        data = os.path.join(tmp, DATA_DIR)
        os.makedirs(data)
        copy = os.path.join(data, runtime.LIBRARY_FILE)  # what runtime.load(directory) loads
        shutil.copyfile(library, copy)
        shutil.copyfile(runtime.metadata_path(library), runtime.metadata_path(copy))
        loader, runtime_copy = (os.path.join(tmp, f"{name}.py") for name in (LOADER_MODULE, RUNTIME_MODULE))
        shutil.copyfile(LOADER_CODE, loader)
        shutil.copyfile(runtime.__file__, runtime_copy)  # under the name the loader module imports
        point_mlflow_at(tracking_uri)
        with mlflow.start_run(run_id=run_id):
            return mlflow.pyfunc.log_model(
                name=MODEL_NAME,
                loader_module=LOADER_MODULE,
                data_path=data,
                code_paths=[loader, runtime_copy],
                signature=signature(meta),
                input_example=input_example(meta),
                pip_requirements=pip_requirements(),
            )


def library_in_model(model_dir: str) -> str:
    """The compiled library inside a downloaded tuned model's directory (either layout)."""
    path = os.path.join(model_dir, "data", DATA_DIR, runtime.LIBRARY_FILE)
    return path if os.path.exists(path) else os.path.join(model_dir, OLD_LIBRARY_DIR, runtime.LIBRARY_FILE)
