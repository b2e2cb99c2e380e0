"""The run: its config, the pipeline from import to export, the tuning loop, the work dir, the callbacks
that tell the outside world, the live view, the report, the lock and warm start."""
