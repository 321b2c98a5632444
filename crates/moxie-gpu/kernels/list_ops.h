// Kernels of ops.cu.
