"""The MLflow pyfunc model of a tuned library, logged as code (MLflow's models-from-code, so the model holds
no pickle): MLflow runs this file when it loads the model.

The model's artifacts are the compiled library and its metadata (``model.so``, ``model.json``), and its
code is a copy of :mod:`dynatune.runtime` named ``dynatune_runtime``: loading the model needs TVM and numpy
(its pinned requirements), not dynatune. ``predict`` takes the model's inputs by name (a dict of arrays; a
bare array for a model with one input) and returns its outputs by name. Logged by
:func:`dynatune.tasks.tuned_model.log_tuned_model`, which never imports this file (it is MLflow's to run).
"""

import mlflow
from mlflow.pyfunc import PythonModel


class TunedModelPyfunc(PythonModel):
    # its inputs are arrays by name, checked by the loader: no type hint MLflow could validate them by (and
    # no warning asking for one in every run's console)
    _skip_type_hint_validation = True

    def load_context(self, context):
        import dynatune_runtime

        # the library's key among the artifacts (dynatune.tasks.tuned_model.LIBRARY_ARTIFACT; this file is run
        # alone, where dynatune cannot be imported), its metadata beside it
        self.model = dynatune_runtime.load(context.artifacts["library"])

    def predict(self, context, model_input, params=None):
        if not isinstance(model_input, dict) and len(self.model.inputs) == 1:
            model_input = {self.model.inputs[0][0]: model_input}
        return self.model.predict(model_input)


mlflow.models.set_model(TunedModelPyfunc())
