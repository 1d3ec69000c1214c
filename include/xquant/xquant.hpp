// Umbrella header: the whole public API of xquant.
#pragma once
#include "xquant/acts_ulq.hpp"
#include "xquant/anti_quant.hpp"
#include "xquant/dtype.hpp"
#include "xquant/dynamic_quant.hpp"
#include "xquant/error.hpp"
#include "xquant/fake_quant.hpp"
#include "xquant/half.hpp"
#include "xquant/layout.hpp"
#include "xquant/quantize.hpp"
#include "xquant/tensor.hpp"
#include "xquant/tile_quant.hpp"
#include "xquant/version.hpp"
