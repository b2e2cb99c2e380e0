"""The batches a tuning session builds, recorded for a bench to build or time again (``build_shares.py``,
``candidate_life.py``)."""

from __future__ import annotations


def record_built_batches(session) -> list[list]:
    """From now on, each batch ``session`` builds is appended to the list returned: its candidates, without
    those the layout rewrite rejected (``None``)."""
    batches: list[list] = []
    build_and_run = session._build_and_run

    def recorded(cands, *args, **kwargs):
        batches.append([c for c in cands if c is not None])
        return build_and_run(cands, *args, **kwargs)

    session._build_and_run = recorded
    return batches


def search_batch_arguments():
    """An argument parser with what :func:`search_batches` takes: the model, ``--tasks``, ``--batch``, and
    the bench's ``--rounds``."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    return ap


def search_batches(model_path: str, tasks: int, batch: int) -> tuple[object, list[tuple[str, list]]]:
    """Each of the ``tasks`` heaviest tasks' (weight x FLOPs) first search batch of ``batch`` candidates (its
    second batch, after its first: the analytic head and random samples), as a tuning session builds it:
    the target, and ``(task name, candidates)`` per task."""
    import tempfile

    from dynatune.machine.target import make_target
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.session import SearchConfig, TuningSession

    target = make_target()
    found = extract_tasks(load_model(model_path), target)
    heavy = sorted(range(len(found)), key=lambda i: -found[i].flops * found[i].weight)[:tasks]
    session = TuningSession(found, target, tempfile.mkdtemp(), search=SearchConfig(trials_per_iter=batch))
    built = record_built_batches(session)
    session.warm_up()
    out = []
    for i in heavy:
        session.tune(i, trials=batch)  # the task's first batch
        session.tune(i, trials=batch)  # the search's
        out.append((found[i].name, built[-1]))
    session.close()
    return target, out
