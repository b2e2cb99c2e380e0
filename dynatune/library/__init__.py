"""The schedule library: every run on a kind of machine starts from everything tuned on it before.

- :mod:`.store`: the records, in SQLite (embedded, the default) or PostgreSQL (a farm), keyed by task key and
  machine fingerprint;
- :mod:`.link`: a run's use of it (seeding matched tasks, writing every batch).

The CLI's ``dynatune library`` shows, exports, imports and prunes it.
"""
