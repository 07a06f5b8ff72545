// device.hpp: where a tensor's storage lives.
#pragma once

#include <cstdint>
#include <string>

namespace bigbatch {

enum class DeviceType : std::uint8_t { cpu, cuda };

/// A backend and, for CUDA, the device ordinal.
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::cuda, index}; }

  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  constexpr bool operator==(const Device& other) const {
    return type == other.type && index == other.index;
  }

  std::string name() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

/// Parses "cpu", "cuda" or "cuda:N"; throws std::invalid_argument otherwise.
Device parse_device(const std::string& text);

}  // namespace bigbatch
