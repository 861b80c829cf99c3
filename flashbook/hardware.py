"""The H200's published peaks, defined once: every roofline, efficiency and target in the book
reads them from here (NVIDIA's H200 SXM datasheet; book/references.md)."""
PEAK_TFLOPS = 989.0     # dense fp16/bf16 tensor-core peak
HBM_TBS = 4.8           # HBM3e bandwidth, TB/s
