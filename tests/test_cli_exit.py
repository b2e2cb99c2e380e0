"""The ``dynatune`` command exits without the interpreter's last garbage collection
(:func:`dynatune.cli.entry`)."""

import gc
import sys


def test_the_command_leaves_its_heap_out_of_the_last_collection(monkeypatch, capsys):
    from dynatune.cli import entry

    monkeypatch.setattr(sys, "argv", ["dynatune", "config", "schema"])
    gc.unfreeze()
    try:
        assert entry() == 0
        assert '"properties"' in capsys.readouterr().out
        assert gc.get_freeze_count() > 0  # the interpreter's final collection walks none of it
    finally:
        gc.unfreeze()  # collectable again for the tests after this one
