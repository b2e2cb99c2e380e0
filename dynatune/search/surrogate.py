"""AdaTune's uncertainty-aware cost model: a bootstrap ensemble of XGBoost regressors.

MetaSchedule's :class:`~tvm.s_tir.meta_schedule.cost_model.XGBModel` gives one point estimate per
candidate schedule. AdaTune (Li et al., NeurIPS 2020) replaces it with a model that also says how *sure*
it is, so that the search can explore where the model knows little.

Method
------
- **Data** exactly as XGBModel: each candidate is a matrix of per-store feature vectors (one row per buffer
  store); its cost (median run seconds, ``1e10`` when the run failed) becomes the score
  ``min_cost / cost`` within its workload group, so the best schedule of each task scores 1. A candidate's
  prediction is the sum of the per-row predictions (the "pack-sum" format, ``np.bincount`` over row ids),
  and the squared-error objective is weighted by the score, as in XGBModel.
- **Bootstrap ensemble → epistemic uncertainty.** ``K`` small boosters (default 5), each trained on a
  bootstrap resample of the *candidates* (whole candidates are drawn with replacement, never single rows)
  with its own seed. Where the data pin the function down the members agree; away from the data they
  split differently and disagree, so the spread ``σ`` across members estimates the model's uncertainty
  and the mean ``μ`` is the prediction. Trees extrapolate flat, so beyond the data ``σ`` stays at its
  value at the data's edge; ``prior_scale > 0`` adds to each member a fixed random linear function of
  the standardised features that its trees are trained to cancel on the data ("randomised prior
  functions", Osband et al. 2018), so that ``σ`` keeps growing with the distance from the data. It is off
  by default: on synthetic pack-sum data it cost a little ranking accuracy (Spearman 0.99 → 0.97 at 0.1).
- **Acquisition.** The search ranks candidates by ``μ + κ·σ`` (an upper confidence bound). With
  *contextual exploration* ``κ`` is set from the model's own state after every update, following AdaTune's
  ``ε = mean σ / best`` rule: ``κ = clip(mean σ over the latest training batch / max(best μ in that
  batch, tiny), *kappa_bounds)`` -- an uncertain model explores more, a confident one exploits. Without
  contextual exploration the search ranks by ``μ`` alone (the value of ``κ`` is still computed and logged).
- **Trained when a prediction needs it** (issue #29 item 3, as :mod:`dynatune.search.xgb_model`): an update
  that grows the data by a fifth marks the ensemble stale, and the next prediction trains it on all its
  data, then sets ``κ`` from the latest batch. A session's coverage pass measures every task's first batch
  without asking the model anything (:mod:`dynatune.search.sampled`): the trainings it asked for there
  were all thrown away but the last. An update that asks for no training sets ``κ`` at once, as before.

The numerical core, :class:`_Ensemble`, works on plain numpy arrays (list of per-candidate feature
matrices, score vector) and needs only numpy and xgboost; :class:`EnsembleModel` wraps it as a
MetaSchedule ``PyCostModel`` usable by ``EvolutionarySearch``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from dynatune.search.model_file import (
    booster_array,
    booster_from_array,
    load_model_file,
    pack_groups,
    save_model_file,
    unpack_groups,
)

if TYPE_CHECKING:
    # built on first access by the module's __getattr__ (at the end of this file): it needs TVM
    EnsembleModel: type

__all__ = ["EnsembleModel", "_Ensemble", "pack_sum"]

_TINY = 1e-9
_KIND = "ensemble"  # the saved file's kind (dynatune.search.model_file)


def pack_sum(xs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stack per-candidate feature matrices into rows; also return each row's candidate index."""
    n_rows = [int(x.shape[0]) for x in xs]
    ids = np.repeat(np.arange(len(xs), dtype=np.int64), n_rows)
    nonempty = [np.asarray(x, dtype=np.float32) for x in xs if x.shape[0] > 0]
    rows = np.concatenate(nonempty, axis=0) if nonempty else np.zeros((0, 0), dtype=np.float32)
    return rows, ids


class _Ensemble:
    """A bootstrap ensemble of pack-sum XGBoost regressors (the numpy core of :class:`EnsembleModel`).

    ``xs`` is a list of per-candidate 2-D feature matrices (rows = stores, all with the same number of
    columns), ``ys`` the per-candidate scores. ``predict_members`` returns a ``(K, n)`` matrix of summed
    per-candidate predictions; ``predict_mean_std`` their mean and standard deviation across members.
    """

    def __init__(
        self,
        num_members: int = 5,
        seed: int = 0,
        num_boost_round: int = 60,
        max_depth: int = 6,
        eta: float = 0.2,
        gamma: float = 0.001,
        min_child_weight: float = 0.0,
        nthread: int = 2,
        colsample_bytree: float = 1.0,
        prior_scale: float = 0.0,
    ):
        if num_members < 2:
            raise ValueError("an ensemble needs at least 2 members to estimate a spread")
        self.num_members = int(num_members)
        self.seed = int(seed)
        self.num_boost_round = int(num_boost_round)
        self.params = {
            "max_depth": int(max_depth),
            "eta": float(eta),
            "gamma": float(gamma),
            "min_child_weight": float(min_child_weight),
            "nthread": int(nthread),
            "colsample_bytree": float(colsample_bytree),
            "tree_method": "hist",
            "base_score": 0.0,
            "verbosity": 0,
        }
        self.prior_scale = float(prior_scale)
        self.boosters: list = []
        self.priors: list[np.ndarray] = []  # per-member random linear prior weights (randomised priors)
        self.center: np.ndarray | None = None
        self.scale: np.ndarray | None = None
        self.num_features: int | None = None
        self.fits = 0  # how many times fit() ran; decorrelates the resamples of successive fits

    @property
    def trained(self) -> bool:
        return bool(self.boosters)

    def fit(self, xs: list[np.ndarray], ys: np.ndarray) -> None:
        import xgboost as xgb

        ys = np.asarray(ys, dtype=np.float64)
        keep = [i for i, x in enumerate(xs) if x.shape[0] > 0]
        if not keep:
            return
        xs = [np.asarray(xs[i], dtype=np.float32) for i in keep]
        ys = ys[keep]
        self.num_features = d = int(xs[0].shape[1])
        all_rows, _ = pack_sum(xs)
        self.center = all_rows.mean(axis=0).astype(np.float64)
        self.scale = np.maximum(all_rows.std(axis=0), 1.0).astype(np.float64)
        rng = np.random.default_rng([self.seed, self.fits])
        self.fits += 1
        boosters, priors = [], []
        for _ in range(self.num_members):
            bx, by = self._resample(xs, ys, rng)
            rows, ids = pack_sum(bx)
            row_y = by[ids]
            w = rng.standard_normal(d) / np.sqrt(d)
            prior = np.bincount(ids, weights=self._prior_rows(rows, w), minlength=len(bx))[ids]
            target = row_y - prior  # the trees fit what the member's prior leaves over
            dtrain = xgb.DMatrix(rows, label=row_y, weight=row_y, nthread=self.params["nthread"])

            def obj(pred, _dtrain, ids=ids, row_y=row_y, target=target, n_c=len(bx)):
                # squared error on the per-candidate sums, weighted by the score (as XGBModel's PackSum)
                summed = np.bincount(ids, weights=pred, minlength=n_c)[ids]
                return (summed - target) * row_y, row_y.copy()

            params = dict(self.params, seed=int(rng.integers(0, 2**31 - 1)))
            boosters.append(xgb.train(params, dtrain, num_boost_round=self.num_boost_round, obj=obj))
            priors.append(w)
        self.boosters, self.priors = boosters, priors

    @staticmethod
    def _resample(xs: list[np.ndarray], ys: np.ndarray, rng) -> tuple[list[np.ndarray], np.ndarray]:
        """A bootstrap resample over whole candidates (all rows of a drawn candidate come with it)."""
        pick = rng.integers(0, len(xs), size=len(xs))
        return [xs[i] for i in pick], ys[pick]

    def _prior_rows(self, rows: np.ndarray, w: np.ndarray) -> np.ndarray:
        if self.prior_scale == 0.0:
            return np.zeros(rows.shape[0])
        return self.prior_scale * (((rows - self.center) / self.scale) @ w)

    def predict_members(self, xs: list[np.ndarray]) -> np.ndarray:
        """``(K, n)`` per-member, per-candidate summed predictions (zeros for candidates without rows)."""
        import xgboost as xgb

        n = len(xs)
        if n == 0 or not self.boosters:
            return np.zeros((max(1, len(self.boosters)), n))
        rows, ids = pack_sum(xs)
        if rows.shape[0] == 0:
            return np.zeros((len(self.boosters), n))
        dm = xgb.DMatrix(rows, nthread=self.params["nthread"])
        return np.stack(
            [
                np.bincount(ids, weights=b.predict(dm) + self._prior_rows(rows, w), minlength=n)
                for b, w in zip(self.boosters, self.priors)
            ]
        )

    def predict_mean_std(self, xs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        preds = self.predict_members(xs)
        return preds.mean(axis=0), preds.std(axis=0)

    # -- serialisation (plain arrays and XGBoost's own booster format: nothing that can run code) ---------
    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """``(header, arrays)`` for :func:`dynatune.search.model_file.save_model_file`."""
        header = {
            "num_members": self.num_members,
            "seed": self.seed,
            "num_boost_round": self.num_boost_round,
            "params": dict(self.params),
            "num_features": self.num_features,
            "fits": self.fits,
            "prior_scale": self.prior_scale,
            "boosters": len(self.boosters),
            "normalised": self.center is not None,
        }
        arrays = {f"member{i}.booster": booster_array(b) for i, b in enumerate(self.boosters)}
        arrays |= {f"member{i}.prior": np.asarray(w, dtype=np.float64) for i, w in enumerate(self.priors)}
        if self.center is not None:
            arrays["center"], arrays["scale"] = self.center, self.scale
        return header, arrays

    @classmethod
    def from_state(cls, st: dict, arrays: dict[str, np.ndarray]) -> "_Ensemble":
        ens = cls(num_members=st["num_members"], seed=st["seed"], num_boost_round=st["num_boost_round"])
        ens.params = dict(st["params"])
        ens.num_features = st["num_features"]
        ens.fits = int(st["fits"])
        ens.prior_scale = float(st["prior_scale"])
        n = int(st["boosters"])
        ens.boosters = [booster_from_array(arrays[f"member{i}.booster"]) for i in range(n)]
        ens.priors = [arrays[f"member{i}.prior"] for i in range(n)]
        if st["normalised"]:
            ens.center, ens.scale = arrays["center"], arrays["scale"]
        return ens


def acquisition_kappa(std: np.ndarray, mean: np.ndarray, bounds: tuple[float, float]) -> float:
    """AdaTune's exploration weight: mean σ over best μ, clipped to ``bounds``."""
    if len(std) == 0:
        return float(bounds[0])
    best = max(float(np.max(mean)), _TINY)
    k = float(np.mean(std)) / best
    if not np.isfinite(k):
        k = float(bounds[1])
    return float(np.clip(k, bounds[0], bounds[1]))


class _FeatureGroup:
    """One workload's measured candidates (as XGBModel's FeatureGroup)."""

    def __init__(self, group_hash: str, features: list[np.ndarray], costs: np.ndarray):
        self.group_hash = group_hash
        self.features = list(features)
        self.costs = np.asarray(costs, dtype=np.float32)

    @property
    def min_cost(self) -> float:
        return float(np.min(self.costs))

    def append(self, features: list[np.ndarray], costs: np.ndarray) -> None:
        self.features.extend(features)
        self.costs = np.append(self.costs, np.asarray(costs, dtype=np.float32))

    def scores(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(self.min_cost, self.costs, out=np.zeros_like(self.costs), where=self.costs != 0)


def _make_model_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model import PyCostModel
    from tvm.s_tir.meta_schedule.feature_extractor import FeatureExtractor
    from tvm.s_tir.meta_schedule.utils import shash2hex

    @derived_object
    class EnsembleModel(PyCostModel):
        """AdaTune's uncertainty-aware cost model for MetaSchedule (see the module docstring).

        Parameters
        ----------
        num_members: ensemble size K.
        seed: seeds the bootstrap resamples, the boosters and the random pre-training predictions.
        contextual_exploration: rank by ``μ + κ·σ`` with κ from AdaTune's rule (else by ``μ``).
        kappa_bounds: the clip range of κ.
        num_warmup_samples: predict at random until this many samples were seen (as XGBModel).
        adaptive_training: retrain only once the data grew by 20 % since the last training (the training
        itself waits for the next prediction: :meth:`train_if_stale`).
        num_boost_round, max_depth, eta, nthread: each member's XGBoost settings (no early stopping).
        prior_scale: weight of each member's random linear prior (0: a plain bootstrap ensemble).
        extractor: MetaSchedule feature extractor (default: per-store features, as XGBModel).
        """

        def __init__(
            self,
            *,
            num_members: int = 5,
            seed: int = 0,
            contextual_exploration: bool = False,
            kappa_bounds: tuple[float, float] = (0.0, 2.0),
            num_warmup_samples: int = 0,
            adaptive_training: bool = True,
            num_boost_round: int = 60,
            max_depth: int = 6,
            eta: float = 0.2,
            nthread: int = 2,
            prior_scale: float = 0.0,
            extractor="per-store-feature",
        ):
            super().__init__()
            lo, hi = float(kappa_bounds[0]), float(kappa_bounds[1])
            if not lo <= hi:
                raise ValueError(f"kappa_bounds must be (low, high) with low <= high, got {kappa_bounds!r}")
            if not isinstance(extractor, FeatureExtractor):
                extractor = FeatureExtractor.create(extractor)
            self.extractor = extractor
            self.seed = int(seed)
            self.contextual_exploration = bool(contextual_exploration)
            self.kappa_bounds = (lo, hi)
            self.num_warmup_samples = int(num_warmup_samples)
            self.adaptive_training = bool(adaptive_training)
            self.ensemble = _Ensemble(
                num_members=num_members,
                seed=seed,
                num_boost_round=num_boost_round,
                max_depth=max_depth,
                eta=eta,
                nthread=nthread,
                prior_scale=prior_scale,
            )
            self.data: OrderedDict[str, _FeatureGroup] = OrderedDict()
            self.data_size = 0
            self.last_train_size = 0
            self.stale = False  # an update asked for a training that no prediction has needed yet
            self._kappa_batch: list[np.ndarray] | None = None  # the latest batch, for κ after that training
            self.exploration = 0.0
            self.exploration_log: list[tuple[int, float]] = []
            self._rng = np.random.default_rng(self.seed)

        # -- MetaSchedule interface ------------------------------------------------------------------
        def update(self, context, candidates, results) -> None:
            assert len(candidates) == len(results)
            if len(candidates) == 0:
                return
            feats = self._features(context, candidates)
            costs = np.array([_median_cost(r) for r in results], dtype=np.float32)
            keep = [i for i, f in enumerate(feats) if f.shape[0] > 0]
            if not keep:
                return
            feats = [feats[i] for i in keep]
            costs = costs[keep]
            self._add(shash2hex(context.mod), feats, costs)

        def predict(self, context, candidates) -> np.ndarray:
            """``μ``, or ``μ + κ·σ`` with contextual exploration (random before data: ``σ`` is 0 then)."""
            mean, std = self.predict_mean_std(context, candidates)
            if self.contextual_exploration:
                mean = mean + self.exploration * std
            return np.asarray(mean, dtype="float64")

        def predict_mean_std(self, context, candidates) -> tuple[np.ndarray, np.ndarray]:
            """Ensemble mean score and its spread per candidate (random mean, zero spread before data)."""
            n = len(candidates)
            if n == 0:
                return np.zeros((0,)), np.zeros((0,))
            self.train_if_stale()
            if not self._ready():
                return self._rng.uniform(0.0, 1.0, size=(n,)), np.zeros((n,))
            mean, std = self.ensemble.predict_mean_std(self._features(context, candidates))
            return mean.astype("float64"), std.astype("float64")

        def save(self, path: str) -> None:
            hashes, arrays = pack_groups((g.group_hash, g.features, g.costs) for g in self.data.values())
            ensemble, ensemble_arrays = self.ensemble.state()
            header = {
                "groups": hashes,
                "data_size": self.data_size,
                "last_train_size": self.last_train_size,
                "stale": self.stale,
                "exploration": self.exploration,
                "exploration_log": [list(x) for x in self.exploration_log],
                "ensemble": ensemble,
                "rng": self._rng.bit_generator.state,
            }
            arrays |= {f"ensemble.{k}": v for k, v in ensemble_arrays.items()}
            save_model_file(path, _KIND, header, arrays)

        def load(self, path: str) -> None:
            """Raises :class:`~dynatune.search.model_file.RefusedModelFile` for a file in another format (a
            pickle is never unpickled). A model saved stale trains on its first prediction; its ``κ`` stays
            the saved one until the next update (the batch it was to be set from is not saved)."""
            state, arrays = load_model_file(path, _KIND)
            groups = unpack_groups(state["groups"], arrays)
            data = OrderedDict((h, _FeatureGroup(h, feats, costs)) for h, feats, costs in groups)
            prefix = "ensemble."
            ensemble_arrays = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            ensemble = _Ensemble.from_state(state["ensemble"], ensemble_arrays)
            self.data = data
            self.data_size = int(state["data_size"])
            self.last_train_size = int(state["last_train_size"])
            self.stale = bool(state.get("stale", False))
            self._kappa_batch = None
            self.exploration = float(state["exploration"])
            self.exploration_log = [(int(n), float(k)) for n, k in state["exploration_log"]]
            self.ensemble = ensemble
            self._rng.bit_generator.state = state["rng"]

        # -- internals -------------------------------------------------------------------------------
        def _ready(self) -> bool:
            return self.ensemble.trained and self.data_size >= self.num_warmup_samples

        def _features(self, context, candidates) -> list[np.ndarray]:
            return [x.numpy().astype("float32") for x in self.extractor.extract_from(context, candidates)]

        def _add(self, group_hash: str, feats: list[np.ndarray], costs: np.ndarray) -> None:
            """Add one measured batch of a workload; mark the ensemble stale if a training is due, else
            recompute κ on that batch (a stale ensemble sets κ from the latest batch once trained)."""
            group = self.data.get(group_hash)
            if group is None:
                self.data[group_hash] = group = _FeatureGroup(group_hash, feats, costs)
            else:
                group.append(feats, costs)
            self.data_size += len(feats)
            if not (
                self.adaptive_training
                and (self.ensemble.trained or self.stale)
                and self.data_size - self.last_train_size < self.last_train_size / 5
            ):
                self.last_train_size = self.data_size
                self.stale = True
            if self.stale:
                self._kappa_batch = feats
            elif self.ensemble.trained:
                self._set_kappa(feats)

        def train_if_stale(self) -> None:
            """The training the updates asked for, on all the data, then κ on the latest batch."""
            if not self.stale:
                return
            self.stale = False
            self.last_train_size = self.data_size
            xs = [f for g in self.data.values() for f in g.features]
            ys = np.concatenate([g.scores() for g in self.data.values()])
            self.ensemble.fit(xs, ys)
            batch, self._kappa_batch = self._kappa_batch, None
            if batch is not None and self.ensemble.trained:
                self._set_kappa(batch)

        def _set_kappa(self, feats: list[np.ndarray]) -> None:
            mean, std = self.ensemble.predict_mean_std(feats)
            self.exploration = acquisition_kappa(std, mean, self.kappa_bounds)
            self.exploration_log.append((self.data_size, self.exploration))

    return EnsembleModel


def _median_cost(result) -> float:
    if not result.run_secs:
        return 1e10
    return float(np.median([float(s) for s in result.run_secs]))


def __getattr__(name: str):
    # EnsembleModel needs TVM; build it on first use so the numpy core imports without TVM.
    if name == "EnsembleModel":
        cls = _make_model_class()
        globals()["EnsembleModel"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
