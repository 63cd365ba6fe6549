// Reading JSON a user hands dlplan, for every reader (model IR, Hugging Face
// config, cluster, plan, report): the file's size and nesting depth are
// checked before nlohmann parses it (deep nesting would otherwise exhaust
// the stack in the recursive copies and comparisons that follow), and every
// parse failure, a number out of double's range (1e400) included, becomes a
// dlplan::Error naming the file and the byte. Limits: dlplan/limits.hpp.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace dlplan {

// `what` names the kind of file in messages ("model file", "plan file").
nlohmann::json read_json_file(const std::string& path, std::string_view what);
nlohmann::ordered_json read_ordered_json_file(const std::string& path, std::string_view what);

// The same checks on text already in memory; `source` names it in messages.
nlohmann::json parse_json_text(std::string_view text, const std::string& source);
nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& source);

// A field's value refused: throws "SOURCE: FIELD must be WHAT (got VALUE)",
// the value shown to 60 characters.
[[noreturn]] void bad_json_field(const std::string& source, const std::string& field, const std::string& what,
                                 const nlohmann::json& got);

}  // namespace dlplan
