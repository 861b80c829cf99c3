"""Measuring on a GPU: timing (``timing``), benchmarks (``bench``), Nsight Compute (``ncu``,
with the program it profiles, ``target``) and recording the dataset (``record``)."""
