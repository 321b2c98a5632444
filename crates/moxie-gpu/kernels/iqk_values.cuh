// Code books of ik_llama.cpp's IQ2_K .. IQ5_K and IQ2_KS .. IQ5_KS types (ik's ggml-common.h:
// iq2nl_values, iq3nl_values, iq4k_values, iq5nl_values), copied from moxie-quant's
// src/iqk.rs (IQ2NL, IQ3NL, IQ4K, IQ5NL); moxie-gpu's `ik_code_books_equal_moxie_quants` test
// checks that they are equal. Both halves of each book: the upper half is the lower one
// shifted, picked by a group's `extra` bit. IQ6_K needs no table: it dequantizes through a
// cubic (quant.cuh), as moxie-quant does.
#pragma once

// IQ2_K, IQ2_KS: halves of 4, the upper = the lower + 5.
static const __device__ int8_t mx_iq2nl_values[8] = {
     -31,  -13,    1,   17,  -26,   -8,    6,   22,
};

// IQ3_K, IQ3_KS: halves of 8, the upper = the lower + 4.
static const __device__ int8_t mx_iq3nl_values[16] = {
     -63,  -40,  -23,  -10,    1,   13,   28,   47,  -59,  -36,  -19,   -6,    5,   17,   32,   51,
};

// IQ4_K, IQ4_KS: halves of 16 (the lower is IQ4_NL's), the upper = the lower + 4.
static const __device__ int8_t mx_iq4k_values[32] = {
    -127, -104,  -83,  -65,  -49,  -35,  -22,  -10,    1,   13,   25,   38,   53,   69,   89,  113,
    -123, -100,  -79,  -61,  -45,  -31,  -18,   -6,    5,   17,   29,   42,   57,   73,   93,  117,
};

// IQ5_K, IQ5_KS: halves of 32, the upper = the lower + 2.
static const __device__ int8_t mx_iq5nl_values[64] = {
    -126, -114, -103,  -92,  -83,  -74,  -65,  -57,  -50,  -43,  -36,  -30,  -24,  -18,  -12,   -6,
      -1,    5,   11,   17,   23,   29,   36,   43,   51,   59,   68,   77,   87,   97,  109,  121,
    -124, -112, -101,  -90,  -81,  -72,  -63,  -55,  -48,  -41,  -34,  -28,  -22,  -16,  -10,   -4,
       1,    7,   13,   19,   25,   31,   38,   45,   53,   61,   70,   79,   89,   99,  111,  123,
};
