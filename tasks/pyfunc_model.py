"""The MLflow pyfunc model of a tuned library: MLflow's loader module for it (``_load_pyfunc``).

The model is saved as files only, no pickle: its data is the compiled library and its metadata
(``model.so``, ``model.json``), and its code is this file, named ``dynatune_pyfunc``, beside a copy of
:mod:`dynatune.runtime` named ``dynatune_runtime``. MLflow imports this module when it loads the model and
calls :func:`_load_pyfunc` on the data: loading needs TVM and numpy (the model's pinned requirements), not
dynatune, and not even MLflow's ``PythonModel``. Logged by :func:`dynatune.tasks.tuned_model.log_tuned_model`,
which never imports this file (it is MLflow's to run).

A loader module, not a ``PythonModel`` logged from code: MLflow wraps a ``PythonModel`` in a second layer
that calls ``inspect.signature`` on its ``predict`` at every call. MLflow's Python took 25.7 us a call so
(the model stubbed), 8.1 us here, where MLflow calls :attr:`TunedModelPyfunc.predict` directly, whose
signature is computed once; pyfunc's cost over the model called directly is bench.deployed_speed's
``vs_unwrapped`` (BENCHMARKS.md, #54).
"""

import inspect

import dynatune_runtime


class TunedModelPyfunc:
    """What MLflow's ``PyFuncModel`` calls: ``predict(model_input, params=None)`` takes the model's inputs
    by name (a dict of arrays; a bare array for a model with one input) and returns its outputs by name."""

    def __init__(self, model):
        self.model = model  # dynatune_runtime.TunedModel
        single = model.inputs[0][0] if len(model.inputs) == 1 else None

        def predict(model_input, params=None):
            if single is not None and not isinstance(model_input, dict):
                model_input = {single: model_input}
            return model.predict(model_input)

        # MLflow asks for predict's signature at every call: answered at once (an instance attribute is
        # not a bound method, so inspect.signature returns __signature__ as it is)
        predict.__signature__ = inspect.signature(predict)
        self.predict = predict


def _load_pyfunc(data_path):
    """MLflow's entry point: the model in ``data_path``, its data directory (``model.so``, ``model.json``)."""
    return TunedModelPyfunc(dynatune_runtime.load(data_path))
