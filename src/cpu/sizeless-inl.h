// XQUANT_SIZELESS_VECTORS and XQUANT_BY_VALUE for the Highway target being compiled (HWY_TARGET).
// No include guard: simd-inl.h and fastdiv-inl.h include it once per target, after hwy/highway.h.
//
// Arm SVE vectors (targets SVE, SVE2, SVE_256, SVE2_128) are "sizeless" types: they cannot be members
// of a struct, elements of an array or captured by copy in a lambda. Code that keeps vectors in such
// places has an SVE form, chosen by XQUANT_SIZELESS_VECTORS (redefined for every target).
#undef XQUANT_SIZELESS_VECTORS
#if HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || HWY_TARGET == HWY_SVE_256 || HWY_TARGET == HWY_SVE2_128
#define XQUANT_SIZELESS_VECTORS 1
#else
#define XQUANT_SIZELESS_VECTORS 0
#endif
// The capture default of hot-loop lambdas that hold vectors: by value ([=]: no local of the loop has its
// address taken, see StagedTail), by reference on SVE (the lambdas are inlined where they are defined).
#undef XQUANT_BY_VALUE
#if XQUANT_SIZELESS_VECTORS
#define XQUANT_BY_VALUE &
#else
#define XQUANT_BY_VALUE =
#endif
