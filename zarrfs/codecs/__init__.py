"""Codecs: the chain over numcodecs, bounded and ranged decoding, sharding, variable-length strings."""
