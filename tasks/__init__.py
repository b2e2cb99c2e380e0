"""Prefect tasks: thin wrappers around the dynatune library (and the MLflow tracking glue)."""
