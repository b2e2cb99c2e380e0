"""MetaSchedule's XGBoost cost model, saved in a file that cannot run code, and trained when it is asked.

TVM's ``XGBModel.save`` writes a tar holding an ``np.save`` of Python objects, and its ``load`` reads it
back with ``np.load(allow_pickle=True)``: loading a planted file runs its code. This subclass keeps the
model and replaces ``save`` and ``load`` with :mod:`dynatune.search.model_file` (plain arrays, the booster
in XGBoost's own UBJSON format).

It also trains only when a prediction needs it (issue #29 item 3, "update the cost model less often where
that costs no quality"). TVM's ``update`` retrains after a batch once the data grew by a fifth since the
last training. A session's coverage pass measures every task's first batch without asking the model
anything (the head and random samples: :mod:`dynatune.search.sampled`), so the trainings it triggered
there were all thrown away but the last. Now ``update`` only marks the model stale, and the next
``predict`` trains it on all the data it holds: the same trainings wherever a prediction follows, none
where none does. A saved stale model says so, and is trained on its first prediction after loading.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from dynatune.search.model_file import (
    booster_array,
    booster_from_array,
    load_model_file,
    pack_groups,
    save_model_file,
    unpack_groups,
)

_KIND = "xgb"
_MODEL_CLASS = None


def xgb_model(**kwargs):
    """An ``XGBModel`` (MetaSchedule's, with ``kwargs``) whose files cannot run code, trained lazily."""
    global _MODEL_CLASS
    if _MODEL_CLASS is None:
        _MODEL_CLASS = _make_model_class()
    return _MODEL_CLASS(**kwargs)


def training_set(groups) -> tuple[list, np.ndarray]:
    """The features and targets ``XGBModel.update`` trains on: every candidate of every workload (at least
    one), its target the workload's best cost over its own."""
    xs = [f for g in groups for f in g.features]
    with np.errstate(divide="ignore", invalid="ignore"):
        ys = [np.divide(g.min_cost, g.costs, out=np.zeros_like(g.costs), where=g.costs != 0) for g in groups]
    return xs, np.concatenate(ys, axis=0)


def _make_model_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup, XGBModel

    base = XGBModel._cls

    @derived_object
    class SafeXGBModel(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.stale = False  # update() asked for a training that no prediction has needed yet
            self._in_update = False
            self.trainings = 0

        def update(self, context, candidates, results) -> None:
            self._in_update = True
            try:
                super().update(context, candidates, results)
            finally:
                self._in_update = False

        def _train(self, xs, ys) -> None:
            if self._in_update:
                self.stale = True  # trained on all the data by the next predict()
                return
            self.trainings += 1
            super()._train(xs=xs, ys=ys)

        def predict(self, context, candidates):
            self.train_if_stale()
            return super().predict(context, candidates)

        def train_if_stale(self) -> None:
            if self.stale:
                self.stale = False
                self._train(*training_set(list(self.data.values())))

        def save(self, path: str) -> None:
            hashes, arrays = pack_groups((g.group_hash, g.features, g.costs) for g in self.data.values())
            if self.booster is not None:
                arrays["booster"] = booster_array(self.booster)
            header = {"groups": hashes, "last_train_size": self.last_train_size, "stale": self.stale}
            save_model_file(path, _KIND, header, arrays)

        def load(self, path: str) -> None:
            """Raises :class:`~dynatune.search.model_file.RefusedModelFile` for a file in another format
            (TVM's own, a pickle): nothing in it is unpickled."""
            header, arrays = load_model_file(path, _KIND)
            data = OrderedDict(
                (h, FeatureGroup(group_hash=h, features=feats, costs=costs))
                for h, feats, costs in unpack_groups(header["groups"], arrays)
            )
            booster = booster_from_array(arrays["booster"]) if "booster" in arrays else None
            self.data = data
            self.data_size = sum(len(g.costs) for g in data.values())
            self.last_train_size = int(header["last_train_size"])
            self.stale = bool(header.get("stale", False))
            self.booster = booster

    return SafeXGBModel
