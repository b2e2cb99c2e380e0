"""Cost-model files that cannot run code.

A saved cost model is one ``.npz`` of plain numeric arrays, read with ``allow_pickle=False``: a JSON header
(as bytes), each XGBoost booster in XGBoost's own UBJSON format, and the measured data (per workload: its
candidates' feature rows, how many rows each candidate has, their costs).

A pickle runs code when it is loaded, and so does TVM's own ``XGBModel.load`` (``np.load`` with
``allow_pickle=True`` on an object array); work dirs are copied between machines and restored from MLflow
artifacts. A file in any other format (a pickle, TVM's tar, an older dynatune's file) is refused with
:class:`RefusedModelFile` before anything in it is read; the session then starts its cost model afresh.
"""

from __future__ import annotations

import json
import zipfile

import numpy as np

FORMAT = "dynatune.cost_model/2"
_ZIP_MAGIC = b"PK\x03\x04"  # an .npz is a zip archive; a pickle starts with b"\x80", a tar with a name
_HEADER = "header"


class RefusedModelFile(ValueError):
    """A cost-model file not in :data:`FORMAT`: nothing in it was loaded."""


def save_model_file(path: str, kind: str, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write a ``kind`` cost model (``header``: JSON values; ``arrays``: numeric arrays) to ``path``."""
    for name, arr in arrays.items():
        if arr.dtype == object:
            raise TypeError(f"cost-model array {name!r} holds Python objects")
    head = json.dumps({"format": FORMAT, "kind": kind, **header}).encode()
    with open(path, "wb") as f:
        np.savez(f, **{_HEADER: np.frombuffer(head, dtype=np.uint8)}, **arrays)


def load_model_file(path: str, kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """``(header, arrays)`` of a ``kind`` cost model saved by :func:`save_model_file`; raises
    :class:`RefusedModelFile` for anything else, without unpickling or running anything."""
    with open(path, "rb") as f:
        magic = f.read(len(_ZIP_MAGIC))
    if magic != _ZIP_MAGIC:
        raise RefusedModelFile(f"{path} is not a {FORMAT} file (a pickle or an older format): not loaded")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        header = json.loads(arrays.pop(_HEADER).tobytes())
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise RefusedModelFile(f"{path} is not a readable {FORMAT} file ({exc}): not loaded") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("kind") != kind:
        raise RefusedModelFile(f"{path} is not a saved {kind!r} cost model: not loaded")
    return header, arrays


def pack_groups(groups) -> tuple[list[str], dict[str, np.ndarray]]:
    """Measured data as plain arrays: ``groups`` is ``[(workload hash, [features per candidate], costs)]``;
    returns the hashes and, per group ``i``, arrays ``g<i>.rows``, ``g<i>.counts`` and ``g<i>.costs``."""
    hashes, arrays = [], {}
    for i, (group_hash, features, costs) in enumerate(groups):
        hashes.append(str(group_hash))
        mats = [np.asarray(x, dtype=np.float32) for x in features]
        width = mats[0].shape[1] if mats else 0
        arrays[f"g{i}.rows"] = np.concatenate(mats) if mats else np.zeros((0, width), np.float32)
        arrays[f"g{i}.counts"] = np.array([m.shape[0] for m in mats], dtype=np.int64)
        arrays[f"g{i}.costs"] = np.asarray(costs, dtype=np.float32)
    return hashes, arrays


def unpack_groups(hashes: list[str], arrays: dict[str, np.ndarray]) -> list[tuple[str, list, np.ndarray]]:
    """The inverse of :func:`pack_groups`."""
    out = []
    for i, group_hash in enumerate(hashes):
        counts = arrays[f"g{i}.counts"]
        features = np.split(arrays[f"g{i}.rows"], np.cumsum(counts)[:-1]) if len(counts) else []
        out.append((group_hash, list(features), arrays[f"g{i}.costs"]))
    return out


def booster_array(booster) -> np.ndarray:
    """An XGBoost booster as bytes (its UBJSON model) in a uint8 array."""
    return np.frombuffer(bytes(booster.save_raw("ubj")), dtype=np.uint8)


def booster_from_array(arr: np.ndarray):
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(arr.tobytes()))
    return booster
