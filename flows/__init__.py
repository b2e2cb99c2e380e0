"""Prefect flows: the product's orchestration. Logic lives in :mod:`dynatune`, stages in :mod:`tasks`."""
