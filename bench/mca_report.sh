#!/bin/sh
# llvm-mca throughput of the AVX-512 hot loop of every benchmarked kernel (bench_ops --ratios large cases),
# for Intel (sapphirerapids, icelake-server models) and AMD (znver4), in cycles per 16-element vector.
#   bench/mca_report.sh [build dir, default build/release]   (needs llvm-mca-19: apt-get install llvm-19)
# Kernels with a division have two loops: "divider" (the default on AMD) and "FMA" (the default on Intel).
B=${1:-build/release}
O=$B/CMakeFiles/xquant.dir/src/cpu
M="python3 $(dirname "$0")/mca_loops.py"
CPUS=${MCA_CPUS:-sapphirerapids,icelake-server,znver4}
run() {  # name object function markers [vectors per iteration]
  printf '%s\n  ' "$1"
  $M "$O/$2" "$3" --marker "$4" --vectors "${5:-1}" --mcpu "$CPUS" --quiet |
    sed "s/ cycles\/\(vector\|iteration\) (block reciprocal throughput; simulated/ (simulated/g"
}
FQ='N_AVX3::FwdSpanT<(xquant::DType)0'
run "fake quant forward f32, divider" fake_quant.cpp.o "$FQ, 0, false, false, false>" 'vmulps,vrndscale,vmovnt'
run "fake quant forward f32, FMA (one step)" fake_quant.cpp.o "$FQ, 1, false, false, false>" 'vmulps,vrndscale,vmovnt'
run "fake quant forward f16 (float16 arithmetic: x * scale rounded by the magic add, q * (1 / scale))" fake_quant.cpp.o 'N_AVX3_DL::FwdSpanF16<false>' 'vmulps,vrndscale'
run "fake quant backward f32 + grad_amax terms (streamed)" fake_quant.cpp.o 'N_AVX3::BwdSpan<(xquant::DType)0>' 'vmulps,vmovnt'
Q='N_AVX3::SpanT<(xquant::DType)0, (xquant::QuantDType)0'
run "quantize div_mode f32 -> int8, divider (streamed)" quantize.cpp.o "$Q, 1, false>" 'vdivps,vmovntdq'
run "quantize div_mode f32 -> int8, FMA (streamed)" quantize.cpp.o "$Q, 2, false>" 'vfnmadd,vmovntdq'
run "quantize mul f32 -> quint4x2 (two vectors per iteration; the streamed twin has the same arithmetic)" quantize.cpp.o 'N_AVX3::SpanT<(xquant::DType)0, (xquant::QuantDType)3, 0, true>' 'vmulps*2,vpmaddwd' 2
D='N_AVX3::SmoothAndReduce<(xquant::DType)'
R='N_AVX3::RowsT<(xquant::DType)2>'
R0='N_AVX3::RowsT<(xquant::DType)0>'
run "dynamic quant pass 1, bf16 int16-key min/max (per 16 elements)" dynamic_quant.cpp.o 'N_AVX3::ReduceHalfKeys<(xquant::DType)2>' 'vpminsw*2,vpsraw' 4
run "dynamic quant pass 1, bf16 * smooth (even / odd elements, scales in that order; two vectors per iteration)" dynamic_quant.cpp.o "${D}2, false>" 'vpslld,vmulps*2,vminps' 2
run "dynamic quant pass 1, f32 min/max only (two vectors per iteration)" dynamic_quant.cpp.o "${D}0, false>" 'vcmpunordps,vminps*2,!vmulps' 2
run "dynamic quant pass 1, f32 * smooth (two vectors per iteration)" dynamic_quant.cpp.o "${D}0, false>" 'vmulps*2,vcmpunordps' 2
run "dynamic quant pass 2 bf16 -> int8, fixed-point rounding check, even / odd pairs (streamed)" dynamic_quant.cpp.o "$R" 'vpslld,vptestmd,vpternlogd,vpmovdw,vmovntdq,!vmulps' 2
run "dynamic quant pass 2 bf16 -> int8 smooth, fixed-point check (streamed)" dynamic_quant.cpp.o "$R" 'vpslld,vmulps*2,vptestmd,vpmovdw,vmovntdq' 2
run "dynamic quant pass 2 bf16 -> int4, fixed-point check, even / odd pairs" dynamic_quant.cpp.o "$R" 'vpslld,vptestmd,vpternlogd,vpmovdb,!vmulps,!vmovntdq' 2
run "dynamic quant pass 2 f32 -> int8, fixed-point check (streamed)" dynamic_quant.cpp.o "$R0" 'vptestmd,vpmovsdb*2,vmovntdq,!vmulps' 2
run "dynamic quant pass 2 f32 -> int4 smooth, fixed-point check, vpermt2w packing (streamed)" dynamic_quant.cpp.o "$R0" 'vmulps*2,vptestmd,vpermt2w,vmovntdq' 2
F='N_AVX3::FusedRows<(xquant::DType)'
run "dynamic quant smooth rows fused: pass 2 bf16 -> int8 and the next row's pass 1 (streamed; per pair of vectors of each row)" dynamic_quant.cpp.o "${F}2, true, false, true, true>" 'vptestmd,vminps,vmovntdq' 2
run "dynamic quant rows fused: pass 2 bf16 -> int8 and the next row's int16-key pass 1 (no smooth scales; streamed)" dynamic_quant.cpp.o "${F}2, false, false, true, true>" 'vptestmd,vpminsw,vmovntdq' 2
run "dynamic quant rows fused: pass 2 bf16 -> int4 and the next row's int16-key pass 1 (no smooth scales; streamed)" dynamic_quant.cpp.o "${F}2, false, true, true, true>" 'vptestmd,vpminsw,vmovntdq' 2
run "dynamic quant smooth rows fused: pass 2 f32 -> int4 and the next row's pass 1 (streamed)" dynamic_quant.cpp.o "${F}0, true, true, false, true>" 'vptestmd,vminps,vpermt2w' 2
run "dynamic quant rows fused: pass 2 f32 -> int8 and the next row's pass 1 (no smooth scales; streamed)" dynamic_quant.cpp.o "${F}0, false, false, false, true>" 'vptestmd,vminps,vmovntdq' 2
FD='N_AVX3_DL::FusedRows<(xquant::DType)'
run "AVX3_DL (the dispatch on Zen 4 and Ice Lake or later): smooth rows fused, bf16 -> int8 (x' kept in a buffer, VBMI packing)" dynamic_quant.cpp.o "${FD}2, true, false, true, true>" 'vpmultishiftqb,vpermt2b,vminps' 2
run "AVX3_DL: rows fused, bf16 -> int8, int16-key pass 1 (VBMI packing)" dynamic_quant.cpp.o "${FD}2, false, false, true, true>" 'vpmultishiftqb,vpermt2b,vpminsw' 2
run "AVX3_DL: rows fused, f32 -> int8 (VBMI packing)" dynamic_quant.cpp.o "${FD}0, false, false, false, true>" 'vpmultishiftqb,vpermt2b,vminps' 2
run "dynamic quant pass 2 bf16 -> int8, y - rint(y) check (mode 3 / rows rint_fixed refuses; streamed)" dynamic_quant.cpp.o "$R" 'vpslld,vrangeps,vpmovdw,vmovntdq,!vmulps' 2
run "dynamic quant pass 2 -> int8, divider (rows the check refuses; streamed)" dynamic_quant.cpp.o "$R" 'vdivps,vmovntdq,!vreduce,!vfpclass,!vrangeps,!vmulps'
run "dynamic quant pass 2 -> int8, FMA (rows the check refuses; streamed)" dynamic_quant.cpp.o "$R" 'vfnmadd,vmovntdq,!vreduce,!vfpclass,!vrangeps'
U='N_AVX3::UlqSpanT<(xquant::DType)0'
run "ActsULQ forward f32, 4 outputs, divider (streamed)" acts_ulq.cpp.o "$U, false>" 'vdivps,vmovnt'
run "ActsULQ forward f32, 4 outputs, FMA (streamed)" acts_ulq.cpp.o "$U, true>" 'vfnmadd,vmovnt,!vdivps'
run "ActsULQ backward f32 (streamed)" acts_ulq.cpp.o 'N_AVX3::BwdChunkT<(xquant::DType)0>' 'vmulps,vsubps,vmovntps'
AQ='N_AVX3_DL::Span<(xquant::DType)2'
run "AVX3_DL: anti_quant int8 -> bf16 per column, four rows per parameter load, AVX512_BF16 pairs, no class check (per 16 elements of one row)" anti_quant.cpp.o "$AQ, false, true, true, 2, 4>" 'vcvtne2ps2bf16' 8
run "AVX3_DL: anti_quant int4 -> bf16 per column, four rows per parameter load, vpmultishiftqb + vpermps unpacking, AVX512_BF16 pairs, no class check, one prefetcht0 per pair step (g++ keeps the loop over the rows: one iteration is one row's pair; per 16 elements)" anti_quant.cpp.o "$AQ, true, true, true, 2, 4>" 'vcvtne2ps2bf16,vpmultishiftqb' 2
