"""The ``fulgor`` command line."""
