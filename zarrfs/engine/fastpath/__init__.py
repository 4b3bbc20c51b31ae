"""Optional read strategies: each one off gives the same bytes, slower."""
