"""A mutation check for the lifecycle, the batcher and the worker: ``python -m mutants`` (see ``__main__``)."""
