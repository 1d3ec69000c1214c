// The compiler's float16 type for the tests' independent float16 arithmetic (XQ_TEST_HALF_TYPE, undefined
// where there is none): _Float16 (g++ 12 on x86-64); g++ 12 for aarch64 has _Float16 in C only, so there
// __fp16 (IEEE format): conversions from float round to nearest even in hardware, and each operation on two
// float16 values is computed in float and rounded to float16 when stored, which gives the correctly rounded
// float16 result for + - * / (float's 24 bits >= 2 * 11 + 2: no double rounding).
#pragma once
#if defined(__FLT16_MAX__) && !(defined(__aarch64__) && !defined(__clang__) && defined(__GNUC__) && __GNUC__ < 13)
#define XQ_TEST_HALF_TYPE _Float16
#elif defined(__aarch64__) && defined(__ARM_FP16_FORMAT_IEEE)
#define XQ_TEST_HALF_TYPE __fp16
#endif
