"""Prefect flows: the product's orchestration. Logic lives in the library, stages in
:mod:`dynatune.tasks`.

A process that runs flows logs to Prefect's API (the run logs the Prefect UI shows): every log record of it
is masked (:func:`dynatune.secrets.mask_log_records`), whichever logger writes it.
"""

from dynatune.secrets import mask_log_records

mask_log_records()
