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
