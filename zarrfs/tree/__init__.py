"""The tree: entries, the namespace, open files, freshness, changes and arriving files."""
