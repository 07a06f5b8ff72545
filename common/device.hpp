// device.hpp: where a tensor's storage lives.
#pragma once

#include <cstdint>
#include <string>

namespace bigbatch {

/// The backend that holds a tensor's storage: host memory or a CUDA device.
enum class DeviceType : std::uint8_t { cpu, cuda };

/// A backend and, for CUDA, the device ordinal.
struct Device {
  /// The backend.
  DeviceType type = DeviceType::cpu;
  /// The CUDA device ordinal; 0 for the CPU.
  int index = 0;

  /// The host.
  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  /// The CUDA device with ordinal `index`.
  static constexpr Device cuda(int index = 0) { return {DeviceType::cuda, index}; }

  /// True for the host.
  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  /// True for a CUDA device.
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  /// Same backend and same ordinal.
  constexpr bool operator==(const Device& other) const {
    return type == other.type && index == other.index;
  }

  /// "cpu" or "cuda:N", the spelling parse_device() accepts.
  std::string name() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

/// Parses "cpu", "cuda" or "cuda:N"; throws std::invalid_argument otherwise.
Device parse_device(const std::string& text);

/// The device as a setting (common/settings.hpp): its name.
inline std::string setting_text(const Device& device) { return device.name(); }

}  // namespace bigbatch
