#!/bin/sh
# llvm-mca throughput of the AVX-512 hot loop of every benchmarked kernel (bench_ops --ratios large cases),
# for Intel (sapphirerapids, icelake-server models) and AMD (znver4). Cycles per 16-element vector.
#   bench/mca_report.sh [build dir, default build/release]   (needs llvm-mca-19: apt-get install llvm-19)

B=${1:-build/release}
O=$B/CMakeFiles/xquant.dir/src/cpu
M="python3 $(dirname "$0")/mca_loops.py"
CPUS=${MCA_CPUS:-sapphirerapids,icelake-server,znver4}
run() {  # name object function markers
  printf '%s\n  ' "$1"
  $M "$O/$2" "$3" --marker "$4" --mcpu "$CPUS" --quiet | sed "s/ cycles\/iteration (block reciprocal throughput; simulated/ (simulated/g"
}
run "fake quant forward f32 (scale broadcast, streamed)" fake_quant.cpp.o 'N_AVX3::FwdSpan<(xquant::DType)0>' 'vmulps,vrndscale,vmovnt'
run "fake quant backward f32 + grad_amax terms (streamed)" fake_quant.cpp.o 'N_AVX3::BwdSpan<(xquant::DType)0>' 'vmulps,vmovnt'
run "quantize div_mode f32 -> int8 (streamed)" quantize.cpp.o 'N_AVX3::SpanT<(xquant::DType)0, (xquant::QuantDType)0>' 'vrndscale,vmovntdq'
run "quantize mul f32 -> quint4x2" quantize.cpp.o 'N_AVX3::SpanT<(xquant::DType)0, (xquant::QuantDType)3>' 'vmulps,vpsrlq'
run "dynamic quant pass 1, bf16 widen + min/max + row buffer" dynamic_quant.cpp.o 'N_AVX3::SmoothAndReduce<(xquant::DType)2>' 'vpmovzxwd,vmovups,!vmulps'
run "dynamic quant pass 1, bf16 * smooth" dynamic_quant.cpp.o 'N_AVX3::SmoothAndReduce<(xquant::DType)2>' 'vpmovzxwd,vmovups,vmulps'
run "dynamic quant pass 1, f32 min/max only" dynamic_quant.cpp.o 'N_AVX3::SmoothAndReduce<(xquant::DType)0>' 'vminps,!vmovups %zmm'
run "dynamic quant pass 2, -> int8 (finite row, streamed)" dynamic_quant.cpp.o 'N_AVX3::RowsT<(xquant::DType)2>' 'vrndscale,vmovntdq,!vfpclass'
run "dynamic quant pass 2, -> int4 (finite row)" dynamic_quant.cpp.o 'N_AVX3::RowsT<(xquant::DType)2>' 'vrndscale,vpsrlq,!vfpclass'
run "ActsULQ forward f32, 4 outputs (streamed)" acts_ulq.cpp.o 'N_AVX3::UlqSpanT<(xquant::DType)0>' 'vrndscale,vmovnt'
run "ActsULQ backward f32" acts_ulq.cpp.o 'N_AVX3::BwdChunkT<(xquant::DType)0>' 'vmulps,vsubps'
