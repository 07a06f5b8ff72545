// settings.hpp: every field of a configuration struct says what it means for a run.
//
// Each configuration struct comes with a visitor beside its fields, visit_settings(c,
// visit), that hands every field, once, to `visit` with its name and its SettingRole; below
// it, static_assert(every_field_visited<Config>()) counts the struct's fields and the
// visitor's calls at compile time, so a field the visitor misses stops the build. Names are
// the command line's flags without the dashes ("batch" for --batch), or the field's name
// where no flag sets it ("beta1"). A field that is itself such a struct is visited as one
// field; SettingsRecord (below) descends into it.
//
// Why and how: docs/internals.md#commonsettingshpp
#pragma once

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace bigbatch {

/// What a setting means for the run's trajectory.
enum class SettingRole {
  trajectory,  ///< the losses and parameters depend on it: recorded, a resume must repeat it
  same_bits,   ///< changes how a step is computed, not its bits (a checkpoint policy)
  implied,     ///< decided by recorded settings (the model's inputs, by the data)
  watch_only,  ///< how the run is watched or stored (the log, the print interval)
};

/// The constraint of a configuration's visitor: Self is Config, const or not.
template <class Self, class Config>
concept SettingsOf = std::same_as<std::remove_const_t<Self>, Config>;

namespace settings_detail {

/// Converts to any field's type: T{AnyField{}, ...} tries a field count.
struct AnyField {
  /// Any type (declared only: used where nothing is evaluated).
  template <class T>
  constexpr operator T() const noexcept;
};

template <class T, std::size_t... I>
constexpr bool takes_fields(std::index_sequence<I...>) {
  return requires { T{(static_cast<void>(I), AnyField{})...}; };
}

template <class T, std::size_t N>
constexpr std::size_t count_fields() {
  if constexpr (takes_fields<T>(std::make_index_sequence<N + 1>{})) {
    return count_fields<T, N + 1>();
  } else {
    return N;
  }
}

}  // namespace settings_detail

/// The fields of the aggregate T (a struct with no constructors and no base classes).
template <class T>
  requires std::is_aggregate_v<T>
constexpr std::size_t field_count() {
  return settings_detail::count_fields<T, 0>();
}

/// The calls T's visit_settings makes (on a value-initialised T).
template <class T>
constexpr std::size_t settings_visited() {
  T config{};
  std::size_t calls = 0;
  visit_settings(config, [&calls](std::string_view, const auto&, SettingRole) { ++calls; });
  return calls;
}

/// True when T's visit_settings hands over as many settings as T has fields.
template <class T>
constexpr bool every_field_visited() {
  return settings_visited<T>() == field_count<T>();
}

/// A type with a visit_settings of its own: a group of settings inside another.
template <class T>
concept SettingsGroup = requires(const T& group) {
  visit_settings(group, [](std::string_view, const auto&, SettingRole) {});
};

/// A number as the shortest text that reads back to the same value ("0.1", "65536").
template <class T>
  requires std::is_arithmetic_v<T> && (!std::is_same_v<T, bool>)
std::string setting_text(T value) {
  char text[64];
  const auto [end, error] = std::to_chars(text, text + sizeof text, value);
  if (error != std::errc()) throw std::logic_error("setting_text: a number does not fit");
  return std::string(text, end);
}
/// A flag as the command line spells it: "on" or "off".
inline std::string setting_text(bool value) { return value ? "on" : "off"; }
/// A word or a path: itself.
inline std::string setting_text(const std::string& value) { return value; }

/// The text of every trajectory setting of one or more configurations, by name: what a
/// snapshot records and a resume compares. Enumerations are written by a
/// `setting_text(E)` found beside them.
class SettingsRecord {
 public:
  /// Records `config`'s trajectory settings (descending into groups).
  template <class Config>
  void add(const Config& config) {
    visit_settings(config, [this](std::string_view name, const auto& value, SettingRole role) {
      (*this)(name, value, role);
    });
  }

  /// One setting: recorded when it is a trajectory setting. A name recorded twice (the
  /// seed, by the model and by the trainer) must have the same text both times.
  template <class T>
  void operator()(std::string_view name, const T& value, SettingRole role) {
    if constexpr (SettingsGroup<T>) {
      if (role == SettingRole::trajectory) add(value);
    } else {
      if (role == SettingRole::trajectory) put(std::string(name), setting_text(value));
    }
  }

  /// Records `text` under `name`, the same rule.
  void put(const std::string& name, const std::string& text);

  /// Every trajectory setting recorded so far, by name.
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace bigbatch
