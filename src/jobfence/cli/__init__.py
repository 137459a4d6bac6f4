"""The ``jobfence`` command line."""
