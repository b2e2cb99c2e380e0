"""Cost models for the evolutionary search.

- ``xgb``: MetaSchedule's XGBoost model, with ``num_warmup_samples=0`` so it learns from the very first
  measured batch (the default, 100 samples across all tasks, means predicting at random for the whole of
  a small budget); saved by :mod:`dynatune.search.xgb_model` in a file that cannot run code, and trained
  when a prediction needs it, not after every batch that grew its data by a fifth.
- Both learned models extract a candidate's features once (:mod:`dynatune.search.features`).
- ``random``: random predictions (for ablations).
- ``ensemble``: AdaTune's uncertainty-aware model (:mod:`dynatune.search.surrogate`), trained lazily too.
"""

from __future__ import annotations

COST_MODELS = ("xgb", "ensemble", "random")


def cost_model_names() -> tuple[str, ...]:
    return COST_MODELS


def make_cost_model(kind: str, seed: int = 0, contextual_exploration: bool = False):
    """A cost model by name; ``contextual_exploration`` applies to ``ensemble`` only (rank by μ + κσ)."""
    from tvm.s_tir import meta_schedule as ms

    from dynatune.machine.target import usable_cores
    from dynatune.search.features import cached_features

    if kind == "xgb":
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

        from dynatune.search.xgb_model import xgb_model

        return xgb_model(
            num_warmup_samples=0,
            adaptive_training=True,
            verbose_eval=10**9,
            config=XGBConfig(nthread=usable_cores()),
            extractor=cached_features(),
        )
    if kind == "random":
        return ms.cost_model.RandomModel(seed=seed)
    if kind == "ensemble":
        from dynatune.search.surrogate import EnsembleModel

        return EnsembleModel(
            seed=seed,
            contextual_exploration=contextual_exploration,
            nthread=usable_cores(),
            extractor=cached_features(),
        )
    raise ValueError(f"unknown cost model {kind!r}")


def load_cost_model(model, path: str) -> None:
    """``model.load(path)`` called in Python, not through TVM's FFI (which turns every error into a
    RuntimeError): a file in another format raises
    :class:`~dynatune.search.model_file.RefusedModelFile`, and nothing in it is unpickled."""
    getattr(model, "_inst", model).load(path)
