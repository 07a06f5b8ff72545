#include "common/settings.hpp"

namespace bigbatch {

void SettingsRecord::put(const std::string& name, const std::string& text) {
  const auto [place, inserted] = values_.emplace(name, text);
  if (!inserted && place->second != text) {
    throw std::logic_error("setting " + name + " recorded as " + place->second + " and as " +
                           text);
  }
}

}  // namespace bigbatch
