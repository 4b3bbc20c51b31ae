"""zarrfs: mount a Zarr hierarchy as a file system of .npy files."""

__version__ = "0.1.0"
