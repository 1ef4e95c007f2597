"""The compression algorithms as pure math on backend arrays: no framework, no MPI."""
