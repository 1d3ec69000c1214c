// llm-compressor recipes: read (libyaml), check, map to a preset, write back. docs/cli.md, "Recipes".
#include "recipe.hpp"

#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "errors.hpp"

namespace xqcli {

using OJ = nlohmann::ordered_json;

namespace {

constexpr std::size_t kMaxRecipeBytes = 1 << 20;
constexpr int kMaxDepth = 64;
constexpr std::size_t kMaxNodes = 100000;

// A plain scalar as YAML 1.1 (PyYAML's resolver) types it.
OJ plain_scalar(const std::string& v) {
  if (v.empty() || v == "~" || v == "null" || v == "Null" || v == "NULL") return nullptr;
  static const std::regex t("true|True|TRUE|yes|Yes|YES|on|On|ON"), f("false|False|FALSE|no|No|NO|off|Off|OFF");
  if (std::regex_match(v, t)) return true;
  if (std::regex_match(v, f)) return false;
  static const std::regex i("[-+]?(0|[1-9][0-9_]*)");
  if (std::regex_match(v, i)) {
    std::string d = v;
    d.erase(std::remove(d.begin(), d.end(), '_'), d.end());
    errno = 0;
    const long long n = std::strtoll(d.c_str(), nullptr, 10);
    if (errno == 0) return n;
  }
  static const std::regex fl("[-+]?([0-9][0-9_]*)?\\.[0-9_]*([eE][-+][0-9]+)?");
  if (std::regex_match(v, fl) && v.find_first_of("0123456789") != std::string::npos)
    return std::strtod(v.c_str(), nullptr);
  return v;
}

struct YamlDoc {
  yaml_parser_t parser;
  yaml_document_t doc;
  bool parser_ok = false, doc_ok = false;
  ~YamlDoc() {
    if (doc_ok) yaml_document_delete(&doc);
    if (parser_ok) yaml_parser_delete(&parser);
  }
};

OJ convert(yaml_document_t* doc, yaml_node_t* n, int depth, std::size_t& nodes, const std::string& who) {
  if (++nodes > kMaxNodes) bad_input(who + ": more than " + std::to_string(kMaxNodes) + " YAML nodes (aliases?)");
  if (depth > kMaxDepth) bad_input(who + ": YAML nested deeper than " + std::to_string(kMaxDepth));
  switch (n->type) {
    case YAML_SCALAR_NODE: {
      const std::string v(reinterpret_cast<const char*>(n->data.scalar.value), n->data.scalar.length);
      return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? plain_scalar(v) : OJ(v);
    }
    case YAML_SEQUENCE_NODE: {
      OJ a = OJ::array();
      for (yaml_node_item_t* it = n->data.sequence.items.start; it < n->data.sequence.items.top; ++it)
        a.push_back(convert(doc, yaml_document_get_node(doc, *it), depth + 1, nodes, who));
      return a;
    }
    case YAML_MAPPING_NODE: {
      OJ o = OJ::object();
      for (yaml_node_pair_t* p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; ++p) {
        const OJ k = convert(doc, yaml_document_get_node(doc, p->key), depth + 1, nodes, who);
        const std::string key = k.is_string() ? k.get<std::string>() : k.dump();
        if (o.contains(key)) bad_input(who + ": duplicate key '" + key + "'");
        o[key] = convert(doc, yaml_document_get_node(doc, p->value), depth + 1, nodes, who);
      }
      return o;
    }
    default:
      return nullptr;
  }
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> string_list(const OJ& v, const std::string& where) {
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) bad_input(where + ": expected a string or a list of strings, got " + v.dump());
  std::vector<std::string> out;
  for (const auto& x : v) {
    if (!x.is_string()) bad_input(where + ": expected strings, got " + x.dump());
    out.push_back(x.get<std::string>());
  }
  return out;
}

// Modifiers found anywhere in the recipe's stages and groups: (name, arguments).
void find_modifiers(const OJ& node, int depth, std::vector<std::pair<std::string, OJ>>& out) {
  if (!node.is_object() || depth > 4) return;
  for (const auto& [k, v] : node.items()) {
    if (k.size() > 8 && k.compare(k.size() - 8, 8, "Modifier") == 0)
      out.emplace_back(k, v);
    else
      find_modifiers(v, depth + 1, out);
  }
}

// The preset one config group is, if any.
std::string preset_of_group(const OJ& g, std::int64_t& group_size, const std::string& where) {
  if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object())
    bad_input(where + ": expected an object with weights");
  const OJ& w = g["weights"];
  const auto val = [&](const char* k, const OJ& dflt) { return w.contains(k) && !w[k].is_null() ? w[k] : dflt; };
  const OJ bits = val("num_bits", 8), type = val("type", "int"), sym = val("symmetric", true),
           strategy = val("strategy", "tensor"), gs = val("group_size", nullptr), dyn = val("dynamic", false);
  const OJ act = g.contains("input_activations") ? g["input_activations"] : OJ(nullptr);
  const OJ out_act = g.contains("output_activations") ? g["output_activations"] : OJ(nullptr);
  const auto refuse = [&]() -> std::string {
    bad_input(where + ": " + g.dump() +
              " is not a scheme xquant writes (W4A16, W4A16_ASYM, W8A16 with group or channel strategy; W8A8 per "
              "channel with dynamic per-token int8 activations; FP8_DYNAMIC: float 8-bit weights per channel with "
              "dynamic per-token float 8-bit activations; NVFP4A16: float 4-bit weights, strategy tensor_group, "
              "group_size 16, no activations)");
  };
  const auto aval = [&](const char* k, const OJ& dflt) {
    return act.is_object() && act.contains(k) && !act[k].is_null() ? act[k] : dflt;
  };
  if (type == "float") {
    if (dyn != false || !out_act.is_null() || sym != true) refuse();
    if (bits == 4 && strategy == "tensor_group" && gs == 16 && act.is_null()) {
      group_size = 16;
      return "NVFP4A16";
    }
    if (bits == 8 && strategy == "channel" && act.is_object() && aval("num_bits", 8) == 8 &&
        aval("type", "int") == "float" && aval("symmetric", true) == true && aval("strategy", "tensor") == "token" &&
        aval("dynamic", false) == true) {
      group_size = 0;
      return "FP8_DYNAMIC";
    }
    return refuse();
  }
  if (type != "int" || dyn != false || !out_act.is_null() || !(bits == 4 || bits == 8)) refuse();
  if (strategy == "group") {
    if (!gs.is_number_integer() || gs.get<std::int64_t>() <= 0) refuse();
    group_size = gs.get<std::int64_t>();
  } else if (strategy == "channel") {
    group_size = 0;
  } else {
    refuse();
  }
  if (act.is_null()) {
    if (bits == 4) return sym == true ? "W4A16" : "W4A16_ASYM";
    if (sym != true) refuse();
    return "W8A16";
  }
  if (bits == 8 && sym == true && group_size == 0 && aval("num_bits", 8) == 8 && aval("type", "int") == "int" &&
      aval("symmetric", true) == true && aval("strategy", "tensor") == "token" && aval("dynamic", false) == true)
    return "W8A8";
  return refuse();
}

// A scalar as PyYAML writes it (plain when it reads back as the same string, else single-quoted;
// `flow`: inside [...], where ':' , '[' ']' '{' '}' ',' also need quotes).
std::string yaml_scalar(const OJ& v, bool flow) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number()) return v.dump();
  const std::string s = v.get<std::string>();
  bool quote = s.empty() || !plain_scalar(s).is_string() || std::isspace(static_cast<unsigned char>(s.front())) ||
               std::isspace(static_cast<unsigned char>(s.back())) ||
               std::string("-?:,[]{}#&*!|>'\"%@`").find(s.front()) != std::string::npos ||
               s.find(": ") != std::string::npos || s.find(" #") != std::string::npos;
  if (flow && s.find_first_of(",[]{}:") != std::string::npos) quote = true;
  if (!quote) return s;
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q.push_back('\'');
    q.push_back(c);
  }
  return q + "'";
}

bool all_scalars(const OJ& a) {
  return std::all_of(a.begin(), a.end(), [](const OJ& x) { return !x.is_structured(); });
}

void emit(const OJ& v, int indent, std::string& out) {
  const std::string pad(static_cast<std::size_t>(indent), ' ');
  for (const auto& [k, x] : v.items()) {
    out += pad + yaml_scalar(k, false) + ":";
    if (x.is_object() && !x.empty() && all_scalars(x)) {  // PyYAML: a collection of scalars in flow style
      std::string items;
      for (const auto& [ek, ev] : x.items()) {
        if (!items.empty()) items += ", ";
        items += yaml_scalar(ek, true);
        items += ": ";
        items += yaml_scalar(ev, true);
      }
      out += " {";
      out += items;
      out += "}\n";
    } else if (x.is_object() && !x.empty()) {
      out += "\n";
      emit(x, indent + 2, out);
    } else if (x.is_array() && !x.empty() && !all_scalars(x)) {
      out += "\n";
      for (const auto& e : x) {
        if (e.is_object() && !e.empty()) {
          std::string sub;
          emit(e, indent + 2, sub);
          out += pad + "- " + sub.substr(static_cast<std::size_t>(indent) + 2);
        } else {
          out += pad + "- " + (e.is_array() ? "[]" : yaml_scalar(e, false)) + "\n";
        }
      }
    } else if (x.is_array()) {
      std::string items;
      for (const auto& e : x) {
        if (!items.empty()) items += ", ";
        items += yaml_scalar(e, true);
      }
      out += " [";
      out += items;
      out += "]\n";
    } else if (x.is_object()) {
      out += " {}\n";
    } else {
      out += ' ';
      out += yaml_scalar(x, false);
      out += '\n';
    }
  }
}

}  // namespace

OJ parse_yaml(const std::string& text, const std::string& who) {
  YamlDoc y;
  if (!yaml_parser_initialize(&y.parser)) bad_input(who + ": cannot initialize the YAML parser");
  y.parser_ok = true;
  yaml_parser_set_input_string(&y.parser, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  if (!yaml_parser_load(&y.parser, &y.doc))
    bad_input(who + ": not valid YAML: " + (y.parser.problem ? y.parser.problem : "parse error") + " at line " +
              std::to_string(y.parser.problem_mark.line + 1) + ", column " +
              std::to_string(y.parser.problem_mark.column + 1));
  y.doc_ok = true;
  yaml_node_t* root = yaml_document_get_root_node(&y.doc);
  if (!root) bad_input(who + ": empty recipe");
  std::size_t nodes = 0;
  return convert(&y.doc, root, 0, nodes, who);
}

Recipe read_recipe(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CliError(kExitBadInput, "--recipe: cannot read '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (text.size() > kMaxRecipeBytes) bad_input(path + ": a recipe of more than 1 MiB");
  const OJ doc = parse_yaml(text, path);
  std::vector<std::pair<std::string, OJ>> mods;
  find_modifiers(doc, 0, mods);
  if (mods.empty())
    bad_input(path +
              ": no modifier found (expected a QuantizationModifier, e.g. "
              "default_stage: {default_modifiers: {QuantizationModifier: {scheme: W4A16, targets: "
              "[Linear], ignore: [lm_head]}}})");
  static const char* const kNeedData[] = {"GPTQModifier",      "SmoothQuantModifier",  "AWQModifier",
                                          "SparseGPTModifier", "WandaPruningModifier", "QuIPModifier",
                                          "SpinQuantModifier", "AutoRoundModifier"};
  for (const auto& [name, args] : mods) {
    for (const char* d : kNeedData)
      if (name == d)
        bad_input(path + ": " + name +
                  " needs calibration data (it runs the model on samples); xquant quantize is data-free and "
                  "applies a QuantizationModifier only (min-max weights)");
    if (name != "QuantizationModifier") bad_input(path + ": " + name + " is not supported (only QuantizationModifier)");
  }
  if (mods.size() != 1) bad_input(path + ": " + std::to_string(mods.size()) + " QuantizationModifiers; expected one");
  Recipe r;
  const OJ& a = mods[0].second;
  const std::string who = path + ": QuantizationModifier";
  if (!a.is_object()) bad_input(who + ": expected a mapping of arguments");
  static const char* const kKnown[] = {"scheme",
                                       "targets",
                                       "ignore",
                                       "config_groups",
                                       "kv_cache_scheme",
                                       "index",
                                       "group",
                                       "start",
                                       "end",
                                       "update",
                                       "bypass_divisibility_checks",
                                       "weight_observer",
                                       "input_observer",
                                       "output_observer",
                                       "observer"};
  for (const auto& [k, v] : a.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), k) == std::end(kKnown))
      bad_input(who + ": unknown argument '" + k + "'");
    if (v.is_null()) continue;
    if ((k == "kv_cache_scheme" || k == "observer" || k == "weight_observer" || k == "input_observer" ||
         k == "output_observer") &&
        !(k != "kv_cache_scheme" && (v == "minmax" || v == "memoryless_minmax" || v == "static_minmax")))
      bad_input(who + ": " + k + " " + v.dump() + " is not supported (xquant uses the min-max observer's rule)");
    r.args[k] = v;
  }
  r.targets = a.contains("targets") && !a["targets"].is_null() ? string_list(a["targets"], who + ".targets")
                                                               : std::vector<std::string>{"Linear"};
  if (a.contains("ignore") && !a["ignore"].is_null()) r.ignore = string_list(a["ignore"], who + ".ignore");
  const bool has_scheme = a.contains("scheme") && !a["scheme"].is_null();
  const bool has_groups = a.contains("config_groups") && !a["config_groups"].is_null();
  if (has_scheme == has_groups) bad_input(who + ": expected exactly one of scheme and config_groups");
  if (has_scheme) {
    const OJ& s = a["scheme"];
    if (s.is_string()) {
      r.preset = upper(s.get<std::string>());
    } else if (s.is_object() && s.size() == 1 && s.begin().key().size() > 0) {
      r.preset = upper(s.begin().key());
      r.targets = string_list(s.begin().value(), who + ".scheme." + s.begin().key());
    } else if (s.is_object() && s.contains("weights")) {
      r.preset = preset_of_group(s, r.group_size, who + ".scheme");
    } else {
      bad_input(who + ".scheme: expected a preset name, {PRESET: [targets]} or a scheme with weights");
    }
    if (r.preset == "W4A16" || r.preset == "W4A16_ASYM" || r.preset == "W8A16")
      r.group_size = s.is_object() && s.contains("weights") ? r.group_size : 128;
    if (r.preset == "NVFP4A16") r.group_size = 16;
  } else {
    const OJ& g = a["config_groups"];
    if (!g.is_object() || g.size() != 1)
      bad_input(who + ".config_groups: xquant writes one config group, got " + std::to_string(g.size()));
    r.preset = preset_of_group(g.begin().value(), r.group_size, who + ".config_groups." + g.begin().key());
    if (g.begin().value().contains("targets")) r.targets = string_list(g.begin().value()["targets"], who + ".targets");
  }
  return r;
}

void apply_recipe(const Recipe& r, ExportOptions& e) {
  e.preset = r.preset;
  e.group_size = r.group_size;
  e.group_size_given = true;
  e.targets = r.targets;
  e.ignore = r.ignore;
  // W8A8 and FP8_DYNAMIC are per channel, NVFP4A16 has groups of 16: the preset fixes the group size.
  if (r.preset == "W8A8" || r.preset == "FP8_DYNAMIC" || r.preset == "NVFP4A16") e.group_size_given = false;
}

std::string recipe_yaml(const Recipe& r) {
  OJ doc;
  doc["default_stage"]["default_modifiers"]["QuantizationModifier"] = r.args;
  std::string out;
  emit(doc, 0, out);
  return out;
}

}  // namespace xqcli
