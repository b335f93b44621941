"""The `ingest` command line."""
