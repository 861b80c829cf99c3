"""The H200's published peaks and sizes, defined once: every roofline, efficiency, target and
launch plan in the book reads them from here (NVIDIA's H200 SXM datasheet; book/references.md)."""
PEAK_TFLOPS = 989.0     # dense fp16/bf16 tensor-core peak
HBM_TBS = 4.8           # HBM3e bandwidth, TB/s
SM_COUNT = 132          # streaming multiprocessors (the recorded metadata's sm_count, where kept)
L2_BYTES = 50 << 20     # L2 cache, 50 MB (torch reports the real one where it can)
