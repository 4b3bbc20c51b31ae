"""The tree: entries and their kinds, the namespace and its parts, open files, commits of versioned stores."""
