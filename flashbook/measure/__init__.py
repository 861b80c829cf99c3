"""Measuring on a GPU: benchmarks (``bench``, ``bench_bwd``, ``bench_decode``), Nsight Compute
(``ncu``, with the program it profiles, ``target``) and recording the dataset (``record``); the
timing itself is the library's (``flashattn.timing``)."""
