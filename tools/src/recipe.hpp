// llm-compressor recipes (`xquant quantize DIR --recipe FILE`): a YAML (or JSON) file with one
// QuantizationModifier, read with libyaml, turned into the export options, and written back into the
// output as recipe.yaml in llm-compressor's layout. docs/cli.md, "Recipes".
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "compressed_tensors.hpp"

namespace xqcli {

struct Recipe {
  nlohmann::ordered_json args;  // the QuantizationModifier's arguments as given (null values dropped)
  std::string preset;           // the compressed-tensors preset its scheme or config group is
  std::int64_t group_size = 0;  // of that scheme (0: per channel)
  std::vector<std::string> targets, ignore;
};

// Reads and checks `path` (exit 1 naming the file and the key on anything xquant cannot honour: a
// modifier that needs calibration data, several QuantizationModifiers, a scheme that is not one of the
// presets, unknown arguments).
Recipe read_recipe(const std::string& path);

// The export options of a recipe (preset, group size, targets, ignore).
void apply_recipe(const Recipe& r, ExportOptions& e);

// recipe.yaml of the output: {default_stage: {default_modifiers: {QuantizationModifier: args}}} in the
// block / flow style PyYAML's dump(sort_keys=False, default_flow_style=None) gives.
std::string recipe_yaml(const Recipe& r);

// YAML text (libyaml, YAML 1.1 plain-scalar types: null, booleans, integers, floats, strings) as JSON.
// Aliases are expanded with a bound on the nodes visited; nesting at most 64 deep. `who` names the file.
nlohmann::ordered_json parse_yaml(const std::string& text, const std::string& who);

}  // namespace xqcli
