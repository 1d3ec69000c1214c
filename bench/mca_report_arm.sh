#!/bin/sh
# llvm-mca throughput of the aarch64 hot loops (the cross build of scripts/test-aarch64), per Arm core with
# the Highway target its dispatch picks there: tsv110 (HiSilicon Kunpeng 920) and neoverse-n1 (AWS
# Graviton 2): NEON, 4 floats per vector; neoverse-v1 (Graviton 3): SVE_256, 8 floats; neoverse-v2
# (NVIDIA Grace, Graviton 4): SVE2_128, 4 floats. Cycles per vector (block reciprocal throughput).
#   bench/mca_report_arm.sh [build dir, default build/aarch64]   (needs llvm-mca-19: apt-get install llvm-19)
B=${1:-build/aarch64}
O=$B/CMakeFiles/xquant.dir/src/cpu
M="python3 $(dirname "$0")/mca_loops.py --arch aarch64"
run() {  # name object function-without-namespace markers (NEON|SVE when they differ) [vectors per SVE_256 iteration]
  printf '%s\n' "$1"
  for tc in NEON:tsv110,neoverse-n1 SVE_256:neoverse-v1 SVE2_128:neoverse-v2; do
    t=${tc%%:*}
    v=1
    [ "$t" = SVE_256 ] && v=${5:-1}  # GCC unrolls some fixed-length SVE_256 loops
    printf '  %-8s ' "$t"
    mk=$4
    case "$mk" in *'|'*) if [ "$t" = NEON ]; then mk=${mk%%|*}; else mk=${mk#*|}; fi ;; esac
    $M "$O/$2" "N_$t::$3" --marker "$mk" --mcpu "${tc#*:}" --vectors "$v" --quiet |
      sed "s/ cycles\/\(vector\|iteration\) (block reciprocal throughput; simulated/ (simulated/g"
  done
}
run "fake quant forward f32 (divider: XQUANT_FAST_DIV=0)" fake_quant.cpp.o 'FwdSpanT<(xquant::DType)0, 0, false, false>' 'fmul,frint'
run "fake quant forward f32 (FMA quotient, one step: the default on aarch64)" fake_quant.cpp.o 'FwdSpanT<(xquant::DType)0, 1, false, false>' 'fmul,frint'
run "quantize div_mode f32 -> int8 (divider: XQUANT_FAST_DIV=0)" quantize.cpp.o 'SpanT<(xquant::DType)0, (xquant::QuantDType)0, 1, false>' 'fdiv,frint'
run "quantize div_mode f32 -> int8 (FMA quotient: the default on aarch64)" quantize.cpp.o 'SpanT<(xquant::DType)0, (xquant::QuantDType)0, 2, false>' 'fmul,frint'
run "quantize mul f32 -> quint4x2 (int8 lanes; packed by pack_int4_bytes after)" quantize.cpp.o 'SpanT<(xquant::DType)0, (xquant::QuantDType)3, 0, true>' 'fmul,frint' 8
run "dynamic quant pass 2 bf16 -> int8, rounding check (the default path)" dynamic_quant.cpp.o 'RowsT<(xquant::DType)2>' 'uxtl,frint,fabd,!fmaxnm|uunpklo,frint,fabd,!fmaxnm'
run "dynamic quant pass 2 f32 -> int8, rounding check (the default path)" dynamic_quant.cpp.o 'RowsT<(xquant::DType)0>' 'frint,fabd,!fmaxnm'
run "dynamic quant pass 2 bf16 -> int8, divider (rows the check refuses)" dynamic_quant.cpp.o 'RowsT<(xquant::DType)2>' 'fdiv,frint'
run "dynamic quant pass 2 bf16 -> int8, FMA quotient (rows the check refuses; the default on aarch64)" dynamic_quant.cpp.o 'RowsT<(xquant::DType)2>' 'fmls,frint,!fdiv,!fabd|fmsb,frint,!fdiv,!fabd'
run "ActsULQ forward f32, 4 outputs (divider)" acts_ulq.cpp.o 'UlqSpanT<(xquant::DType)0, false>' 'fdiv*2'
