"""The model section: where the target comes from (config.py), reading and refusing it (source.py),
the embedded tiny Llama (tiny.py), and the stage adapter (stage.py)."""
