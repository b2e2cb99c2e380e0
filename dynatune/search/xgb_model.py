"""MetaSchedule's XGBoost cost model, saved in a file that cannot run code.

TVM's ``XGBModel.save`` writes a tar holding an ``np.save`` of Python objects, and its ``load`` reads it
back with ``np.load(allow_pickle=True)``: loading a planted file runs its code. This subclass keeps the
model and replaces only ``save`` and ``load`` with :mod:`dynatune.search.model_file` (plain arrays, the
booster in XGBoost's own UBJSON format).
"""

from __future__ import annotations

from collections import OrderedDict

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
    """An ``XGBModel`` (MetaSchedule's, with ``kwargs``) whose files cannot run code."""
    global _MODEL_CLASS
    if _MODEL_CLASS is None:
        _MODEL_CLASS = _make_model_class()
    return _MODEL_CLASS(**kwargs)


def _make_model_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup, XGBModel

    @derived_object
    class SafeXGBModel(XGBModel._cls):
        def save(self, path: str) -> None:
            hashes, arrays = pack_groups((g.group_hash, g.features, g.costs) for g in self.data.values())
            if self.booster is not None:
                arrays["booster"] = booster_array(self.booster)
            header = {"groups": hashes, "last_train_size": self.last_train_size}
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
            self.booster = booster

    return SafeXGBModel
