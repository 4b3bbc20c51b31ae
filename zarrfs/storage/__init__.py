"""Where bytes live: the store over fsspec, remote settings, keys, chunk sources, and what sits beside a store."""
