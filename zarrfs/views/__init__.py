"""The `.zarrfs` views and the byte streams every file of the tree is read through."""
