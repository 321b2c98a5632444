// Code books of ik_llama.cpp's IQ2_K .. IQ6_K and IQ2_KS .. IQ5_KS types (ik's ggml-common.h:
// iq2nl_values, iq3nl_values, iq4k_values, iq5nl_values, iq6nl_values), copied from
// moxie-quant's src/iqk.rs (IQ2NL, IQ3NL, IQ4K, IQ5NL, IQ6NL); moxie-gpu's
// `ik_code_books_equal_moxie_quants` test checks that they are equal. Both halves of each
// book: the upper half is the lower one shifted, picked by a group's `extra` bit. IQ6_K's f32
// values come from a cubic (quant.cuh), as moxie-quant's do; its int8 products use the book.
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

// IQ6_K's dot products (its values dequantize through a cubic, quant.cuh, whose rounded
// values these are): halves of 64, the upper = the lower + 1.
static const __device__ int8_t mx_iq6nl_values[128] = {
    -127, -121, -115, -109, -104,  -98,  -93,  -88,  -84,  -79,  -74,  -70,  -66,  -62,  -58,  -54,
     -51,  -47,  -44,  -40,  -37,  -34,  -31,  -28,  -25,  -22,  -19,  -16,  -13,  -11,   -8,   -5,
      -2,    0,    3,    6,    9,   12,   14,   17,   20,   23,   27,   30,   33,   36,   40,   44,
      47,   51,   55,   59,   63,   68,   72,   77,   82,   87,   92,   98,  103,  109,  115,  121,
    -126, -120, -114, -108, -103,  -97,  -92,  -87,  -83,  -78,  -73,  -69,  -65,  -61,  -57,  -53,
     -50,  -46,  -43,  -39,  -36,  -33,  -30,  -27,  -24,  -21,  -18,  -15,  -12,  -10,   -7,   -4,
      -1,    1,    4,    7,   10,   13,   15,   18,   21,   24,   28,   31,   34,   37,   41,   45,
      48,   52,   56,   60,   64,   69,   73,   78,   83,   88,   93,   99,  104,  110,  116,  122,
};
