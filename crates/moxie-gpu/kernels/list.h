// Every kernel the backends can launch, by its extern "C" name: the emulator builds its
// launch table from this list (each entry K(name)). Keep it in step with the kernel files.
// Files: common.cuh (helpers, no kernels), iq_grids.cuh (IQ code books, generated),
// iqk_values.cuh (ik_llama.cpp's code books),
// quant.cuh (per-type 32-value dequantization),
// matmul.cu (mul_mat / mul_mat_id / get_rows per type), matmul_q8.cu (the same products over
// int8 activations), ops.cu (everything else).
#include "list_matmul.h"
#include "list_matmul_q8.h"
#include "list_ops.h"
