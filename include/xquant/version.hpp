#pragma once
namespace xquant {
inline constexpr const char* kVersion = "0.1.0";
}
